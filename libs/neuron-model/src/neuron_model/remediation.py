"""How the remediation controller's work shows on a Node, for every component that writes or reads it
(the controller writes them; the problem detector and external remediation systems read them;
docs/remediation.md). Written here once so a reader never spells a key of its own.

A node's workflow is kept on the Node (`STATE_ANNOTATION`, JSON, `WorkflowState`), not in the
controller's memory: a restarted controller, or a new leader, reads where each workflow stood
(cordoned, draining since when, waiting for approval, asked for a new instance) and goes on from
there. Only the controller writes it, in the same patch as the cordon and the taint it describes, so
a Node never shows one without the other; the problem detector may read it (a cancelled workflow's
fault is not cordoned again).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

# The controller's own record of its workflow on the node (JSON, neuron_remediation.state): written by
# the controller alone, read back after a restart or a change of leader, so a drain resumes.
STATE_ANNOTATION = "neuron.aws.com/remediation"
# Set by an admin (any value) to let a workflow waiting for approval drain and ask for a reboot or a new
# instance (the controller's --approval); removed by the controller when the workflow ends.
APPROVED_ANNOTATION = "neuron.aws.com/remediation-approved"
# The request an external remediation system watches, once the node is drained (JSON: action
# "reboot" or "replace", the fault, the condition reason, when): removed when the workflow ends.
REQUEST_ANNOTATION = "neuron.aws.com/remediation-request"
# A node labelled `<OPT_OUT_LABEL>=true` is never remediated (a workflow under way stops).
OPT_OUT_LABEL = "neuron.aws.com/remediation-opt-out"
# The controller's NoSchedule taint while it holds the node (its value: the rung); the problem
# detector's own taint (node_health.UNHEALTHY_TAINT) is the detector's and stays apart.
TAINT = "neuron.aws.com/remediation"


# -- the workflow state ---------------------------------------------------------------------------

VERSION = 1


class Phase(enum.StrEnum):
    QUARANTINED = "quarantined"  # cordoned and tainted; next: approval or drain
    AWAITING_APPROVAL = "awaiting-approval"  # --approval: waits for the admin's annotation
    DRAINING = "draining"
    REQUESTED = "requested"  # drained; a reboot or a new instance was asked for
    # --validate-after-reboot: booted again, still cordoned and tainted until the node agent's verdict on
    # this boot (VALIDATED_CONDITION) passes; a failed or missing verdict escalates to the replace rung
    VALIDATING = "validating"
    CANCELLED = "cancelled"  # an admin uncordoned, or opted the node out: not again for this fault on this boot

    @property
    def holds_node(self) -> bool:
        """The node counts against the breaker: cordoned or draining because of us."""
        return self is not Phase.CANCELLED


@dataclass(frozen=True)
class WorkflowState:
    fault: str  # the fault kind (neuron_health.faults), e.g. HBM_UNCORRECTABLE_ERROR
    reason: str  # the condition reason it was seen under
    rung: str  # neuron_health.faults.Rung: reboot or replace
    boot_id: str  # the node's boot when it started (or escalated): a new boot ends it, or validates it
    phase: Phase
    started: float  # Unix time the workflow started (the rate limit counts these)
    since: float  # Unix time of the last phase change (drain deadlines count from the drain's)
    cordoned_by_us: bool = False  # the node was schedulable when we cordoned it: we uncordon it at the end
    why: str = ""  # the last phase change's reason, as its Event said it
    # why a validation after a reboot escalated it to the replace rung: the fault clearing no longer ends it
    escalated: str = ""

    def to(self, phase: Phase, now: float, why: str) -> WorkflowState:
        return replace(self, phase=phase, since=now, why=why)

    def dump(self) -> str:
        body = asdict(self)
        body["phase"] = str(self.phase)
        return json.dumps({"v": VERSION, **body}, separators=(",", ":"), sort_keys=True)


class StateError(ValueError):
    """An annotation that is not a workflow state this controller wrote."""


def load(text: str) -> WorkflowState:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StateError(f"not JSON: {exc}") from None
    if not isinstance(raw, Mapping) or raw.get("v") != VERSION:
        raise StateError(f"not a version {VERSION} workflow state")
    try:
        return WorkflowState(
            fault=_text(raw, "fault"),
            reason=_text(raw, "reason"),
            rung=_text(raw, "rung"),
            boot_id=_text(raw, "boot_id"),
            phase=Phase(raw["phase"]),
            started=float(raw["started"]),
            since=float(raw["since"]),
            cordoned_by_us=bool(raw.get("cordoned_by_us", False)),
            why=str(raw.get("why") or ""),
            escalated=str(raw.get("escalated") or ""),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"a field is missing or wrong: {exc}") from None


def _text(raw: Mapping[str, Any], key: str) -> str:
    value = raw[key]
    if not isinstance(value, str):
        raise TypeError(f"{key} is not a string")
    return value


# -- the validation after a reboot ------------------------------------------------------------------
# The node agent (problem detector) validates its node once on a new boot when a workflow of the node
# awaits it, and writes the verdict as this condition of its own Node; the controller reads it.
VALIDATED_CONDITION = "NeuronValidated"
VALIDATION_PASSED_REASON = "NeuronValidationPassed"
VALIDATION_FAILED_REASON = "NeuronValidationFailed"
_BOOT_PREFIX = "boot "


def awaits_validation(state: WorkflowState | None, boot_id: str) -> bool:
    """The node was drained and its reboot (or new instance) asked for on another boot: this boot is to
    be validated. True before the controller has seen the new boot too (the state still says
    `requested`), so the node agent never waits on the controller's pass to start. A reboot before the
    drain ended (one nobody asked for) ends the workflow as it always did: its pods may still be there,
    and a failure could not ask for a new instance past the approval."""
    return (
        state is not None
        and state.phase in (Phase.REQUESTED, Phase.VALIDATING)
        and bool(boot_id)
        and state.boot_id != boot_id
    )


def verdict_message(boot_id: str, text: str) -> str:
    """The condition's message: it names the boot it judged, so a verdict of an earlier boot never counts."""
    return f"{_BOOT_PREFIX}{boot_id}: {text}"


def verdict(status: str | None, reason: str | None, message: str | None, boot_id: str) -> bool | None:
    """What the controller accepts from `VALIDATED_CONDITION`: True (passed) or False (failed) for this
    boot, None while there is no verdict for it (none yet, another boot's, or not one of ours)."""
    if not boot_id or not (message or "").startswith(verdict_message(boot_id, "")):
        return None
    if status == "True" and reason == VALIDATION_PASSED_REASON:
        return True
    if status == "False" and reason == VALIDATION_FAILED_REASON:
        return False
    return None
