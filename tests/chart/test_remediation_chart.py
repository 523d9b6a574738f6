"""The remediation controller in the chart (`remediation.enabled`): its RBAC is exactly what
`neuron_remediation.rbac` declares (which the controller's integration test runs it under), its
arguments are flags the real controller parses, the namespaces of the chart's own components are
never drained, and contradictory values are refused."""

from __future__ import annotations

from typing import Any

import pytest
from chart.test_chart import of_kind, refusal, render, sets

from neuron_remediation import config, rbac

pytestmark = pytest.mark.integration  # starts external processes: make integration

ON = sets(remediation__enabled=True)
COMPONENT = "remediation-controller"


def owned(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [
        d
        for d in of_kind(docs, kind)
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == COMPONENT
    ]


def deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (d,) = owned(docs, "Deployment")
    return d


def args_of(docs: list[dict[str, Any]]) -> list[str]:
    (c,) = deployment(docs)["spec"]["template"]["spec"]["containers"]
    args: list[str] = c["args"]
    return args


def test_off_by_default() -> None:
    docs = render()
    labels = [d["metadata"].get("labels", {}) for d in docs]
    assert [x for x in labels if x.get("app.kubernetes.io/component") == COMPONENT] == []


def test_the_cluster_role_and_the_lease_role_are_exactly_the_controllers_rules() -> None:
    docs = render(*ON)
    (cluster_role,) = owned(docs, "ClusterRole")
    assert cluster_role["rules"] == [r.as_object() for r in rbac.CLUSTER_RULES]
    (role,) = owned(docs, "Role")
    name = deployment(docs)["metadata"]["name"]
    # the Lease is the one the chart names with --lease-name, not the flag's default
    assert f"--lease-name={name}" in args_of(docs)
    expected = [r.as_object() for r in rbac.LEASE_RULES]
    for rule in expected:
        if "resourceNames" in rule:
            rule["resourceNames"] = [name]
    assert role["rules"] == expected
    assert role["metadata"]["namespace"] == deployment(docs)["metadata"]["namespace"]
    # each bound to the controller's own ServiceAccount, which is created
    sa = deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    (account,) = owned(docs, "ServiceAccount")
    assert account["metadata"]["name"] == sa
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        (binding,) = owned(docs, kind)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name}
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa, "namespace": deployment(docs)["metadata"]["namespace"]}
        ]


def test_without_leader_election_a_single_replica_and_no_role() -> None:
    docs = render(*ON, *sets(remediation__replicas=1, remediation__leaderElection__enabled=False))
    assert owned(docs, "Role") == owned(docs, "RoleBinding") == []
    assert "--no-leader-elect" in args_of(docs)
    assert not [a for a in args_of(docs) if a.startswith("--lease-")]


def test_the_controller_parses_every_argument_the_chart_renders() -> None:
    docs = render(
        *ON,
        *sets(
            remediation__approval=True,
            remediation__maxPercent=12.5,
            remediation__replacement="condition",
            remediation__drainPolicy="finish:2h",
            remediation__namespaceDrainPolicy={"training": "finish:3h", "batch": "delete-after:30m"},
            remediation__barePods="refuse",
            remediation__drainPods="all",
        ),
    )
    namespace = deployment(docs)["metadata"]["namespace"]
    parsed = config.parse(args_of(docs), {"POD_NAMESPACE": namespace, "POD_NAME": "r-0"})
    assert parsed.safety.approval
    assert parsed.safety.max_percent == 12.5
    assert not parsed.safety.request_annotation
    assert parsed.policy.default.timeout == 7200
    assert {ns: (str(p.mode), p.timeout) for ns, p in parsed.policy.namespaces.items()} == {
        "training": ("finish", 10800),
        "batch": ("delete-after", 1800),
    }
    assert str(parsed.policy.bare_pods) == "refuse"
    assert str(parsed.policy.scope) == "all"


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        # AWS's names: the device plugin and the scheduler in kube-system, the detector in its own namespace
        ("aws", {"kube-system", "neuron-healthcheck-system"}),
        ("release", set()),
    ],
)
def test_the_namespaces_of_the_charts_own_components_are_never_drained(names: str, expected: set[str]) -> None:
    # render() installs into kube-system; a release namespace of its own shows which namespaces are added
    docs = render(*ON, *sets(objectNames=names, remediation__keepNamespaces=["training"]), "--namespace", "neuron")
    (keep,) = [a.removeprefix("--keep-namespaces=") for a in args_of(docs) if a.startswith("--keep-namespaces=")]
    parsed = config.parse(args_of(docs), {"POD_NAMESPACE": "neuron", "POD_NAME": "r-0"})
    assert parsed.policy.keep_namespaces == {"training", "neuron"} | expected
    assert keep.split(",")[0] == "training"


def test_the_pods_run_as_nobody_with_probes_and_their_identity() -> None:
    docs = render(*ON)
    d = deployment(docs)
    assert d["spec"]["replicas"] == 2
    pod = d["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 65534
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    assert c["image"].endswith("/neuron-helm-chart/remediation-controller:" + c["image"].rsplit(":", 1)[1])
    mirrored = deployment(render(*ON, *sets(global__imageRegistry="mirror.example")))
    assert mirrored["spec"]["template"]["spec"]["containers"][0]["image"].startswith("mirror.example/")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (sets(npd__remediation__cordon=True), "npd.remediation.cordon=false"),
        (sets(remediation__leaderElection__enabled=False), "remediation.leaderElection.enabled"),
        (sets(remediation__maxPercent=0), "maxPercent"),
        (sets(remediation__drainPolicy="finish"), "drainPolicy"),
        (sets(remediation__namespaceDrainPolicy={"training": "later"}), "namespaceDrainPolicy"),
    ],
)
def test_contradictions_and_malformed_values_are_refused(args: list[str], message: str) -> None:
    assert message in refusal(*ON, *args)


def test_without_the_detector_it_still_deploys() -> None:
    """EKS's node monitoring agent writes AcceleratedHardwareReady, which the controller acts on alone."""
    docs = render(*ON, *sets(npd__enabled=False))
    assert deployment(docs)["spec"]["replicas"] == 2


def test_its_monitor_is_of_the_exporters_kind_and_only_where_the_api_is_served() -> None:
    monitoring_api = ["--api-versions", "monitoring.coreos.com/v1"]
    assert owned(render(*ON), "ServiceMonitor") == owned(render(*ON), "Service") == []
    docs = render(*ON, *monitoring_api)
    (monitor,) = owned(docs, "ServiceMonitor")
    (service,) = owned(docs, "Service")
    assert service["spec"]["selector"] == monitor["spec"]["selector"]["matchLabels"]
    pod_labels = deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert (
        service["spec"]["ports"][0]["port"]
        == deployment(docs)["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http"
    assert endpoint["relabelings"] == [{"targetLabel": "job", "replacement": "neuron-remediator"}]
    # a PodMonitor needs no Service
    pods = render(*ON, *monitoring_api, *sets(nodeMetrics__monitoring__kind="PodMonitor"))
    assert len(owned(pods, "PodMonitor")) == 1
    assert owned(pods, "Service") == []
    assert owned(render(*ON, *monitoring_api, *sets(remediation__monitoring__enabled=False)), "ServiceMonitor") == []


def test_a_budget_keeps_one_replica_through_a_drain_and_none_is_rendered_over_one_replica() -> None:
    docs = render(*ON)
    (pdb,) = owned(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deployment(docs)["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert owned(render(*ON, *sets(remediation__replicas=1)), "PodDisruptionBudget") == []
    assert owned(render(*ON, *sets(remediation__podDisruptionBudget__enabled=False)), "PodDisruptionBudget") == []


def test_helm_test_checks_the_controller_in_its_namespace_where_it_is_installed() -> None:
    """The components pod runs the remediation check (files/helm_test.py: test_remediation) with the controller's
    namespace, selector, port and replica count, may list the pods there, and no such check without it."""
    docs = render(*ON)
    (pod,) = [d for d in of_kind(docs, "Pod") if d["metadata"]["name"].endswith("-tests-components")]
    (c,) = pod["spec"]["containers"]
    assert "remediation" in c["command"]
    env = {e["name"]: e["value"] for e in c["env"]}
    d = deployment(docs)
    namespace = d["metadata"]["namespace"]
    assert env["REMEDIATION_NAMESPACE"] == namespace
    selector = dict(pair.split("=") for pair in env["REMEDIATION_SELECTOR"].split(","))
    assert selector == d["spec"]["selector"]["matchLabels"]
    assert env["REMEDIATION_PORT"] == str(d["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"])
    assert env["REMEDIATION_REPLICAS"] == str(d["spec"]["replicas"])
    assert "REMEDIATION_CREDENTIALS" not in env
    roles = [r for r in of_kind(docs, "Role") if r["metadata"]["name"].endswith("-tests")]
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]} in next(
        r for r in roles if r["metadata"]["namespace"] == namespace
    )["rules"]
    # not installed: no check
    (plain,) = [d for d in of_kind(render(), "Pod") if d["metadata"]["name"].endswith("-tests-components")]
    assert "remediation" not in plain["spec"]["containers"][0]["command"]
    assert not [e for e in plain["spec"]["containers"][0]["env"] if e["name"].startswith("REMEDIATION_")]
