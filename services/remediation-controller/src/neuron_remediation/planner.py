"""What the remediation controller does next, for the whole fleet at once. Pure: no I/O, no clock.

Each Neuron node whose fault (the `NeuronHealth` reason through `faults.BY_REASON`, or EKS's
`AcceleratedHardwareReady` reason) sits on the ladder's `reboot` or `replace` rung gets a workflow; a
fault of the rungs the node agent acts on first (`validate`, `device-reset`) gets one only once that
agent's job escalated (`AcceleratedHardwareReady=False`, or `NeuronHealth`'s message says so), on the
rung its severity names (`Fault.escalated_rung`):
1. **quarantine**: cordon and taint (`remediation.TAINT`, NoSchedule), in the patch that writes the
   workflow's state on the Node;
2. with `--approval`, **wait** for the admin's annotation (`remediation.APPROVED_ANNOTATION`);
3. **drain** (`drain.plan`), pass after pass, until no pod to move is left;
4. **request** a reboot or a new instance: the detector's `AcceleratedHardwareReady=False` stands,
   and (by default) the request annotation an external system watches; a `replacement.Backend`
   may act too.
The workflow ends when the node boots again, or when the fault clears. With
`--validate-after-reboot` a new boot does not end it: the node stays cordoned and tainted
(`validating`) until the node agent's verdict on that boot (`remediation.VALIDATED_CONDITION`);
a pass ends it, a failure or no verdict within `verdict_timeout` escalates to the replace rung (a
new instance is asked for; the drain is done already). It is cancelled when an admin uncordons the
node or opts it out, and not started again for that fault on that boot.

Safety, checked before each start, in this order (the first that holds the node names itself in
the decision's message, for the Event):
- the node's opt-out label, and a cancellation of the same fault on the same boot;
- the breaker: at most `max_nodes` nodes, and at most `max_percent` % of the Neuron nodes, held by
  a workflow (quarantined, waiting, draining or waiting for their new instance) at once;
- the rate limit: at most `rate_limit` starts in any `rate_window`;
- the UltraServer: never every node of one UltraServer held at once (its size from the server-id
  label the node carries, or the nodes seen with that id, whichever is more).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from neuron_common.kube import rfc3339
from neuron_health import faults
from neuron_health.faults import Fault, Rung
from neuron_model import node_health, remediation
from neuron_model.remediation import Phase, WorkflowState
from neuron_remediation import drain
from neuron_remediation.fleet import NodeView, PodView

# EKS's node monitoring agent's reasons (and the detector's, which are the same) back to the fault: the
# detector sets it False for a fault of the validate or device-reset rungs only once their job escalated
BY_ACCELERATED_REASON: Mapping[str, Fault] = MappingProxyType(
    {f.accelerated_hardware_reason: f for f in faults.BY_KIND.values() if f.takes_device_out}
)


@dataclass(frozen=True)
class Safety:
    max_nodes: int = 1
    max_percent: float = 25.0
    rate_limit: int = 3
    rate_window: float = 3600.0
    approval: bool = False
    request_annotation: bool = True  # --replacement=annotation; False: the condition alone
    validate_after_reboot: bool = False  # hold a rebooted node until the node agent's verdict on its new boot
    verdict_timeout: float = 1200.0  # seconds in `validating` without a verdict before the escalation


class Kind(enum.StrEnum):
    START = "start"
    ADVANCE = "advance"  # a phase change that touches nothing but the state
    DRAIN = "drain"
    REQUEST = "request"
    CANCEL = "cancel"
    RELEASE = "release"
    HOLD = "hold"  # nothing done; the reason says why (breaker, rate limit, ...)


class Hold(enum.StrEnum):
    OPT_OUT = "opt_out"
    CANCELLED = "cancelled"
    BREAKER = "breaker"
    RATE_LIMIT = "rate_limit"
    ULTRASERVER = "ultraserver"
    APPROVAL = "approval"
    DRAIN_REFUSED = "drain_refused"
    UNREADABLE_STATE = "unreadable_state"


@dataclass(frozen=True)
class Action:
    node: str
    kind: Kind
    reason: str  # the Event's reason
    message: str  # the Event's message: why, in a sentence
    state: WorkflowState | None = None  # the state to write (START, ADVANCE, DRAIN's none, REQUEST, CANCEL)
    resource_version: str = ""  # the Node's, as the decision saw it: a patch on a changed Node fails
    cordon: bool | None = None  # True: cordon; False: uncordon; None: leave spec.unschedulable
    taint: bool | None = None  # True: add the controller's taint; False: remove it
    request: Mapping[str, str] | None = None  # the request annotation's body (REQUEST)
    drain: drain.DrainPlan | None = None
    hold: Hold | None = None
    warning: bool = True


@dataclass(frozen=True)
class Fleet:
    nodes: Mapping[str, NodeView]
    pods: Mapping[str, Sequence[PodView]] = field(default_factory=dict)  # by node
    neuron_claims: frozenset[str] = frozenset()  # `namespace/name` of the claims the Neuron DRA driver allocated
    recent_starts: Sequence[tuple[str, float]] = ()  # (node, Unix time) of starts remembered, of nodes gone too


def fault_of(node: NodeView) -> Fault | None:
    """The fault that asks for a workflow: a `reboot` or `replace` rung, or a node agent's rung whose job
    escalated, from the node's conditions."""
    for fault, escalated in (
        (faults.BY_REASON.get(node.health_reason or ""), node.health_escalated),
        (BY_ACCELERATED_REASON.get(node.accelerated_reason or ""), True),  # False: needs it, or escalated
    ):
        if fault is not None and (fault.rung.needs_new_boot_or_instance or (escalated and fault.rung.node_agent_first)):
            return fault
    return None


def unhealthy(node: NodeView) -> bool:
    return node.health_reason is not None or node.accelerated_reason is not None


def limit(safety: Safety, neuron_nodes: int) -> int:
    """How many nodes the breaker lets workflows hold at once."""
    return min(safety.max_nodes, math.floor(safety.max_percent * neuron_nodes / 100 + 1e-9))


def breaker_message(safety: Safety, held: int, neuron_nodes: int) -> str:
    by_percent = math.floor(safety.max_percent * neuron_nodes / 100 + 1e-9)
    share = 100 * held / neuron_nodes if neuron_nodes else 0.0
    if by_percent <= safety.max_nodes:
        return (
            f"breaker: {held} of {neuron_nodes} Neuron nodes ({share:.0f} %) already remediating, limit "
            f"{safety.max_percent:g} %"
        )
    return f"breaker: {held} of {neuron_nodes} Neuron nodes already remediating, limit {safety.max_nodes} (--max-nodes)"


def plan(fleet: Fleet, safety: Safety, policy: drain.Policy, now: float) -> list[Action]:
    """Every node's next action, in node-name order (starts last, so the breaker counts the others)."""
    actions: list[Action] = []
    nodes = [fleet.nodes[n] for n in sorted(fleet.nodes)]
    held = {n.name for n in nodes if n.state is not None and n.state.phase.holds_node}
    candidates: list[tuple[NodeView, Fault]] = []
    for node in nodes:
        fault = fault_of(node)
        s = node.state
        if node.state_error:
            actions.append(
                _hold(node, Hold.UNREADABLE_STATE, f"the annotation {remediation.STATE_ANNOTATION} does not read as "
                      f"a workflow state ({node.state_error}); remove it to let the controller act")
            )  # fmt: skip
            continue
        if s is None:
            if fault is not None:
                candidates.append((node, fault))
            continue
        if node.boot_id and s.boot_id and node.boot_id != s.boot_id:
            if safety.validate_after_reboot and remediation.awaits_validation(s, node.boot_id):
                action = _validate(node, s, safety, now)
                if action is not None:
                    actions.append(action)
                    if action.kind is Kind.RELEASE:
                        held.discard(node.name)
                continue
            actions.append(_release(node, s, "the node booted again"))
            held.discard(node.name)
            continue
        if s.phase is Phase.CANCELLED:
            if fault is not None:  # the same fault is held (said once); another gets a workflow of its own
                candidates.append((node, fault))
            continue
        if not unhealthy(node) and not s.escalated:
            actions.append(_release(node, s, f"the fault cleared ({faults.CONDITION} is no longer True)"))
            held.discard(node.name)
            continue
        if node.opted_out or not node.unschedulable:
            why = (
                f"the node is labelled {remediation.OPT_OUT_LABEL}=true"
                if node.opted_out
                else "an admin uncordoned the node"
            )
            actions.append(_cancel(node, s, now, why))
            held.discard(node.name)
            continue
        actions.extend(_advance(node, s, fleet, safety, policy, now))
    starts = {*fleet.recent_starts, *((n.name, n.state.started) for n in nodes if n.state is not None)}
    recent = [t for _, t in starts if now - t < safety.rate_window]
    neuron_nodes = sum(1 for n in nodes if n.neuron)
    for node, fault in candidates:
        decision = _start_or_hold(node, fault, nodes, held, recent, neuron_nodes, safety, now)
        actions.append(decision)
        if decision.kind is Kind.START:
            held.add(node.name)
            recent.append(now)
    return actions


def _hold(node: NodeView, hold: Hold, message: str) -> Action:
    return Action(node.name, Kind.HOLD, "RemediationHeld", message, hold=hold, resource_version=node.resource_version)


def _start_or_hold(
    node: NodeView,
    fault: Fault,
    nodes: Sequence[NodeView],
    held: set[str],
    recent: Sequence[float],
    neuron_nodes: int,
    safety: Safety,
    now: float,
) -> Action:
    what = f"{fault.kind} ({fault.escalated_rung} rung)"
    if node.opted_out:
        return _hold(
            node, Hold.OPT_OUT, f"{what}: not remediated, the node is labelled {remediation.OPT_OUT_LABEL}=true"
        )
    s = node.state
    if s is not None and s.phase is Phase.CANCELLED and s.fault == fault.kind and s.boot_id == node.boot_id:
        return _hold(node, Hold.CANCELLED, f"{what}: not started again, its workflow was cancelled on this boot")
    if len(held) + 1 > limit(safety, neuron_nodes):
        return _hold(node, Hold.BREAKER, f"{what}: waits; {breaker_message(safety, len(held), neuron_nodes)}")
    if len(recent) >= safety.rate_limit:
        return _hold(
            node,
            Hold.RATE_LIMIT,
            f"{what}: waits; rate limit: {len(recent)} workflows started in the last {safety.rate_window:g}s, limit "
            f"{safety.rate_limit}",
        )
    if node.ultraserver is not None:
        size, server = node.ultraserver
        members = [n for n in nodes if n.ultraserver is not None and n.ultraserver[1] == server]
        whole = max(size, len(members))
        busy = sum(1 for n in members if n.name in held)
        if busy + 1 >= whole:
            return _hold(
                node,
                Hold.ULTRASERVER,
                f"{what}: waits; {busy} of the {whole} nodes of UltraServer {server} already remediating, and one "
                "device's fault never takes a whole UltraServer",
            )
    state = WorkflowState(
        fault=fault.kind,
        reason=node.health_reason or node.accelerated_reason or fault.reason,
        rung=str(fault.escalated_rung),
        boot_id=node.boot_id,
        phase=Phase.QUARANTINED,
        started=now,
        since=now,
        cordoned_by_us=not node.unschedulable,
        why="quarantined",
    )
    return Action(
        node.name,
        Kind.START,
        "RemediationStarted",
        f"{what}: cordoned and tainted {remediation.TAINT}:NoSchedule; "
        + ("waits for approval, then drains" if safety.approval else "drains next"),
        state=state,
        resource_version=node.resource_version,
        cordon=True,
        taint=True,
        warning=False,
    )


def _advance(
    node: NodeView, s: WorkflowState, fleet: Fleet, safety: Safety, policy: drain.Policy, now: float
) -> Iterable[Action]:
    rv = node.resource_version
    if s.phase is Phase.QUARANTINED:
        if safety.approval and not node.approved:
            why = f"waits for approval: annotate the node {remediation.APPROVED_ANNOTATION}=true to drain it"
            yield Action(
                node.name, Kind.ADVANCE, "RemediationAwaitingApproval", f"{s.fault}: {why}",
                state=s.to(Phase.AWAITING_APPROVAL, now, why), resource_version=rv, hold=Hold.APPROVAL,
            )  # fmt: skip
        else:
            why = "approved" if safety.approval else "quarantined"
            yield Action(
                node.name, Kind.ADVANCE, "RemediationDraining", f"{s.fault}: {why}; draining",
                state=s.to(Phase.DRAINING, now, "draining"), resource_version=rv, warning=False,
            )  # fmt: skip
        return
    if s.phase is Phase.AWAITING_APPROVAL:
        if node.approved or not safety.approval:
            yield Action(
                node.name, Kind.ADVANCE, "RemediationDraining", f"{s.fault}: approved; draining",
                state=s.to(Phase.DRAINING, now, "approved"), resource_version=rv, warning=False,
            )  # fmt: skip
        return
    if s.phase is Phase.DRAINING:
        pods = fleet.pods.get(node.name, ())
        drain_plan = drain.plan(pods, policy, now, s.since, fleet.neuron_claims)
        if drain_plan.refused:
            yield _hold(node, Hold.DRAIN_REFUSED, f"{s.fault}: drain refused: {drain_plan.refused}")
        elif drain_plan.complete:
            action = "reboot" if s.rung == str(Rung.REBOOT) else "replace"
            what = "a reboot" if action == "reboot" else "a new instance"
            request = _request_body(s, action, safety, now)
            where = (
                f"; annotated {remediation.REQUEST_ANNOTATION}" if request is not None else "; the condition alone asks"
            )
            yield Action(
                node.name,
                Kind.REQUEST,
                "RebootRequested" if action == "reboot" else "ReplacementRequested",
                f"{s.fault}: drained; {what} is asked for ({node_health.ACCELERATED_HARDWARE_CONDITION}=False{where})",
                state=s.to(Phase.REQUESTED, now, f"{action} requested"),
                resource_version=rv,
                request=request,
            )
        else:
            yield Action(
                node.name,
                Kind.DRAIN,
                "RemediationDraining",
                f"{s.fault}: draining, {len(drain_plan.ops)} pod(s) to move, {len(drain_plan.waiting)} waited for",
                resource_version=rv,
                drain=drain_plan,
                warning=False,
            )


def _validate(node: NodeView, s: WorkflowState, safety: Safety, now: float) -> Action | None:
    """A held node on a new boot (--validate-after-reboot): wait for, then act on, the node agent's verdict."""
    boot = node.boot_id
    if node.opted_out or not node.unschedulable:
        why = (
            f"the node is labelled {remediation.OPT_OUT_LABEL}=true"
            if node.opted_out
            else "an admin uncordoned the node"
        )
        return _release(node, s, f"the node booted again and {why} before its validation")
    if s.phase is not Phase.VALIDATING:
        why = f"booted again (boot {boot}); held until the node agent validates this boot"
        return Action(
            node.name, Kind.ADVANCE, "RemediationValidating",
            f"{s.fault}: {why} ({remediation.VALIDATED_CONDITION}); cordoned and tainted {remediation.TAINT} meanwhile",
            state=s.to(Phase.VALIDATING, now, why), resource_version=node.resource_version, warning=False,
        )  # fmt: skip
    status, reason, message = node.validated or (None, None, None)
    passed = remediation.verdict(status, reason, message, boot)
    if passed:
        return _release(node, s, f"the node booted again and passed its validation ({message})")
    if passed is False:
        return _escalate(node, s, safety, now, f"its validation after the reboot failed ({message})")
    if now - s.since >= safety.verdict_timeout:
        return _escalate(
            node, s, safety, now,
            f"no validation verdict ({remediation.VALIDATED_CONDITION}) for boot {boot} within "
            f"{safety.verdict_timeout:g}s (--verdict-timeout): is the node agent's --validate-after-reboot on?",
        )  # fmt: skip
    return None


def _escalate(node: NodeView, s: WorkflowState, safety: Safety, now: float, why: str) -> Action:
    """To the replace rung on the node's new boot: drained already, so the new instance is asked for at once."""
    rung = str(Rung.REPLACE)
    state = replace(
        s, rung=rung, boot_id=node.boot_id, phase=Phase.REQUESTED, since=now, why="replace requested", escalated=why
    )
    request = _request_body(s, "replace", safety, now)
    where = (
        f"; annotated {remediation.REQUEST_ANNOTATION}"
        if request is not None
        else f" (no request annotation: a replacement backend, or {node_health.ACCELERATED_HARDWARE_CONDITION}=False "
        "where the fault shows again, asks)"
    )
    return Action(
        node.name,
        Kind.REQUEST,
        "ReplacementRequested",
        f"{s.fault}: {why}: escalated to the replace rung; a new instance is asked for{where}",
        state=state,
        resource_version=node.resource_version,
        taint=True,  # its value names the rung
        request=request,
    )


def _request_body(s: WorkflowState, action: str, safety: Safety, now: float) -> Mapping[str, str] | None:
    """The request annotation's body (--replacement=annotation), None with the condition alone."""
    if not safety.request_annotation:
        return None
    fault = faults.BY_KIND.get(s.fault)
    return {
        "action": action,
        "fault": s.fault,
        "reason": s.reason,
        "acceleratedHardwareReason": fault.accelerated_hardware_reason if fault is not None else "",
        "since": rfc3339(now),
    }


def _cancel(node: NodeView, s: WorkflowState, now: float, why: str) -> Action:
    return Action(
        node.name,
        Kind.CANCEL,
        "RemediationCancelled",
        f"{s.fault}: {why}: the workflow is cancelled and not started again for this fault on this boot; the "
        f"taint {remediation.TAINT} is removed",
        state=s.to(Phase.CANCELLED, now, why),
        resource_version=node.resource_version,
        taint=False,
    )


def _release(node: NodeView, s: WorkflowState, why: str) -> Action:
    uncordon = s.cordoned_by_us and s.phase.holds_node and node.unschedulable
    return Action(
        node.name,
        Kind.RELEASE,
        "RemediationDone",
        f"{s.fault}: {why}: the workflow ends"
        + ("; uncordoned" if uncordon else "")
        + ("; taint removed" if node.tainted else ""),
        state=None,
        resource_version=node.resource_version,
        cordon=False if uncordon else None,
        taint=False if node.tainted else None,
        warning=False,
    )
