"""Device taints (KEP-5055) from health verdicts, and whether an allocation tolerates them. Pure.

An unhealthy device keeps its place in the pool with `neuron.aws.com/unhealthy=<why>`: `<why>` is
the fault table's kind (e.g. `NC_UNCORRECTABLE_ERROR`), `DeviceAbsent` for a device gone from
sysfs, or `ProblemDetector` for the detector's verdict. The effect follows the fault's severity
(each configurable, `NoSchedule` by default; `NoExecute` also evicts the pods using the device);
an absent device, the detector's word and a fault the node agent validates in place first (the
fault table's `validate` rung: a stalled heartbeat, whose pods are not to be moved) are `NoSchedule`.
Transient faults never make a device unhealthy, so they never taint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neuron_dra_driver.slices import ABSENT_TAINT, DETECTOR_TAINT, Taint, taint_value
from neuron_health.device_health import Verdict
from neuron_health.faults import BY_KIND, Rung, Severity


@dataclass(frozen=True)
class Effects:
    until_reboot: str = "NoSchedule"
    replace_instance: str = "NoSchedule"


def taint_for(verdict: Verdict, effects: Effects) -> Taint:
    fault = BY_KIND.get(verdict.fault)
    if fault is not None and fault.rung is Rung.VALIDATE:
        return Taint(taint_value(verdict.fault))
    if verdict.fault and verdict.severity is Severity.REPLACE_INSTANCE:
        return Taint(taint_value(verdict.fault), effects.replace_instance)
    if verdict.fault and verdict.severity is not None:
        return Taint(taint_value(verdict.fault), effects.until_reboot)
    if verdict.absent:
        return Taint(ABSENT_TAINT)
    if verdict.external:
        return Taint(DETECTOR_TAINT)
    return Taint(taint_value(verdict.reason))


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Taint) -> bool:
    """Whether one of an allocation result's `tolerations` tolerates `taint` (the scheduler's rule:
    key equal, or empty with Exists; value equal with Equal; effect equal or empty)."""
    for toleration in tolerations:
        key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
        effect = toleration.get("effect") or ""
        if key and key != taint.key:
            continue
        if not key and operator != "Exists":
            continue
        if operator == "Equal" and (toleration.get("value") or "") != taint.value:
            continue
        if effect and effect != taint.effect:
            continue
        return True
    return False
