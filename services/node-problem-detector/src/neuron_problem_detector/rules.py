"""The rules file: loading, validation with clear messages, and matching. Pure.

A rule has a `type` (permanent: sets its condition True; temporary: an Event only), a
`reason`, and either a `pattern` (a regular expression searched in kernel log messages; a
named group `device` names the device when the line has no `nd-id=`) or a `counter` (a
device counter of the driver, `stats/hardware/<name>`, that shows a problem when it is
non-zero on this boot or grows by at least `threshold`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from neuron_sysfs.kmsg import parse_hw_error

DEFAULT_RULES = Path(__file__).with_name("default-rules.yaml")
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
    clear_after: float | None = None  # seconds; None: only a new boot (or the counter resetting) clears


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


def load(path: Path) -> Rules:
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

    if not isinstance(data, Mapping):
        raise fail("(top level)", "expected a mapping with 'conditions' and 'rules'")
    unknown = set(data) - {"source", "conditions", "rules"}
    if unknown:
        raise fail("(top level)", f"unknown key(s) {', '.join(sorted(unknown))}")
    source = data.get("source", "neuron-problem-detector")
    if not isinstance(source, str) or not source:
        raise fail("source", "must be a non-empty string")

    raw_conditions = data.get("conditions")
    if not isinstance(raw_conditions, list) or not raw_conditions:
        raise fail("conditions", "must be a non-empty list")
    conditions: list[Condition] = []
    for i, c in enumerate(raw_conditions):
        at = f"conditions[{i}]"
        if not isinstance(c, Mapping):
            raise fail(at, "must be a mapping with type, reason and message")
        extra = set(c) - {"type", "reason", "message"}
        if extra:
            raise fail(at, f"unknown key(s) {', '.join(sorted(extra))}")
        ctype, reason = c.get("type"), c.get("reason")
        if not isinstance(ctype, str) or not _TYPE_RE.match(ctype):
            raise fail(f"{at}.type", f"must be a condition type like NeuronHealth, got {ctype!r}")
        if not isinstance(reason, str) or not _REASON_RE.match(reason):
            raise fail(f"{at}.reason", f"must be a CamelCase reason, got {reason!r}")
        conditions.append(Condition(ctype, reason, str(c.get("message", ""))))
    types = [c.type for c in conditions]
    if len(set(types)) != len(types):
        raise fail("conditions", "a condition type is listed twice")

    raw_rules = data.get("rules")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise fail("rules", "must be a non-empty list")
    rules: list[Rule] = []
    for i, r in enumerate(raw_rules):
        at = f"rules[{i}]"
        if not isinstance(r, Mapping):
            raise fail(at, "must be a mapping")
        extra = set(r) - {"type", "condition", "reason", "pattern", "counter", "threshold", "clearAfter"}
        if extra:
            raise fail(at, f"unknown key(s) {', '.join(sorted(extra))}")
        kind = r.get("type")
        if kind not in ("permanent", "temporary"):
            raise fail(f"{at}.type", f"must be 'permanent' or 'temporary', got {kind!r}")
        reason = r.get("reason")
        if not isinstance(reason, str) or not _REASON_RE.match(reason):
            raise fail(f"{at}.reason", f"must be a CamelCase reason, got {reason!r}")
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
        if has_counter and (not isinstance(counter, str) or not re.fullmatch(r"[a-z0-9_]+", counter)):
            raise fail(f"{at}.counter", f"must be a driver counter name like mem_ecc_uncorrected, got {counter!r}")
        threshold = r.get("threshold", 1)
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1:
            raise fail(f"{at}.threshold", f"must be a whole number of at least 1, got {threshold!r}")
        clear_after = r.get("clearAfter")
        if clear_after is not None and (not isinstance(clear_after, (int, float)) or clear_after <= 0):
            raise fail(f"{at}.clearAfter", f"must be a positive number of seconds, got {clear_after!r}")
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
            )
        )
    return Rules(source, tuple(conditions), tuple(rules))


def match_message(rules: Rules, message: str) -> list[Match]:
    found: list[Match] = []
    hw = None
    parsed = False
    for rule in rules.pattern_rules:
        assert rule.pattern is not None
        m = rule.pattern.search(message)
        if m is None:
            continue
        if not parsed:
            hw, parsed = parse_hw_error(message), True
        device = hw.device if hw else None
        if device is None and "device" in (m.groupdict() or {}):
            value = m.group("device")
            device = int(value) if value is not None and value.isdigit() else None
        found.append(Match(rule, device, hw.core if hw else None, hw.serial if hw else None, message[:512]))
    return found


def match_counters(
    rules: Rules, previous: Mapping[tuple[int, str], int] | None, current: Mapping[tuple[int, str], int]
) -> list[Match]:
    """`current`: (device, counter name) -> value. Non-zero on the first read counts (the driver
    counts since it loaded); afterwards growth of at least the rule's threshold does."""
    found: list[Match] = []
    for rule in rules.counter_rules:
        for (device, name), value in current.items():
            if name != rule.counter:
                continue
            before = 0 if previous is None else previous.get((device, name), value)
            if value - before >= rule.threshold:
                found.append(
                    Match(rule, device, None, None, f"counter {name} on neuron{device} rose from {before} to {value}")
                )
    return found


def counters_reset(previous: Mapping[tuple[int, str], int], current: Mapping[tuple[int, str], int]) -> set[int]:
    """Devices whose counters went back down: the driver was reloaded, its errors are gone."""
    return {device for (device, name), value in current.items() if value < previous.get((device, name), 0)}
