"""The rules file: loading, validation with clear messages, and matching. Pure.

A rule has a `type` (permanent: sets its condition True; temporary: an Event only), a
`reason`, and either a `pattern` (a regular expression searched in kernel log messages; a
named group `device` names the device when the line has no `nd-id=`) or a `counter` (a
driver counter: a device's `stats/hardware/<name>` or, summed over its cores,
`stats/status/<name>/total`) that shows a problem when it is non-zero on this boot or grows
by at least `threshold`. A permanent rule with `clearOnDriverReload` clears when the
device's counters go back down (the driver was reloaded); any permanent problem clears on a
new boot.

The default rules are not a file of their own: they are made from the fault table
(`neuron_health.faults`), and the chart's `files/npd-rules.yaml` is their rendering
(`neuron-problem-detector --print-default-rules`), kept equal by a test.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from neuron_driver import layout
from neuron_driver.kmsg import search
from neuron_health import faults
from neuron_health.pipeline import growth

_REASON_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,127}$")  # NodeCondition reasons are CamelCase words
_TYPE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,62}$")


class RulesError(ValueError):
    pass


@dataclass(frozen=True)
class Condition:
    type: str
    healthy_reason: str
    healthy_message: str


@dataclass(frozen=True)
class Rule:
    index: int
    permanent: bool
    reason: str
    condition: str | None
    pattern: re.Pattern[str] | None = None
    counter: str | None = None
    threshold: int = 1
    clear_after: float | None = None  # seconds; None: only a new boot (or a driver reload, below) clears
    clear_on_driver_reload: bool = False

    @property
    def core_counter(self) -> bool:
        """The counter is a per-core execution status (summed over the device's cores)."""
        return self.counter is not None and self.counter not in DEVICE_COUNTERS


@dataclass(frozen=True)
class Rules:
    source: str
    conditions: tuple[Condition, ...]
    rules: tuple[Rule, ...]

    def reasons_of(self, condition: str) -> list[str]:
        return sorted({r.reason for r in self.rules if r.permanent and r.condition == condition})

    @property
    def counter_rules(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.counter)

    @property
    def pattern_rules(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.pattern is not None)


@dataclass(frozen=True)
class Match:
    rule: Rule
    device: int | None
    core: int | None
    serial: str | None
    detail: str  # the kernel line, or "counter x grew by n"


def default_document() -> dict[str, Any]:
    """The default rules, made from the fault table."""
    rules: list[dict[str, Any]] = []
    for fault, pattern in faults.kernel_rules():
        rules.append(_rule_from(fault, pattern=pattern))
    for fault in faults.FAULTS:
        for counter in fault.counters:
            rules.append(_rule_from(fault, counter=counter))
    return {
        "source": "neuron-problem-detector",
        "conditions": [{"type": faults.CONDITION, "reason": faults.HEALTHY_REASON, "message": faults.HEALTHY_MESSAGE}],
        "rules": rules,
    }


def _rule_from(fault: faults.Fault, **where: str) -> dict[str, Any]:
    rule: dict[str, Any] = {"type": "permanent" if fault.takes_device_out else "temporary"}
    if fault.takes_device_out:
        rule["condition"] = faults.CONDITION
    rule["reason"] = fault.reason
    rule.update(where)
    if fault.severity.clears_on_driver_reload:
        rule["clearOnDriverReload"] = True
    return rule


DEFAULT_HEADER = """\
# neuron-problem-detector rules: the defaults, made from the fault table (neuron_health.faults) by
# `neuron-problem-detector --print-default-rules`; do not edit by hand (a test keeps them equal).
# Model as node-problem-detector's: a condition with its healthy reason, permanent rules that set
# it True, temporary rules that only emit an Event. Reasons match AWS's NeuronHasError_<KIND>.
"""


def default_text() -> str:
    return DEFAULT_HEADER + yaml.safe_dump(default_document(), sort_keys=False, width=200)


def default_rules() -> Rules:
    return parse(default_document(), "default rules")


def load(path: Path | None) -> Rules:
    """The rules file at `path`, or the default rules when `path` is None."""
    if path is None:
        return default_rules()
    try:
        text = path.read_text()
    except OSError as exc:
        raise RulesError(f"cannot read rules file {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RulesError(f"{path}: not valid YAML: {exc}") from None
    return parse(data, str(path))


def parse(data: Any, where: str = "rules") -> Rules:
    def fail(field: str, problem: str) -> RulesError:
        return RulesError(f"{where}: {field}: {problem}")

    def known_keys(at: str, mapping: Mapping[Any, Any], keys: set[str]) -> None:
        unknown = set(mapping) - keys
        if unknown:
            raise fail(at, f"unknown key(s) {', '.join(sorted(unknown))}")

    def entries(key: str, keys: set[str], shape: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """Each entry of the non-empty list under `key`, with where it stands: a mapping of `keys`."""
        raw = data.get(key)
        if not isinstance(raw, list) or not raw:
            raise fail(key, "must be a non-empty list")
        for i, entry in enumerate(raw):
            at = f"{key}[{i}]"
            if not isinstance(entry, Mapping):
                raise fail(at, f"must be {shape}")
            known_keys(at, entry, keys)
            yield at, entry

    def check_reason(at: str, reason: Any) -> str:
        if not isinstance(reason, str) or not _REASON_RE.match(reason):
            raise fail(f"{at}.reason", f"must be a CamelCase reason, got {reason!r}")
        return reason

    if not isinstance(data, Mapping):
        raise fail("(top level)", "expected a mapping with 'conditions' and 'rules'")
    known_keys("(top level)", data, {"source", "conditions", "rules"})
    source = data.get("source", "neuron-problem-detector")
    if not isinstance(source, str) or not source:
        raise fail("source", "must be a non-empty string")

    conditions: list[Condition] = []
    for at, c in entries("conditions", {"type", "reason", "message"}, "a mapping with type, reason and message"):
        ctype = c.get("type")
        if not isinstance(ctype, str) or not _TYPE_RE.match(ctype):
            raise fail(f"{at}.type", f"must be a condition type like NeuronHealth, got {ctype!r}")
        reason = check_reason(at, c.get("reason"))
        conditions.append(Condition(ctype, reason, str(c.get("message", ""))))
    types = [c.type for c in conditions]
    if len(set(types)) != len(types):
        raise fail("conditions", "a condition type is listed twice")

    rules: list[Rule] = []
    rule_keys = {"type", "condition", "reason", "pattern", "counter", "threshold", "clearAfter", "clearOnDriverReload"}
    for i, (at, r) in enumerate(entries("rules", rule_keys, "a mapping")):
        kind = r.get("type")
        if kind not in ("permanent", "temporary"):
            raise fail(f"{at}.type", f"must be 'permanent' or 'temporary', got {kind!r}")
        reason = check_reason(at, r.get("reason"))
        condition = r.get("condition")
        if kind == "permanent":
            if condition not in types:
                raise fail(
                    f"{at}.condition", f"must name one of the conditions ({', '.join(types)}), got {condition!r}"
                )
        elif condition is not None:
            raise fail(f"{at}.condition", "only permanent rules set a condition")
        has_pattern, has_counter = "pattern" in r, "counter" in r
        if has_pattern == has_counter:
            raise fail(at, "needs exactly one of 'pattern' or 'counter'")
        pattern = None
        if has_pattern:
            if not isinstance(r["pattern"], str) or not r["pattern"]:
                raise fail(f"{at}.pattern", "must be a non-empty regular expression")
            try:
                pattern = re.compile(r["pattern"])
            except re.error as exc:
                raise fail(f"{at}.pattern", f"is not a valid regular expression: {exc}") from None
        counter = r.get("counter")
        if has_counter and counter not in KNOWN_COUNTERS:
            raise fail(
                f"{at}.counter",
                f"must be a driver counter: a stats/hardware name ({', '.join(layout.HARDWARE_COUNTERS)}) or a "
                f"stats/status name such as hw_nc_ue_error, got {counter!r}",
            )
        threshold = r.get("threshold", 1)
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1:
            raise fail(f"{at}.threshold", f"must be a whole number of at least 1, got {threshold!r}")
        clear_after = r.get("clearAfter")
        if clear_after is not None and (not isinstance(clear_after, (int, float)) or clear_after <= 0):
            raise fail(f"{at}.clearAfter", f"must be a positive number of seconds, got {clear_after!r}")
        clear_on_reload = r.get("clearOnDriverReload", False)
        if not isinstance(clear_on_reload, bool):
            raise fail(f"{at}.clearOnDriverReload", f"must be true or false, got {clear_on_reload!r}")
        if clear_on_reload and kind != "permanent":
            raise fail(f"{at}.clearOnDriverReload", "only permanent rules set a problem that can clear")
        rules.append(
            Rule(
                index=i,
                permanent=kind == "permanent",
                reason=reason,
                condition=condition,
                pattern=pattern,
                counter=counter,
                threshold=threshold,
                clear_after=float(clear_after) if clear_after is not None else None,
                clear_on_driver_reload=clear_on_reload,
            )
        )
    return Rules(source, tuple(conditions), tuple(rules))


# a device's own: stats/hardware and, from driver 2.30.2, the firmware's verdict (layout.FIRMWARE_COUNTERS)
DEVICE_COUNTERS = frozenset(layout.HARDWARE_COUNTERS) | frozenset(layout.FIRMWARE_COUNTERS)
KNOWN_COUNTERS = DEVICE_COUNTERS | frozenset(layout.STATUS_NAMES)


def match_message(rules: Rules, message: str) -> list[Match]:
    patterns = ((rule, rule.pattern) for rule in rules.pattern_rules if rule.pattern is not None)
    return [Match(*hit, message[:512]) for hit in search(patterns, message)]


def match_counters(
    rules: Rules, previous: Mapping[tuple[int, str], int] | None, current: Mapping[tuple[int, str], int]
) -> list[Match]:
    """`current`: (device, counter name) -> value. Non-zero on the first read counts (the driver
    counts since it loaded); afterwards growth of at least the rule's threshold does."""
    found: list[Match] = []
    grown = list(growth(previous, current))
    for rule in rules.counter_rules:
        for device, name, before, value in grown:
            if name == rule.counter and value - before >= rule.threshold:
                found.append(
                    Match(rule, device, None, None, f"counter {name} on neuron{device} rose from {before} to {value}")
                )
    return found
