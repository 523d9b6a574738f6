"""Per-device health verdicts, shared by the device plugin and the DRA driver. Pure: time is passed in.

What a fault does comes from the fault table (`neuron_health.faults`), the same table the problem
detector's rules are made from, so a device leaves and rejoins allocatable the same way whether
the plugin reads the kernel log itself or takes the detector's verdicts:
- `replace-instance` faults keep the device Unhealthy for the rest of this boot;
- `until-reboot` faults keep it Unhealthy until the driver is reloaded (its counters go back down)
  or the node boots again;
- `transient` faults never take a device out (the detector reports them as Events).
A device that vanishes from sysfs is Unhealthy while it is gone and for a quiet period after it
comes back. Cores follow their device.

`DeviceHealth` is a node's verdicts as a service advertises them, fed by the monitors of
`neuron_health.monitor`: the device plugin holds one, the DRA driver is one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from neuron_driver.inventory import InstanceTypeSource, NodeInventory
from neuron_health import faults
from neuron_health.faults import Severity
from neuron_health.pipeline import growth

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Finding:
    device: int
    reason: str  # e.g. "counter mem_ecc_uncorrected +2", "kernel NC_UNCORRECTABLE_ERROR nc-id=1"
    severity: Severity
    fault: str = ""  # the fault table's kind, when the finding is one of its faults


def counter_findings(
    previous: Mapping[tuple[int, str], int] | None, current: Mapping[tuple[int, str], int]
) -> list[Finding]:
    """Faults shown by counters (by device and name, `neuron_driver.counters.device_totals`) that grew
    since `previous`, or are non-zero on the first read (they count since the driver loaded)."""
    findings: list[Finding] = []
    for device, name, before, value in growth(previous, current):
        fault = faults.BY_COUNTER.get(name)
        if fault is not None and fault.takes_device_out:
            findings.append(
                Finding(device, f"counter {name} +{value - before} ({fault.kind})", fault.severity, fault.kind)
            )
    return findings


def multi_node_unfit(totals: Mapping[tuple[int, str], int]) -> dict[int, tuple[str, ...]]:
    """Devices a `multi-node-unfit` fault shows on now (the firmware lists one of their links failing),
    with the faults' kinds. A state, not growth: a link the firmware stops listing is fit again."""
    unfit: dict[int, set[str]] = {}
    for (device, name), value in totals.items():
        fault = faults.BY_COUNTER.get(name)
        if value and fault is not None and fault.severity.unfit_for_multi_node:
            unfit.setdefault(device, set()).add(fault.kind)
    return {device: tuple(sorted(kinds)) for device, kinds in sorted(unfit.items())}


@dataclass(frozen=True, slots=True)
class Verdict:
    healthy: bool
    reason: str  # why unhealthy, or "" when healthy
    permanent: bool
    # What made it unhealthy, for consumers that say so in a machine-readable form (the DRA
    # driver's device taints): the worst fault's kind and severity, the device missing, or the
    # problem detector's word. Not part of equality: transitions compare health and reason.
    fault: str = field(default="", compare=False)
    severity: Severity | None = field(default=None, compare=False)
    absent: bool = field(default=False, compare=False)
    external: bool = field(default=False, compare=False)


HEALTHY = Verdict(True, "", False)


@dataclass
class _DeviceState:
    last_error_at: float | None = None
    reason: str = ""
    severity: Severity | None = None  # the worst fault seen; None: only absence
    fault: str = ""  # the worst fault's kind
    absent: bool = False

    @property
    def permanent(self) -> bool:
        return self.severity is not None and self.severity.takes_device_out


class HealthTracker:
    def __init__(self, quiet_period: float) -> None:
        self.quiet_period = quiet_period
        self._devices: dict[int, _DeviceState] = {}

    def observe(self, finding: Finding, now: float) -> None:
        if not finding.severity.takes_device_out:
            return
        state = self._devices.setdefault(finding.device, _DeviceState())
        state.last_error_at = now
        # the worst fault's first reason is the one that sticks
        if state.severity is None or _rank(finding.severity) > _rank(state.severity):
            state.reason = finding.reason
            state.severity = finding.severity
            state.fault = finding.fault

    def driver_reloaded(self, devices: Iterable[int]) -> None:
        """The driver counts afresh on these devices: faults a reload mends are gone."""
        for device in devices:
            state = self._devices.get(device)
            if state is not None and state.severity is not None and state.severity.clears_on_driver_reload:
                state.severity = None
                state.fault = ""
                state.reason = "device vanished from sysfs" if state.absent else ""
                if not state.absent:
                    state.last_error_at = None

    def observe_presence(self, present: Mapping[int, bool], now: float) -> None:
        """A device that disappears is Unhealthy (not dropped) for as long as it is gone and
        for the quiet period after it comes back."""
        for device, is_present in present.items():
            state = self._devices.setdefault(device, _DeviceState())
            if not is_present:
                if not state.absent and not state.permanent:
                    state.reason = "device vanished from sysfs"
                state.absent = True
                state.last_error_at = now
            elif state.absent:
                state.absent = False
                state.last_error_at = now

    def verdict(self, device: int, now: float) -> Verdict:
        state = self._devices.get(device)
        if state is None or state.last_error_at is None:
            return HEALTHY
        if state.permanent:
            return Verdict(False, state.reason, True, state.fault, state.severity, state.absent)
        if state.absent or now - state.last_error_at < self.quiet_period:
            return Verdict(False, state.reason, False, state.fault, state.severity, state.absent)
        return HEALTHY


def expected_devices(inventory: NodeInventory) -> set[int]:
    """Devices the node should have: a device missing at start is reported, not ignored, when the
    instance type is known for sure (read from DMI, not guessed from the devices found)."""
    it = inventory.instance_type
    if it is not None and inventory.instance_type_source is InstanceTypeSource.DMI:
        return set(range(it.devices))
    return set()


def merged_verdicts(
    tracker: HealthTracker, devices: Iterable[int], external: Mapping[int, str], now: float
) -> dict[int, Verdict]:
    """Each device's verdict: the tracker's, or unhealthy when the problem detector says so."""
    result = {}
    for index in devices:
        verdict = tracker.verdict(index, now)
        if verdict.healthy and index in external:
            fault = faults.BY_REASON.get(external[index])
            verdict = Verdict(
                False,
                f"problem detector: {external[index]}",
                False,
                fault.kind if fault else "",
                fault.severity if fault else None,
                external=True,
            )
        result[index] = verdict
    return result


def transitions(before: Mapping[int, Verdict], after: Mapping[int, Verdict]) -> tuple[bool, list[tuple[int, Verdict]]]:
    """Whether anything changed between two verdict sets, and the transitions worth reporting
    (a device's first verdict counts only when unhealthy)."""
    changed = False
    reported = []
    for index, verdict in after.items():
        previous = before.get(index)
        if previous is None or previous.healthy != verdict.healthy:
            changed = True
            if previous is not None or not verdict.healthy:
                reported.append((index, verdict))
    return changed, reported


def logged_transitions(
    before: Mapping[int, Verdict], after: Mapping[int, Verdict], log: logging.Logger
) -> tuple[bool, list[tuple[int, Verdict]]]:
    """`transitions`, each reported one also logged on `log` as a structured warning: the one wording
    of a device changing health, whichever service saw it."""
    changed, reported = transitions(before, after)
    for index, verdict in reported:
        to = "healthy" if verdict.healthy else "unhealthy"
        log.warning(
            "device %d is now %s%s",
            index,
            to,
            f": {verdict.reason}" if verdict.reason else "",
            extra={"device": index, "health": to, "reason": verdict.reason, "permanent": verdict.permanent},
        )
    return changed, reported


class DeviceHealth:
    """Every device the node has shown or should have, and the verdict on each: the tracker's, or
    the problem detector's when it says unhealthy. A device that vanishes stays known (Unhealthy),
    so it is reported rather than silently dropped."""

    def __init__(
        self,
        inventory: NodeInventory,
        quiet_period: float,
        clock: Callable[[], float],
        *,
        logger: logging.Logger = log,
        on_change: Callable[[], None] | None = None,
        on_transition: Callable[[int, Verdict], None] | None = None,
        warn_unknown_devices: bool = False,
    ) -> None:
        """Transitions (and, with `warn_unknown_devices`, findings about devices it does not know)
        are logged on `logger`, so they carry the service's logger name. `on_transition` sees each
        transition worth reporting once; `on_change` runs whenever `changed` fires."""
        self.clock = clock
        self.tracker = HealthTracker(quiet_period)
        self.logger = logger
        self.on_change = on_change
        self.on_transition = on_transition
        self.warn_unknown_devices = warn_unknown_devices
        self.external: dict[int, str] = {}  # device -> reason, from the problem detector's verdicts
        # device -> the multi-node-unfit faults on it: in service here, unfit for work spanning nodes
        self.multi_node_unfit: dict[int, tuple[str, ...]] = {}
        self.known: set[int] = set()
        self._verdicts: dict[int, Verdict] = {}
        self._event = asyncio.Event()
        self._inventory = inventory
        self.set_inventory(inventory)

    @property
    def inventory(self) -> NodeInventory:
        return self._inventory

    @property
    def changed(self) -> asyncio.Event:
        """Set (and replaced) on every new inventory and every change of a verdict."""
        return self._event

    def _notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()
        if self.on_change is not None:
            self.on_change()

    def set_inventory(self, inventory: NodeInventory, *, forget_vanished: bool = False) -> None:
        """`forget_vanished` drops the devices neither present nor expected, instead of keeping
        them Unhealthy (the device plugin does so when its core IDs are renumbered)."""
        self._inventory = inventory
        present = {d.index for d in inventory.devices}
        current = present | expected_devices(inventory)
        self.known = current if forget_vanished else self.known | current
        self.tracker.observe_presence({i: i in present for i in self.known}, self.clock())
        if not self.refresh_health():  # a new inventory is news even when no verdict changed
            self._notify()

    def observe(self, findings: Iterable[Finding]) -> None:
        now = self.clock()
        recorded = False
        for finding in findings:
            if finding.device not in self.known:
                if self.warn_unknown_devices:
                    self.logger.warning("error reported for unknown device %d: %s", finding.device, finding.reason)
                continue
            self.tracker.observe(finding, now)
            recorded = True
        if recorded:
            self.refresh_health()

    def driver_reloaded(self, devices: Iterable[int]) -> None:
        self.tracker.driver_reloaded(devices)
        self.refresh_health()

    def set_external_verdicts(self, unhealthy: dict[int, str]) -> None:
        if unhealthy != self.external:
            self.external = dict(unhealthy)
            self.refresh_health()

    def set_multi_node_unfit(self, unfit: Mapping[int, tuple[str, ...]]) -> None:
        """The devices unfit for multi-node work now (`multi_node_unfit`); a change fires `changed`, so
        what publishes it (the DRA driver's slices) publishes again. Verdicts are not touched."""
        unfit = {d: kinds for d, kinds in unfit.items() if d in self.known}
        if unfit == self.multi_node_unfit:
            return
        for device in sorted(set(unfit) | set(self.multi_node_unfit)):
            now, before = unfit.get(device), self.multi_node_unfit.get(device)
            if now != before:
                self.logger.warning(
                    "device %d is %s for multi-node work%s",
                    device,
                    "unfit" if now else "fit again",
                    f": {', '.join(now)}" if now else "",
                    extra={"device": device, "multi_node_unfit": ",".join(now or ())},
                )
        self.multi_node_unfit = dict(unfit)
        self._notify()

    def refresh_health(self) -> bool:
        """Recompute the verdicts (a quiet period may have ended); log and pass on the transitions;
        fire `changed` if any verdict changed."""
        verdicts = merged_verdicts(self.tracker, sorted(self.known), self.external, self.clock())
        changed, reported = logged_transitions(self._verdicts, verdicts, self.logger)
        if self.on_transition is not None:
            for index, verdict in reported:
                self.on_transition(index, verdict)
        self._verdicts = verdicts
        if changed:
            self._notify()
        return changed

    def verdict(self, device: int) -> Verdict:
        return self._verdicts.get(device, HEALTHY)

    def unhealthy_verdicts(self) -> dict[int, Verdict]:
        """Device -> its verdict, for every device not healthy now."""
        return {d: v for d, v in self._verdicts.items() if not v.healthy}

    def unhealthy(self) -> dict[int, str]:
        """Device -> why, for every device not healthy now."""
        return {d: v.reason or "unhealthy" for d, v in self._verdicts.items() if not v.healthy}


def _rank(severity: Severity) -> int:
    return (Severity.TRANSIENT, Severity.MULTI_NODE_UNFIT, Severity.UNTIL_REBOOT, Severity.REPLACE_INSTANCE).index(
        severity
    )
