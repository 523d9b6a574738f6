"""The planner, alone: each rung's steps, and the safety rules held over random fleets and random
admins (hypothesis), round after round with the planner's own decisions applied as the controller
applies them."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_health import faults, layout_check
from neuron_model import node_health, remediation, ultraserver
from neuron_model.remediation import Phase, WorkflowState
from neuron_remediation import drain, planner
from neuron_remediation.fleet import NodeView, PodView, node_view
from neuron_remediation.planner import Action, Fleet, Hold, Kind, Safety

HBM = faults.BY_KIND["HBM_UNCORRECTABLE_ERROR"]
REPAIRABLE = faults.BY_KIND["HBM_REPAIRABLE_UNCORRECTABLE_ERROR"]
TRANSIENT = faults.BY_KIND["HANG_ON_COLLECTIVES"]
ACTIONABLE = [f for f in faults.BY_KIND.values() if f.rung.needs_new_boot_or_instance]
NOW = 1_800_000_000.0
POLICY = drain.Policy()


def node(name: str, fault: faults.Fault | None = None, **kw: object) -> NodeView:
    fields: dict[str, object] = {"neuron": True, "boot_id": "boot-1", "resource_version": "1"}
    if fault is not None:
        fields["health_reason"] = fault.reason
    fields.update(kw)
    return NodeView(name, **fields)  # type: ignore[arg-type]


def workflow(fault: faults.Fault = HBM, phase: Phase = Phase.DRAINING, **kw: object) -> WorkflowState:
    fields: dict[str, object] = {
        "fault": fault.kind, "reason": fault.reason, "rung": str(fault.rung), "boot_id": "boot-1",
        "phase": phase, "started": NOW - 100, "since": NOW - 50, "cordoned_by_us": True,
    }  # fmt: skip
    fields.update(kw)
    return WorkflowState(**fields)  # type: ignore[arg-type]


def held(n: NodeView) -> NodeView:
    """A node its workflow holds: cordoned, tainted, draining."""
    return dataclasses.replace(n, state=workflow(), unschedulable=True, tainted=True)


def fleet(*nodes: NodeView, pods: Sequence[PodView] = (), starts: Sequence[tuple[str, float]] = ()) -> Fleet:
    by_node: dict[str, list[PodView]] = {}
    for p in pods:
        by_node.setdefault(p.node, []).append(p)
    return Fleet({n.name: n for n in nodes}, by_node, frozenset(), tuple(starts))


def by_node(actions: Sequence[Action]) -> dict[str, Action]:
    return {a.node: a for a in actions}


# -- the rungs -----------------------------------------------------------------------------------


def test_a_replace_fault_is_quarantined_first_with_its_state() -> None:
    [action] = planner.plan(fleet(node("a", HBM)), Safety(max_percent=100), POLICY, NOW)
    assert action.kind is Kind.START
    assert (action.cordon, action.taint, action.resource_version) == (True, True, "1")
    assert action.state is not None
    assert (action.state.fault, action.state.rung, action.state.phase) == (HBM.kind, "replace", Phase.QUARANTINED)
    assert action.state.cordoned_by_us
    assert action.state.boot_id == "boot-1"
    assert action.state.started == NOW


def test_a_node_already_cordoned_by_someone_else_is_not_uncordoned_at_the_end() -> None:
    [action] = planner.plan(fleet(node("a", HBM, unschedulable=True)), Safety(max_percent=100), POLICY, NOW)
    assert action.state is not None
    assert not action.state.cordoned_by_us


@pytest.mark.parametrize("fault", [TRANSIENT, None])
def test_no_workflow_without_a_fault_of_the_reboot_or_replace_rung(fault: faults.Fault | None) -> None:
    assert planner.plan(fleet(node("a", fault)), Safety(max_percent=100), POLICY, NOW) == []


def test_a_users_own_reason_starts_nothing() -> None:
    n = node("a", health_reason="MyOwnRule")
    assert planner.plan(fleet(n), Safety(max_percent=100), POLICY, NOW) == []


def test_unreadable_health_counters_start_no_workflow_and_hold_none() -> None:
    """The detector's NeuronHealthSourcesMissing (a health counter the driver's layout does not have) is about
    what the detector can read, not a fault: no quarantine, no drain, and a workflow whose fault cleared ends."""
    conditions = [
        {"type": node_health.CONDITION, "status": "False", "reason": faults.HEALTHY_REASON, "message": "m"},
        {"type": node_health.ACCELERATED_HARDWARE_CONDITION, "status": "True",
         "reason": node_health.ACCELERATED_HARDWARE_READY_REASON, "message": "m"},
        {"type": node_health.SOURCES_MISSING_CONDITION, "status": "True", "reason": layout_check.REASON,
         "message": "health counters unreadable on driver 2.31.7.0: stats/hardware/mem_ecc_uncorrected on neuron0-15"},
    ]  # fmt: skip
    view = node_view(
        {"metadata": {"name": "a", "resourceVersion": "1"}, "status": {"conditions": conditions,
         "nodeInfo": {"bootID": "boot-1"}}}, "aws.amazon.com"
    )  # fmt: skip
    assert view is not None
    assert view.neuron
    assert (view.health_reason, view.accelerated_reason) == (None, None)
    assert planner.plan(fleet(view), Safety(max_percent=100), POLICY, NOW) == []
    [action] = planner.plan(fleet(held(view)), Safety(max_percent=100), POLICY, NOW)
    assert action.kind is Kind.RELEASE


HEARTBEAT = faults.BY_KIND["HEALTHCHECK_HEARTBEAT_STALE"]


def test_a_stalled_heartbeat_is_left_to_the_node_agents_validation_in_place_no_drain() -> None:
    assert HEARTBEAT.rung is faults.Rung.VALIDATE
    validating = node("a", HEARTBEAT)  # NeuronHealth=True, AcceleratedHardwareReady True: validating
    assert planner.plan(fleet(validating), Safety(max_percent=100), POLICY, NOW) == []


@pytest.mark.parametrize(
    "escalated",
    [
        {"health_escalated": True},  # NeuronHealth's message says so (the condition left to EKS's agent)
        {"accelerated_reason": HEARTBEAT.accelerated_hardware_reason},  # the detector's False
    ],
)
def test_a_stalled_heartbeat_whose_validation_escalated_starts_the_reboot_rung(escalated: dict[str, object]) -> None:
    [action] = planner.plan(fleet(node("a", HEARTBEAT, **escalated)), Safety(max_percent=100), POLICY, NOW)
    assert action.kind is Kind.START
    assert action.state is not None
    assert (action.state.fault, action.state.rung) == (HEARTBEAT.kind, "reboot")
    assert "(reboot rung)" in action.message


def test_the_escalation_mark_is_read_from_the_message_the_detector_writes() -> None:
    from neuron_model import node_health

    message = "neuron3: x" + node_health.job_note("validation in place", node_health.JOB_PHASE_ESCALATED)
    assert node_health.escalated_in(message)
    assert node_health.escalated_in("neuron3: x" + node_health.job_note("device reset", "escalated"))
    assert not node_health.escalated_in("neuron3: x" + node_health.job_note("validation in place", "validating"))


def test_eks_agents_condition_alone_starts_a_workflow() -> None:
    n = node("a", accelerated_reason="NeuronHBMUncorrectableError")
    [action] = planner.plan(fleet(n), Safety(max_percent=100), POLICY, NOW)
    assert action.kind is Kind.START
    assert action.state is not None
    assert action.state.fault == HBM.kind
    assert action.state.reason == "NeuronHBMUncorrectableError"


def test_quarantined_then_draining_then_requested() -> None:
    n = dataclasses.replace(held(node("a", HBM)), state=workflow(phase=Phase.QUARANTINED))
    [action] = planner.plan(fleet(n), Safety(), POLICY, NOW)
    assert (action.kind, action.state and action.state.phase) == (Kind.ADVANCE, Phase.DRAINING)
    pod = PodView("ml", "train-0", "u1", "a", controller="ReplicaSet", neuron_resources=True)
    n = dataclasses.replace(n, state=workflow(phase=Phase.DRAINING))
    [action] = planner.plan(fleet(n, pods=[pod]), Safety(), POLICY, NOW)
    assert action.kind is Kind.DRAIN
    assert action.drain is not None
    assert [(o.pod.key, o.op) for o in action.drain.ops] == [("ml/train-0", drain.Op.EVICT)]
    [action] = planner.plan(fleet(n), Safety(), POLICY, NOW)  # the pod is gone: drained
    assert action.kind is Kind.REQUEST
    assert action.reason == "ReplacementRequested"
    assert action.state is not None
    assert action.state.phase is Phase.REQUESTED
    assert action.request is not None
    assert action.request["action"] == "replace"
    assert action.request["acceleratedHardwareReason"] == "NeuronHBMUncorrectableError"


def test_the_reboot_rung_asks_for_a_reboot_and_the_condition_alone_writes_no_annotation() -> None:
    n = dataclasses.replace(held(node("a", REPAIRABLE)), state=workflow(REPAIRABLE))
    [action] = planner.plan(fleet(n), Safety(request_annotation=False), POLICY, NOW)
    assert (action.kind, action.reason, action.request) == (Kind.REQUEST, "RebootRequested", None)
    [action] = planner.plan(fleet(n), Safety(), POLICY, NOW)
    assert action.request is not None
    assert action.request["action"] == "reboot"


def test_approval_holds_the_drain_until_the_annotation() -> None:
    n = dataclasses.replace(held(node("a", HBM)), state=workflow(phase=Phase.QUARANTINED))
    [action] = planner.plan(fleet(n), Safety(approval=True), POLICY, NOW)
    assert action.state is not None
    assert (action.kind, action.state.phase, action.hold) == (Kind.ADVANCE, Phase.AWAITING_APPROVAL, Hold.APPROVAL)
    assert remediation.APPROVED_ANNOTATION in action.message
    waiting = dataclasses.replace(n, state=workflow(phase=Phase.AWAITING_APPROVAL))
    assert planner.plan(fleet(waiting), Safety(approval=True), POLICY, NOW) == []
    [action] = planner.plan(fleet(dataclasses.replace(waiting, approved=True)), Safety(approval=True), POLICY, NOW)
    assert action.state is not None
    assert (action.kind, action.state.phase) == (Kind.ADVANCE, Phase.DRAINING)


def test_an_admins_uncordon_cancels_and_the_same_fault_is_not_started_again_on_this_boot() -> None:
    n = dataclasses.replace(held(node("a", HBM)), unschedulable=False)
    [action] = planner.plan(fleet(n), Safety(max_percent=100), POLICY, NOW)
    assert (action.kind, action.taint, action.cordon) == (Kind.CANCEL, False, None)
    assert action.state is not None
    assert action.state.phase is Phase.CANCELLED
    assert "uncordoned" in action.message
    cancelled = dataclasses.replace(n, state=action.state, tainted=False)
    [hold] = planner.plan(fleet(cancelled), Safety(max_percent=100), POLICY, NOW)  # the detector's condition stays True
    assert (hold.kind, hold.hold) == (Kind.HOLD, Hold.CANCELLED)
    other = dataclasses.replace(cancelled, health_reason=REPAIRABLE.reason)  # another fault: a workflow of its own
    [start] = planner.plan(fleet(other), Safety(max_percent=100), POLICY, NOW)
    assert start.kind is Kind.START
    rebooted = dataclasses.replace(cancelled, boot_id="boot-2")  # a new boot ends the cancellation
    [release] = planner.plan(fleet(rebooted), Safety(max_percent=100), POLICY, NOW)
    assert (release.kind, release.state, release.cordon) == (Kind.RELEASE, None, None)


def test_a_new_boot_without_the_fault_ends_the_workflow_and_uncordons_what_we_cordoned() -> None:
    n = dataclasses.replace(held(node("a")), boot_id="boot-2", state=workflow(phase=Phase.REQUESTED))
    [action] = planner.plan(fleet(n), Safety(), POLICY, NOW)
    assert (action.kind, action.state, action.cordon, action.taint) == (Kind.RELEASE, None, False, False)


def test_a_fault_that_clears_on_the_same_boot_ends_the_workflow() -> None:
    [action] = planner.plan(fleet(held(node("a"))), Safety(), POLICY, NOW)
    assert action.kind is Kind.RELEASE
    assert "cleared" in action.message


def test_opting_out_stops_a_workflow_and_keeps_a_new_one_from_starting() -> None:
    n = dataclasses.replace(held(node("a", HBM)), opted_out=True)
    [action] = planner.plan(fleet(n), Safety(max_percent=100), POLICY, NOW)
    assert action.kind is Kind.CANCEL
    assert remediation.OPT_OUT_LABEL in action.message
    [action] = planner.plan(fleet(node("b", HBM, opted_out=True)), Safety(max_percent=100), POLICY, NOW)
    assert (action.kind, action.hold) == (Kind.HOLD, Hold.OPT_OUT)


def test_a_state_that_does_not_read_holds_the_node_and_says_so() -> None:
    n = node("a", HBM, state_error="not JSON")
    [action] = planner.plan(fleet(n), Safety(max_percent=100), POLICY, NOW)
    assert (action.kind, action.hold) == (Kind.HOLD, Hold.UNREADABLE_STATE)
    assert remediation.STATE_ANNOTATION in action.message


# -- safety ----------------------------------------------------------------------------------------


def test_the_breaker_names_itself_with_the_share_of_neuron_nodes() -> None:
    nodes = [node("a", HBM), node("b", HBM), node("c", HBM), node("d")]
    actions = by_node(planner.plan(fleet(*nodes), Safety(max_nodes=10, max_percent=25), POLICY, NOW))
    assert actions["a"].kind is Kind.START
    assert actions["b"].kind is actions["c"].kind is Kind.HOLD
    assert actions["b"].hold is Hold.BREAKER
    assert "breaker: 1 of 4 Neuron nodes (25 %) already remediating, limit 25 %" in actions["b"].message


def test_the_breaker_by_node_count() -> None:
    nodes = [node(f"n{i}", HBM) for i in range(10)]
    actions = planner.plan(fleet(*nodes), Safety(max_nodes=2, max_percent=100), POLICY, NOW)
    assert [a.kind for a in actions].count(Kind.START) == 2
    holds = [a for a in actions if a.kind is Kind.HOLD]
    assert "breaker: 2 of 10 Neuron nodes already remediating, limit 2 (--max-nodes)" in holds[0].message


def test_the_breaker_rounds_down() -> None:
    nodes = [node("a", HBM), node("b"), node("c")]
    [action] = planner.plan(fleet(*nodes), Safety(max_nodes=10, max_percent=25), POLICY, NOW)
    assert action.hold is Hold.BREAKER  # 25 % of 3 nodes is 0.75: no node at all


def test_the_rate_limit_counts_starts_in_the_window_of_nodes_gone_too() -> None:
    safety = Safety(max_nodes=10, max_percent=100, rate_limit=2, rate_window=600)
    [action] = planner.plan(fleet(node("a", HBM), starts=[("gone", NOW - 100), ("b", NOW - 200)]), safety, POLICY, NOW)
    assert action.hold is Hold.RATE_LIMIT
    assert "2 workflows started in the last 600s, limit 2" in action.message
    [action] = planner.plan(fleet(node("a", HBM), starts=[("gone", NOW - 100), ("b", NOW - 700)]), safety, POLICY, NOW)
    assert action.kind is Kind.START


def test_never_a_whole_ultraserver() -> None:
    nodes = [node(f"u{i}", HBM, ultraserver=(4, "us-1")) for i in range(4)]
    actions = planner.plan(fleet(*nodes), Safety(max_nodes=10, max_percent=100, rate_limit=10), POLICY, NOW)
    assert [a.kind for a in actions].count(Kind.START) == 3
    [hold] = [a for a in actions if a.kind is Kind.HOLD]
    assert hold.hold is Hold.ULTRASERVER
    assert "3 of the 4 nodes of UltraServer us-1" in hold.message


def test_a_two_node_ultraserver_takes_one_node_at_a_time_even_when_one_node_is_seen() -> None:
    actions = planner.plan(
        fleet(node("a", HBM, ultraserver=(2, "us-2")), held(node("b", HBM, ultraserver=(2, "us-2")))),
        Safety(max_nodes=10, max_percent=100),
        POLICY,
        NOW,
    )
    assert by_node(actions)["a"].hold is Hold.ULTRASERVER


def test_the_ultraserver_comes_from_the_largest_server_id_label() -> None:
    from neuron_remediation.fleet import ultraserver_of

    labels = {ultraserver.server_id_label(2): "s2", ultraserver.server_id_label(4): "s4"}
    assert ultraserver_of(labels) == (4, "s4")
    assert ultraserver_of({ultraserver.server_id_label(2): "s2"}) == (2, "s2")
    assert ultraserver_of({ultraserver.server_id_label(4): ultraserver.NO_SERVER}) is None


# -- the validation after a reboot (--validate-after-reboot) --------------------------------------------

VALIDATE = Safety(max_percent=100, validate_after_reboot=True, verdict_timeout=600.0)


def rebooted(phase: Phase, fault: faults.Fault = REPAIRABLE, **kw: object) -> NodeView:
    """A node its workflow holds, on a boot after the one the workflow began on (boot-1)."""
    n = dataclasses.replace(held(node("a")), boot_id="boot-2", state=workflow(fault, phase))
    return dataclasses.replace(n, **kw)  # type: ignore[arg-type]


def verdict(passed: bool, boot: str = "boot-2") -> tuple[str, str, str]:
    reason = remediation.VALIDATION_PASSED_REASON if passed else remediation.VALIDATION_FAILED_REASON
    return ("True" if passed else "False", reason, remediation.verdict_message(boot, "passed" if passed else "exit 1"))


@pytest.mark.parametrize("phase", [p for p in Phase if p is not Phase.VALIDATING])
def test_a_new_boot_after_the_request_holds_the_node_for_its_validation(phase: Phase) -> None:
    n = rebooted(phase)
    [action] = planner.plan(fleet(n), VALIDATE, POLICY, NOW)
    if phase is not Phase.REQUESTED:  # cancelled, or a reboot before the drain ended: it ends as before
        assert (action.kind, action.state) == (Kind.RELEASE, None)
        assert "the node booted again: the workflow ends" in action.message
        return
    assert (action.kind, action.reason) == (Kind.ADVANCE, "RemediationValidating")
    assert action.state is not None
    assert (action.state.phase, action.state.since, action.state.boot_id) == (Phase.VALIDATING, NOW, "boot-1")
    assert (action.cordon, action.taint) == (None, None)  # stays cordoned and tainted
    assert "boot-2" in action.message
    # even a verdict that is there already waits for the phase: one step, one Event
    [again] = planner.plan(fleet(dataclasses.replace(n, validated=verdict(True))), VALIDATE, POLICY, NOW)
    assert again.kind is Kind.ADVANCE


@pytest.mark.parametrize("phase", list(Phase))
def test_without_the_flag_a_new_boot_ends_the_workflow_as_before(phase: Phase) -> None:
    [action] = planner.plan(fleet(rebooted(phase)), Safety(max_percent=100), POLICY, NOW)
    assert (action.kind, action.state) == (Kind.RELEASE, None)
    assert "booted again" in action.message


@pytest.mark.parametrize(
    "validated",
    [None, verdict(True, "boot-1"), verdict(False, "boot-1"), ("Unknown", "NeuronValidating", "boot boot-2: running")],
    ids=["none", "an earlier boot's pass", "an earlier boot's failure", "not a verdict"],
)
@pytest.mark.parametrize("fault", [None, HBM])
def test_validating_without_a_verdict_on_this_boot_waits(
    validated: tuple[str, str, str] | None, fault: faults.Fault | None
) -> None:
    n = rebooted(Phase.VALIDATING, validated=validated, health_reason=fault and fault.reason)
    assert planner.plan(fleet(n), VALIDATE, POLICY, NOW) == []  # whether the fault shows again or not
    assert planner.limit(VALIDATE, 1) == 1
    other = node("b", HBM)  # and it counts against the breaker meanwhile
    [hold] = planner.plan(fleet(n, other), dataclasses.replace(VALIDATE, max_nodes=1), POLICY, NOW)
    assert (hold.node, hold.hold) == ("b", Hold.BREAKER)


def test_a_passed_verdict_on_this_boot_ends_the_workflow() -> None:
    n = rebooted(Phase.VALIDATING, validated=verdict(True))
    [action] = planner.plan(fleet(n), VALIDATE, POLICY, NOW)
    assert (action.kind, action.reason, action.state) == (Kind.RELEASE, "RemediationDone", None)
    assert (action.cordon, action.taint) == (False, False)
    assert "passed its validation (boot boot-2: passed)" in action.message


@pytest.mark.parametrize("annotation", [True, False])
def test_a_failed_verdict_escalates_to_the_replace_rung_and_asks_for_a_new_instance(annotation: bool) -> None:
    n = rebooted(Phase.VALIDATING, validated=verdict(False))
    safety = dataclasses.replace(VALIDATE, request_annotation=annotation)
    [action] = planner.plan(fleet(n), safety, POLICY, NOW)
    assert (action.kind, action.reason) == (Kind.REQUEST, "ReplacementRequested")
    assert action.state is not None
    s = action.state
    assert (s.rung, s.phase, s.boot_id, s.since, s.fault) == (
        "replace",
        Phase.REQUESTED,
        "boot-2",
        NOW,
        REPAIRABLE.kind,
    )
    assert "boot boot-2: exit 1" in s.escalated
    assert (action.cordon, action.taint) == (None, True)  # the taint's value becomes the replace rung
    assert "escalated to the replace rung" in action.message
    if annotation:
        assert action.request is not None
        assert (action.request["action"], action.request["fault"]) == ("replace", REPAIRABLE.kind)
    else:
        assert action.request is None


def test_no_verdict_within_the_timeout_escalates_and_says_why() -> None:
    n = rebooted(Phase.VALIDATING, state=workflow(REPAIRABLE, Phase.VALIDATING, since=NOW - 600))
    [action] = planner.plan(fleet(n), VALIDATE, POLICY, NOW)
    assert (action.kind, action.reason) == (Kind.REQUEST, "ReplacementRequested")
    assert action.state is not None
    assert action.state.rung == "replace"
    assert "no validation verdict (NeuronValidated) for boot boot-2 within 600s" in action.message
    n = dataclasses.replace(n, state=workflow(REPAIRABLE, Phase.VALIDATING, since=NOW - 599))
    assert planner.plan(fleet(n), VALIDATE, POLICY, NOW) == []


@pytest.mark.parametrize("change", [{"unschedulable": False}, {"opted_out": True}])
def test_an_admins_uncordon_or_opt_out_during_validation_ends_the_workflow(change: dict[str, bool]) -> None:
    n = dataclasses.replace(rebooted(Phase.VALIDATING), **change)  # type: ignore[arg-type]
    [action] = planner.plan(fleet(n), VALIDATE, POLICY, NOW)
    assert (action.kind, action.state, action.taint) == (Kind.RELEASE, None, False)
    assert "before its validation" in action.message


def test_an_escalated_workflow_is_not_ended_by_the_fault_clearing_but_by_a_validated_boot() -> None:
    [escalation] = planner.plan(fleet(rebooted(Phase.VALIDATING, validated=verdict(False))), VALIDATE, POLICY, NOW)
    assert escalation.state is not None
    n = dataclasses.replace(rebooted(Phase.VALIDATING), boot_id="boot-2", state=escalation.state, validated=None)
    assert planner.plan(fleet(n), VALIDATE, POLICY, NOW + 10) == []  # healthy on this boot: still replaced
    plain = dataclasses.replace(n, state=dataclasses.replace(escalation.state, escalated=""))
    [released] = planner.plan(fleet(plain), VALIDATE, POLICY, NOW + 10)  # the rule it is an exception to
    assert released.kind is Kind.RELEASE
    again = dataclasses.replace(n, boot_id="boot-3")  # rebooted instead of replaced: validated again
    [action] = planner.plan(fleet(again), VALIDATE, POLICY, NOW + 20)
    assert action.state is not None
    assert (action.kind, action.state.phase) == (Kind.ADVANCE, Phase.VALIDATING)


# -- the rules over random fleets, round after round -------------------------------------------------

PHASES = list(Phase)


@st.composite
def nodes_strategy(draw: st.DrawFn) -> list[NodeView]:
    count = draw(st.integers(1, 12))
    result = []
    for i in range(count):
        fault = draw(st.sampled_from([None, TRANSIENT, *ACTIONABLE]))
        server = draw(st.sampled_from([None, (4, "us-a"), (4, "us-b"), (2, "us-c")]))
        state = None
        unschedulable = draw(st.booleans())
        if draw(st.booleans()):
            phase = draw(st.sampled_from(PHASES))
            state = workflow(
                draw(st.sampled_from(ACTIONABLE)),
                phase,
                boot_id=draw(st.sampled_from(["boot-1", "boot-0"])),
                started=NOW - draw(st.floats(0, 7200)),
            )
            unschedulable = unschedulable or phase.holds_node
        result.append(
            node(
                f"n{i:02d}",
                fault,
                neuron=draw(st.booleans()) or fault is not None,
                opted_out=draw(st.integers(0, 4)) == 0,
                unschedulable=unschedulable,
                tainted=state is not None and state.phase.holds_node,
                ultraserver=server,
                approved=draw(st.booleans()),
                state=state,
            )
        )
    return result


safeties = st.builds(
    Safety,
    max_nodes=st.integers(1, 6),
    max_percent=st.sampled_from([10.0, 25.0, 34.0, 50.0, 100.0]),
    rate_limit=st.integers(1, 6),
    rate_window=st.sampled_from([60.0, 3600.0]),
    approval=st.booleans(),
    request_annotation=st.booleans(),
    validate_after_reboot=st.booleans(),
    verdict_timeout=st.sampled_from([45.0, 3600.0]),
)


def apply(nodes: dict[str, NodeView], actions: Sequence[Action]) -> None:
    """What the controller's patches do to the Nodes."""
    for a in actions:
        n = nodes[a.node]
        if a.kind in (Kind.HOLD, Kind.DRAIN):
            continue
        changes: dict[str, object] = {"state": a.state}
        if a.cordon is not None:
            changes["unschedulable"] = a.cordon
        if a.taint is not None:
            changes["tainted"] = a.taint
        nodes[a.node] = dataclasses.replace(n, **changes)  # type: ignore[arg-type]


def holding(nodes: dict[str, NodeView]) -> set[str]:
    return {n.name for n in nodes.values() if n.state is not None and n.state.phase.holds_node}


admin_moves = st.lists(
    st.tuples(
        st.integers(0, 11),
        st.sampled_from(["uncordon", "opt-out", "approve", "fault", "heal", "reboot", "pass", "fail"]),
    ),
    max_size=4,
)


@settings(max_examples=300)
@given(nodes_strategy(), safeties, st.lists(admin_moves, min_size=1, max_size=6))
def test_safety_holds_round_after_round(
    start: list[NodeView], safety: Safety, rounds: list[list[tuple[int, str]]]
) -> None:
    nodes = {n.name: n for n in start}
    names = sorted(nodes)
    starts: list[tuple[str, float]] = [(n.name, n.state.started) for n in start if n.state is not None]
    now = NOW
    cancelled_faults = {
        n.name: (n.state.fault, n.state.boot_id) for n in start if n.state and n.state.phase is Phase.CANCELLED
    }
    for moves in rounds:
        now += 30
        actions = planner.plan(Fleet(dict(nodes), {}, frozenset(), tuple(starts)), safety, POLICY, now)
        assert len({a.node for a in actions}) == len(actions), "one action a node a pass"
        assert all(a.message and a.reason for a in actions)
        before = dict(nodes)
        apply(nodes, actions)
        started = [a for a in actions if a.kind is Kind.START]
        starts += [(a.node, now) for a in started]
        if started:
            neuron = sum(1 for n in nodes.values() if n.neuron)
            assert len(holding(nodes)) <= planner.limit(safety, neuron), "the breaker"
            assert len([t for _, t in set(starts) if now - t < safety.rate_window]) <= safety.rate_limit, "rate limit"
        for a in started:
            n = before[a.node]
            assert not n.opted_out, "opt-out"
            assert cancelled_faults.get(a.node) != (a.state and a.state.fault, n.boot_id), "a cancelled fault again"
            if n.ultraserver is not None:
                members = [m for m in nodes.values() if m.ultraserver and m.ultraserver[1] == n.ultraserver[1]]
                whole = max(n.ultraserver[0], len(members))
                assert sum(1 for m in members if m.name in holding(nodes)) < whole, "a whole UltraServer"
        for a in actions:
            n = before[a.node]
            s = n.state
            if s is not None and s.phase.holds_node and a.kind in (Kind.DRAIN, Kind.REQUEST, Kind.ADVANCE):
                assert not n.opted_out, "an opted-out workflow goes on"
                assert n.unschedulable, "an uncordoned workflow goes on"
            if a.kind is Kind.REQUEST and safety.approval:
                assert s is not None
                assert s.phase in (Phase.DRAINING, Phase.VALIDATING)  # reached only through the approval step
                assert s.phase is Phase.DRAINING or s.boot_id != n.boot_id
            if (
                remediation.awaits_validation(s, n.boot_id)
                and safety.validate_after_reboot
                and n.unschedulable
                and not n.opted_out
            ):
                assert s is not None
                told = n.validated or (None, None, None)
                passed = remediation.verdict(*told, n.boot_id)
                if a.kind is Kind.RELEASE:
                    assert s.phase is Phase.VALIDATING, "released without a verdict"
                    assert passed, "released without a passed verdict"
                if a.kind is Kind.REQUEST:
                    timed_out = now - s.since >= safety.verdict_timeout
                    assert s.phase is Phase.VALIDATING, "escalated before the validation"
                    assert passed is False or timed_out, "escalated unasked"
                    assert a.state is not None
                    assert a.state.rung == "replace"
            if a.kind is Kind.CANCEL:
                assert a.state is not None
                cancelled_faults[a.node] = (a.state.fault, a.state.boot_id)
        for index, move in moves:
            name = names[index % len(names)]
            n = nodes[name]
            if move == "uncordon":
                nodes[name] = dataclasses.replace(n, unschedulable=False)
            elif move == "opt-out":
                nodes[name] = dataclasses.replace(n, opted_out=True)
            elif move == "approve":
                nodes[name] = dataclasses.replace(n, approved=True)
            elif move == "fault":
                nodes[name] = dataclasses.replace(n, health_reason=HBM.reason, neuron=True)
            elif move == "heal":
                nodes[name] = dataclasses.replace(n, health_reason=None, accelerated_reason=None)
            elif move in ("pass", "fail"):
                nodes[name] = dataclasses.replace(n, validated=verdict(move == "pass", n.boot_id))
            else:
                nodes[name] = dataclasses.replace(n, boot_id=n.boot_id + "x", health_reason=None)
                cancelled_faults.pop(name, None)


@given(nodes_strategy(), safeties)
def test_a_held_workflow_is_never_advanced_past_the_approval_without_it(start: list[NodeView], safety: Safety) -> None:
    approval = dataclasses.replace(safety, approval=True)
    for n in start:
        nodes = {n.name: dataclasses.replace(n, approved=False)}
        for a in planner.plan(Fleet(nodes), approval, POLICY, NOW):
            if a.state is not None and a.kind is Kind.ADVANCE:
                assert a.state.phase is not Phase.DRAINING
            # a failed validation asks too, but only after the drain (and its approval) and a reboot
            assert a.kind is not Kind.REQUEST or (
                n.state is not None and n.state.phase in (Phase.DRAINING, Phase.VALIDATING)
            )
