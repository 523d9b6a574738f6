"""Per-device health verdicts, shared by the device plugin and the DRA driver. Pure: time is passed in.

What a fault does comes from the fault table (`neuron_sysfs.faults`), the same table the problem
detector's rules are made from, so a device leaves and rejoins allocatable the same way whether
the plugin reads the kernel log itself or takes the detector's verdicts:
- `replace-instance` faults keep the device Unhealthy for the rest of this boot;
- `until-reboot` faults keep it Unhealthy until the driver is reloaded (its counters go back down)
  or the node boots again;
- `transient` faults never take a device out (the detector reports them as Events).
A device that vanishes from sysfs is Unhealthy while it is gone and for a quiet period after it
comes back. Cores follow their device.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from neuron_sysfs import faults
from neuron_sysfs.faults import Severity
from neuron_sysfs.inventory import InstanceTypeSource, NodeInventory


@dataclass(frozen=True, slots=True)
class Finding:
    device: int
    reason: str  # e.g. "counter mem_ecc_uncorrected +2", "kernel NC_UNCORRECTABLE_ERROR nc-id=1"
    severity: Severity


def counter_findings(
    previous: Mapping[tuple[int, str], int] | None, current: Mapping[tuple[int, str], int]
) -> list[Finding]:
    """Faults shown by counters (by device and name, `neuron_sysfs.counters.device_totals`) that grew
    since `previous`, or are non-zero on the first read (they count since the driver loaded)."""
    findings: list[Finding] = []
    for (device, name), value in current.items():
        fault = faults.BY_COUNTER.get(name)
        if fault is None or not fault.leaves_allocatable:
            continue
        before = 0 if previous is None else previous.get((device, name), value)
        if value > before:
            findings.append(Finding(device, f"counter {name} +{value - before} ({fault.kind})", fault.severity))
    return findings


@dataclass(frozen=True, slots=True)
class Verdict:
    healthy: bool
    reason: str  # why unhealthy, or "" when healthy
    permanent: bool


HEALTHY = Verdict(True, "", False)


@dataclass
class _DeviceState:
    last_error_at: float | None = None
    reason: str = ""
    severity: Severity | None = None  # the worst fault seen; None: only absence
    absent: bool = False

    @property
    def permanent(self) -> bool:
        return self.severity is not None and self.severity.leaves_allocatable


class HealthTracker:
    def __init__(self, quiet_period: float) -> None:
        self.quiet_period = quiet_period
        self._devices: dict[int, _DeviceState] = {}

    def observe(self, finding: Finding, now: float) -> None:
        if not finding.severity.leaves_allocatable:
            return
        state = self._devices.setdefault(finding.device, _DeviceState())
        state.last_error_at = now
        # the worst fault's first reason is the one that sticks
        if state.severity is None or _rank(finding.severity) > _rank(state.severity):
            state.reason = finding.reason
            state.severity = finding.severity

    def driver_reloaded(self, devices: Iterable[int]) -> None:
        """The driver counts afresh on these devices: faults a reload mends are gone."""
        for device in devices:
            state = self._devices.get(device)
            if state is not None and state.severity is not None and state.severity.clears_on_driver_reload:
                state.severity = None
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
            return Verdict(False, state.reason, True)
        if state.absent or now - state.last_error_at < self.quiet_period:
            return Verdict(False, state.reason, False)
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
            verdict = Verdict(False, f"problem detector: {external[index]}", False)
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


def _rank(severity: Severity) -> int:
    return (Severity.TRANSIENT, Severity.UNTIL_REBOOT, Severity.REPLACE_INSTANCE).index(severity)
