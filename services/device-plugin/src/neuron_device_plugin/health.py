"""Per-device health verdicts with hysteresis. Pure: time is passed in.

A device turns Unhealthy at once on an error; it turns Healthy again only after a quiet
period with no new error, and never (until the plugin restarts on a new boot) for the error
kinds that need the instance replaced (`shared/reference/neuron-stack.md` section 3: repairable
HBM errors need a driver reload or reboot, the others a new instance). Cores follow their device.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from neuron_sysfs.counters import CounterKey, CounterKind
from neuron_sysfs.kmsg import HwError


class Severity(enum.StrEnum):
    PERMANENT = "permanent"  # needs the instance replaced: never recovers on its own
    TRANSIENT = "transient"  # recovers after the quiet period


# NEURON_HW_ERR kinds. Unknown kinds fall back on the line's action= field.
HW_ERROR_SEVERITY: Mapping[str, Severity] = {
    "SRAM_UNCORRECTABLE_ERROR": Severity.PERMANENT,
    "NC_UNCORRECTABLE_ERROR": Severity.PERMANENT,
    "HBM_UNCORRECTABLE_ERROR": Severity.PERMANENT,
    "DMA_ERROR": Severity.PERMANENT,
    "HBM_REPAIRABLE_UNCORRECTABLE_ERROR": Severity.TRANSIENT,
    "HANG_ON_COLLECTIVES": Severity.TRANSIENT,
}

# Driver counters that mean the device is unhealthy when they grow (or are non-zero at start:
# they count since the driver loaded, i.e. this boot).
DEVICE_COUNTER_SEVERITY: Mapping[str, Severity] = {
    "sram_ecc_uncorrected": Severity.PERMANENT,
    "mem_ecc_uncorrected": Severity.PERMANENT,
    "mem_ecc_repairable_uncorrected": Severity.TRANSIENT,
}
CORE_STATUS_SEVERITY: Mapping[str, Severity] = {
    "hw_nc_ue_error": Severity.PERMANENT,
    "hw_hbm_ue_error": Severity.PERMANENT,
    "hw_dma_abort_error": Severity.TRANSIENT,
    "hw_repairable_hbm_ue_error": Severity.TRANSIENT,
    "hw_collectives_error": Severity.TRANSIENT,
}


def hw_error_severity(error: HwError) -> Severity:
    known = HW_ERROR_SEVERITY.get(error.kind)
    if known is not None:
        return known
    return Severity.PERMANENT if (error.action or "").upper() == "TERMINATE_INSTANCE" else Severity.TRANSIENT


@dataclass(frozen=True, slots=True)
class Finding:
    device: int
    reason: str  # e.g. "counter mem_ecc_uncorrected +2", "kernel NC_UNCORRECTABLE_ERROR nc-id=1"
    severity: Severity


def counter_findings(previous: Mapping[CounterKey, int] | None, current: Mapping[CounterKey, int]) -> list[Finding]:
    """Errors shown by counters that grew since `previous` (or are non-zero on the first read)."""
    findings: list[Finding] = []
    for key, value in current.items():
        if key.kind is CounterKind.HARDWARE:
            severity = DEVICE_COUNTER_SEVERITY.get(key.name)
        elif key.kind is CounterKind.STATUS and key.field == "total":
            severity = CORE_STATUS_SEVERITY.get(key.name)
        else:
            continue
        if severity is None:
            continue
        before = 0 if previous is None else previous.get(key, value)
        if value > before:
            where = "" if key.core < 0 else f" core {key.core}"
            findings.append(Finding(key.device, f"counter {key.name}{where} +{value - before}", severity))
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
    permanent: bool = False
    absent: bool = False


class HealthTracker:
    def __init__(self, quiet_period: float) -> None:
        self.quiet_period = quiet_period
        self._devices: dict[int, _DeviceState] = {}

    def observe(self, finding: Finding, now: float) -> None:
        state = self._devices.setdefault(finding.device, _DeviceState())
        state.last_error_at = now
        if not state.permanent:  # the first permanent reason is the one that sticks
            state.reason = finding.reason
        if finding.severity is Severity.PERMANENT:
            state.permanent = True

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

    def verdicts(self, devices: Iterable[int], now: float) -> dict[int, Verdict]:
        return {d: self.verdict(d, now) for d in devices}

    def next_change(self, now: float) -> float | None:
        """When a transient verdict will next recover (so the caller wakes up then)."""
        times = [
            s.last_error_at + self.quiet_period
            for s in self._devices.values()
            if s.last_error_at is not None
            and not s.permanent
            and not s.absent
            and s.last_error_at + self.quiet_period > now
        ]
        return min(times) if times else None
