"""The drain's plan (which pods go, how, when) and the reading of pods, policies and states."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_common.kube import rfc3339
from neuron_model import node_health, remediation, ultraserver
from neuron_model.remediation import Phase, WorkflowState
from neuron_remediation import drain
from neuron_remediation.drain import BarePods, Mode, NamespacePolicy, Op, Policy, Scope
from neuron_remediation.fleet import PodView, node_view, pod_view

NOW = 1_800_000_000.0


def pod(name: str, ns: str = "ml", **kw: object) -> PodView:
    fields: dict[str, object] = {"controller": "ReplicaSet", "neuron_resources": True}
    fields.update(kw)
    return PodView(ns, name, f"uid-{name}", "node-a", **fields)  # type: ignore[arg-type]


def ops(plan: drain.DrainPlan) -> list[tuple[str, Op]]:
    return [(o.pod.key, o.op) for o in plan.ops]


def test_what_stays() -> None:
    pods = [
        pod("ds", controller="DaemonSet"),
        pod("static", controller="Node", mirror=True),
        pod("agent", ns="neuron-system"),
        pod("web", neuron_resources=False),
        pod("done", phase="Succeeded"),
        pod("train"),
    ]
    plan = drain.plan(pods, Policy(keep_namespaces=frozenset({"neuron-system"})), NOW, NOW)
    assert ops(plan) == [("ml/train", Op.EVICT)]
    kept = {p.name: why for p, why in plan.kept}
    assert set(kept) == {"ds", "static", "agent", "web"}
    assert "DaemonSet" in kept["ds"]
    assert "--drain-pods=neuron" in kept["web"]
    plan = drain.plan(pods, Policy(scope=Scope.ALL, keep_namespaces=frozenset({"neuron-system"})), NOW, NOW)
    assert ops(plan) == [("ml/train", Op.EVICT), ("ml/web", Op.EVICT)]


def test_a_dra_claim_of_the_neuron_driver_counts_as_neuron() -> None:
    p = pod("claimed", neuron_resources=False, claims=("c1",))
    assert ops(drain.plan([p], Policy(), NOW, NOW)) == []
    assert ops(drain.plan([p], Policy(), NOW, NOW, frozenset({"ml/c1"}))) == [("ml/claimed", Op.EVICT)]
    assert ops(drain.plan([p], Policy(), NOW, NOW, frozenset({"other/c1"}))) == []


def test_a_bare_pod_is_deleted_or_refuses_the_drain() -> None:
    bare = pod("bare", controller=None)
    plan = drain.plan([bare, pod("train")], Policy(), NOW, NOW)
    assert ops(plan) == [("ml/bare", Op.DELETE), ("ml/train", Op.EVICT)]
    assert "kubectl drain --force" in plan.ops[0].why
    plan = drain.plan([bare, pod("train")], Policy(bare_pods=BarePods.REFUSE), NOW, NOW)
    assert plan.ops == ()
    assert "ml/bare" in plan.refused
    assert "--bare-pods=refuse" in plan.refused
    assert not plan.complete


def test_namespace_policies() -> None:
    policy = Policy(
        namespaces={"train": NamespacePolicy(Mode.FINISH, 600), "batch": NamespacePolicy(Mode.DELETE_AFTER, 300)}
    )
    pods = [pod("a", ns="train"), pod("b", ns="batch"), pod("c", ns="ml")]
    early = drain.plan(pods, policy, NOW + 100, NOW)
    assert ops(early) == [("batch/b", Op.EVICT), ("ml/c", Op.EVICT)]
    assert [p.key for p, _ in early.waiting] == ["train/a"]
    assert f"until {rfc3339(NOW + 600)}" in early.waiting[0][1]
    late = drain.plan(pods, policy, NOW + 700, NOW)
    assert ops(late) == [("batch/b", Op.DELETE), ("ml/c", Op.EVICT), ("train/a", Op.EVICT)]


def test_a_terminating_pod_is_waited_for_until_its_grace_ends() -> None:
    p = pod("going", deleting_at=NOW + 20)
    plan = drain.plan([p], Policy(), NOW, NOW)
    assert plan.ops == ()
    assert not plan.complete
    assert drain.plan([p], Policy(), NOW + 21, NOW).complete


@given(
    st.lists(
        st.builds(
            pod,
            st.text("abcdef", min_size=1, max_size=4),
            ns=st.sampled_from(["ml", "neuron-system", "batch"]),
            controller=st.sampled_from([None, "ReplicaSet", "DaemonSet", "StatefulSet"]),
            mirror=st.booleans(),
            neuron_resources=st.booleans(),
            phase=st.sampled_from(["Running", "Pending", "Succeeded"]),
        ),
        max_size=12,
        unique_by=lambda p: p.key,
    ),
    st.sampled_from(list(Scope)),
    st.sampled_from(list(BarePods)),
)
def test_the_pods_that_must_stay_are_never_touched(pods: list[PodView], scope: Scope, bare: BarePods) -> None:
    policy = Policy(scope=scope, bare_pods=bare, keep_namespaces=frozenset({"neuron-system"}))
    plan = drain.plan(pods, policy, NOW, NOW)
    for o in plan.ops:
        assert o.pod.controller != "DaemonSet"
        assert not o.pod.mirror
        assert o.pod.namespace != "neuron-system"
        assert not o.pod.finished
        assert scope is Scope.ALL or o.pod.neuron_resources
        assert (o.op is Op.DELETE) == (o.pod.controller is None)
    if plan.refused:
        assert plan.ops == ()
        assert bare is BarePods.REFUSE
        assert any(p.controller is None for p in pods)
        return
    # every unfinished pod is accounted for: moved, waited for, or kept with a reason
    touched = {o.pod.key for o in plan.ops} | {p.key for p, _ in plan.waiting} | {p.key for p, _ in plan.kept}
    assert touched == {p.key for p in pods if not p.finished}
    assert plan.complete == (not plan.ops and not plan.waiting)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("evict", NamespacePolicy()),
        ("finish:2h", NamespacePolicy(Mode.FINISH, 7200)),
        ("delete-after:30m", NamespacePolicy(Mode.DELETE_AFTER, 1800)),
    ],
)
def test_modes_read(text: str, expected: NamespacePolicy) -> None:
    assert drain.parse_mode(text) == expected


@pytest.mark.parametrize("text", ["drop", "evict:5m", "finish", "finish:0s", "delete-after:soon"])
def test_bad_modes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"finish|evict|duration"):
        drain.parse_mode(text)


def test_namespace_policies_read() -> None:
    assert drain.parse_namespace_policies("a=evict, b=finish:1m") == {
        "a": NamespacePolicy(),
        "b": NamespacePolicy(Mode.FINISH, 60),
    }
    assert drain.parse_namespace_policies("") == {}
    for bad in ("a", "=evict", "a=evict,a=finish:1m"):
        with pytest.raises(ValueError, match=r"<namespace>=<mode>|given twice"):
            drain.parse_namespace_policies(bad)


# -- reading the objects ------------------------------------------------------------------------


def test_a_pod_object_reads() -> None:
    obj = {
        "metadata": {
            "name": "p", "namespace": "ml", "uid": "u", "deletionTimestamp": "2027-01-15T08:00:00Z",
            "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": True}],
        },
        "spec": {
            "nodeName": "n",
            "containers": [{"name": "c", "resources": {"limits": {"aws.amazon.com/neuroncore": "2"}}}],
            "resourceClaims": [{"name": "a", "resourceClaimTemplateName": "t"}, {"name": "b", "resourceClaimName": "mine"}],
        },
        "status": {"phase": "Running", "resourceClaimStatuses": [{"name": "a", "resourceClaimName": "p-a-xyz"}]},
    }  # fmt: skip
    view = pod_view(obj, "aws.amazon.com")
    assert view is not None
    assert (view.key, view.node, view.controller, view.neuron_resources) == ("ml/p", "n", "ReplicaSet", True)
    assert view.claims == ("p-a-xyz", "mine")
    assert view.deleting_at == dt.datetime(2027, 1, 15, 8, tzinfo=dt.UTC).timestamp()
    assert pod_view(dict(obj, spec={"nodeName": ""}), "aws.amazon.com") is None  # not bound: no drain concerns it
    other = pod_view(obj, "example.com")
    assert other is not None
    assert not other.neuron_resources


def test_a_node_object_reads_with_its_state() -> None:
    s = WorkflowState("HBM_UNCORRECTABLE_ERROR", "NeuronHasError_HBM_UNCORRECTABLE_ERROR", "replace", "b1",
                      Phase.DRAINING, 1.0, 2.0, True, "draining")  # fmt: skip
    obj = {
        "metadata": {
            "name": "n", "resourceVersion": "7",
            "labels": {remediation.OPT_OUT_LABEL: "true", ultraserver.server_id_label(4): "s"},
            "annotations": {remediation.STATE_ANNOTATION: s.dump(), remediation.APPROVED_ANNOTATION: ""},
        },
        "spec": {"unschedulable": True, "taints": [{"key": remediation.TAINT, "effect": "NoSchedule"}]},
        "status": {
            "nodeInfo": {"bootID": "b1"},
            "conditions": [
                {"type": node_health.CONDITION, "status": "True", "reason": "NeuronHasError_HBM_UNCORRECTABLE_ERROR"},
                {"type": node_health.ACCELERATED_HARDWARE_CONDITION, "status": "False", "reason": "NeuronHBMUncorrectableError"},
            ],
        },
    }  # fmt: skip
    view = node_view(obj, "aws.amazon.com")
    assert view is not None
    assert view.state == s
    assert (view.neuron, view.unschedulable, view.tainted, view.opted_out, view.approved) == (True,) * 5
    assert view.ultraserver == (4, "s")
    assert (view.health_reason, view.accelerated_reason, view.boot_id) == (
        s.reason,
        "NeuronHBMUncorrectableError",
        "b1",
    )
    assert not view.health_escalated
    condition = obj["status"]["conditions"][0]  # type: ignore[index]
    condition["message"] = "neuron3: x (validation in place: escalated)"
    escalated = node_view(obj, "aws.amazon.com")
    assert escalated is not None
    assert escalated.health_escalated
    plain = node_view({"metadata": {"name": "cpu"}, "status": {"capacity": {"cpu": "4"}}}, "aws.amazon.com")
    assert plain is not None
    assert not plain.neuron
    by_capacity = node_view(
        {"metadata": {"name": "x"}, "status": {"capacity": {"aws.amazon.com/neuron": "16"}}}, "aws.amazon.com"
    )
    assert by_capacity is not None
    assert by_capacity.neuron


def test_an_unreadable_state_annotation_is_kept_as_an_error() -> None:
    view = node_view({"metadata": {"name": "n", "annotations": {remediation.STATE_ANNOTATION: "{"}}}, "p")
    assert view is not None
    assert view.state is None
    assert "not JSON" in view.state_error
