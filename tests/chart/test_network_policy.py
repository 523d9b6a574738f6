"""The chart's NetworkPolicies (issue 24): one per component, opt-in except the scheduler extender's.
Each policy's podSelector and `from` peers are checked against the labels of the pods the chart
renders (not against hard-coded labels), its ports against the containers' ports; and every policy the
chart can render is created (server-side dry run) on a real kube-apiserver, so one it would refuse fails."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest
from chart.test_chart import REPO, of_kind, refusal, render, sets
from chart.test_pod_security import COMPONENTS
from simcluster.controlplane import ControlPlane, private_control_plane

from neuron_common.kube import Api, ApiError

pytestmark = pytest.mark.integration  # starts external processes: make integration

ON = sets(scheduler__enabled=True)
AGENTS = {
    "devicePlugin": "device-plugin",
    "nodeMetrics": "node-metrics",
    "npd": "problem-detector",
    "draDriver": "dra-driver",
}
DEFAULT_SCRAPERS = [
    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
    {"namespaceSelector": {"matchLabels": {"network.openshift.io/policy-group": "monitoring"}}},
]
# every policy on; the device plugin and the DRA driver on nodes of their own, as the chart requires
ALL_ON = sets(
    scheduler__enabled=True,
    draDriver__enabled=True,
    devicePlugin__nodeSelector={"allocator": "device-plugin"},
    draDriver__nodeSelector={"allocator": "dra"},
    devicePlugin__networkPolicy__enabled=True,
    nodeMetrics__networkPolicy__enabled=True,
    npd__networkPolicy__enabled=True,
    draDriver__networkPolicy__enabled=True,
    scheduler__kubeScheduler__networkPolicy__enabled=True,
    remediation__enabled=True,
    remediation__networkPolicy__enabled=True,
)
CUSTOM_SCRAPERS = [
    {"namespaceSelector": {"matchLabels": {"team": "observability"}}, "podSelector": {"matchLabels": {"app": "prom"}}},
    {"namespaceSelector": {"matchExpressions": [{"key": "scrape", "operator": "In", "values": ["yes"]}]}},
    {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.5.0/24"]}},
]
OWN_SCHEDULER = [
    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
     "podSelector": {"matchLabels": {"component": "kube-scheduler"}}},
]  # fmt: skip


def policies(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The rendered NetworkPolicies by the component label they carry."""
    return {p["metadata"]["labels"]["app.kubernetes.io/component"]: p for p in of_kind(docs, "NetworkPolicy")}


def pod_labels(docs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The labels of every pod the chart renders (workload templates and helm test pods), by component."""
    found: dict[str, dict[str, str]] = {}
    for d in docs:
        if d["kind"] in ("DaemonSet", "Deployment"):
            labels = d["spec"]["template"]["metadata"]["labels"]
        elif d["kind"] == "Pod":
            labels = d["metadata"]["labels"]
        else:
            continue
        found[labels["app.kubernetes.io/component"]] = labels
    return found


def container_ports(docs: list[dict[str, Any]]) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for d in docs:
        if d["kind"] in ("DaemonSet", "Deployment"):
            component = d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
            for c in d["spec"]["template"]["spec"]["containers"]:
                found.setdefault(component, set()).update(p["containerPort"] for p in c.get("ports", []))
    return found


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector of matchLabels only (the chart's own peers use nothing else) against a pod's labels."""
    assert set(selector) <= {"matchLabels"}, selector
    return selector.get("matchLabels", {}).items() <= labels.items()


def selected(peer: dict[str, Any], pods: dict[str, dict[str, str]]) -> set[str]:
    """The chart's components whose pods a same-namespace podSelector peer admits."""
    assert set(peer) == {"podSelector"}, peer
    return {c for c, labels in pods.items() if matches(peer["podSelector"], labels)}


def test_off_by_default_and_none_without_the_scheduler() -> None:
    assert of_kind(render(), "NetworkPolicy") == []
    assert of_kind(render(*sets(draDriver__enabled=True, devicePlugin__enabled=False)), "NetworkPolicy") == []


def test_with_the_scheduler_only_the_extenders_policy() -> None:
    assert set(policies(render(*ON))) == {"scheduler-extender"}


def test_the_extenders_policy_can_be_turned_off() -> None:
    assert policies(render(*ON, *sets(scheduler__extender__networkPolicy__enabled=False))) == {}


@pytest.mark.parametrize(
    "extra", [[], sets(scheduler__extender__podLabels={"team": "ml"}, scheduler__kubeScheduler__podLabels={"x": "y"})]
)
def test_the_extender_admits_its_verbs_from_neuron_scheduler_and_its_other_replica_only(extra: list[str]) -> None:
    docs = render(*ON, *extra)
    pods = pod_labels(docs)
    policy = policies(docs)["scheduler-extender"]
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert {c for c, labels in pods.items() if matches(spec["podSelector"], labels)} == {"scheduler-extender"}
    (port,) = container_ports(docs)["scheduler-extender"]
    callers, scrapers = spec["ingress"]
    assert callers["ports"] == scrapers["ports"] == [{"port": port, "protocol": "TCP"}]
    # each peer is one component's pods: neuron-scheduler's, and the extender's own (a standby relays to the leader)
    assert [selected(peer, pods) for peer in callers["from"]] == [{"kube-scheduler"}, {"scheduler-extender"}]
    assert scrapers["from"] == DEFAULT_SCRAPERS


def test_a_single_extender_without_leader_election_admits_only_neuron_scheduler() -> None:
    docs = render(*ON, *sets(scheduler__extender__replicas=1, scheduler__extender__leaderElection__enabled=False))
    callers = policies(docs)["scheduler-extender"]["spec"]["ingress"][0]
    assert [selected(peer, pod_labels(docs)) for peer in callers["from"]] == [{"kube-scheduler"}]


def test_a_scheduler_of_ones_own_must_be_named() -> None:
    message = refusal(*ON, *sets(scheduler__kubeScheduler__enabled=False))
    assert "scheduler.extender.networkPolicy.schedulerFrom" in message
    assert "scheduler.extender.networkPolicy.enabled=false" in message
    docs = render(
        *ON,
        *sets(scheduler__kubeScheduler__enabled=False, scheduler__extender__networkPolicy__schedulerFrom=OWN_SCHEDULER),
    )
    callers = policies(docs)["scheduler-extender"]["spec"]["ingress"][0]["from"]
    assert callers[1:] == OWN_SCHEDULER
    assert selected(callers[0], pod_labels(docs)) == {"scheduler-extender"}
    # turned off, nothing needs naming
    docs = render(
        *ON, *sets(scheduler__kubeScheduler__enabled=False, scheduler__extender__networkPolicy__enabled=False)
    )
    assert policies(docs) == {}


def test_all_on_each_component_admits_its_port_from_the_scrapers_only() -> None:
    docs = render(*ALL_ON)
    pods = pod_labels(docs)
    ports = container_ports(docs)
    found = policies(docs)
    assert (
        set(found) == set(ports) == {*AGENTS.values(), "scheduler-extender", "kube-scheduler", "remediation-controller"}
    )
    for component, policy in found.items():
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"], component
        # the policy holds exactly its component's pods, and no other pod of the chart
        assert {c for c, labels in pods.items() if matches(spec["podSelector"], labels)} == {component}
        # every port the pods serve is admitted, and nothing else
        assert {p["port"] for rule in spec["ingress"] for p in rule["ports"]} == ports[component], component
        assert spec["ingress"][-1]["from"][:2] == DEFAULT_SCRAPERS, component
        if component in ("node-metrics", "remediation-controller"):
            # the helm test's metrics and remediation checks read these pods: its pods, and no other, are admitted too
            assert selected(spec["ingress"][-1]["from"][2], pods) == {"tests"}
        elif component != "scheduler-extender":
            assert spec["ingress"] == [
                {"ports": [{"port": p, "protocol": "TCP"}], "from": DEFAULT_SCRAPERS} for p in ports[component]
            ]


def test_without_helm_tests_the_exporter_admits_the_scrapers_alone() -> None:
    docs = render(*ALL_ON, *sets(tests__enabled=False))
    assert policies(docs)["node-metrics"]["spec"]["ingress"][0]["from"] == DEFAULT_SCRAPERS
    assert policies(docs)["remediation-controller"]["spec"]["ingress"][0]["from"] == DEFAULT_SCRAPERS


def test_ports_follow_the_values() -> None:
    docs = render(
        *ALL_ON,
        *sets(
            devicePlugin__port=19841,
            nodeMetrics__port=19840,
            npd__port=19842,
            draDriver__port=19844,
            scheduler__extender__port=19843,
            remediation__port=19845,
        ),
    )
    ports = container_ports(docs)
    for component, policy in policies(docs).items():
        assert {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]} == ports[component]
    assert ports["device-plugin"] == {19841}
    assert ports["scheduler-extender"] == {19843}
    assert ports["remediation-controller"] == {19845}


def test_the_scrapers_value_reaches_every_policy() -> None:
    for component, policy in policies(render(*ALL_ON, *sets(networkPolicy__metricsFrom=CUSTOM_SCRAPERS))).items():
        assert policy["spec"]["ingress"][-1]["from"][:3] == CUSTOM_SCRAPERS, component


def test_no_scrapers_admits_none_and_never_everyone() -> None:
    """An empty `from` would admit every source: with `metricsFrom: []` the rule is left out instead."""
    docs = render(*ALL_ON, *sets(networkPolicy__metricsFrom=[]))
    found = policies(docs)
    for component, policy in found.items():
        for rule in policy["spec"]["ingress"]:
            assert rule.get("from"), f"{component}: a rule without peers admits everyone"
    for component in ("device-plugin", "problem-detector", "dra-driver", "kube-scheduler"):
        assert found[component]["spec"]["ingress"] == [], component
    # the helm test pods read every exporter's /metrics and every remediation controller's /readyz and /metrics
    for component in ("node-metrics", "remediation-controller"):
        assert [selected(p, pod_labels(docs)) for p in found[component]["spec"]["ingress"][0]["from"]] == [{"tests"}]
    (callers,) = found["scheduler-extender"]["spec"]["ingress"]
    assert [selected(p, pod_labels(docs)) for p in callers["from"]] == [{"kube-scheduler"}, {"scheduler-extender"}]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (sets(networkPolicy__metricsFrom=[{}]), "minProperties"),
        (sets(networkPolicy__metricsFrom=[{"podSelectr": {}}]), "podSelectr"),
        (sets(devicePlugin__networkPolicy__enabled="yes"), "networkPolicy"),
    ],
)
def test_the_schema_refuses_a_malformed_value(args: list[str], message: str) -> None:
    assert message in refusal(*args)


# --- a real API server judges every policy ----------------------------------------------------------

VARIANTS = {
    "scheduler": ON,
    "all-on": ALL_ON,
    "custom-scrapers": [*ALL_ON, *sets(networkPolicy__metricsFrom=CUSTOM_SCRAPERS)],
    "no-scrapers": [*ALL_ON, *sets(networkPolicy__metricsFrom=[])],
    "own-scheduler": [*ON, *sets(scheduler__kubeScheduler__enabled=False, scheduler__extender__networkPolicy__schedulerFrom=OWN_SCHEDULER)],
}  # fmt: skip


@pytest.fixture(scope="module")
def apiserver() -> Iterator[ControlPlane]:
    with private_control_plane("netpol-cp-") as cp:
        yield cp


async def dry_run(cp: ControlPlane, objects: list[dict[str, Any]]) -> list[str]:
    """Each object created with dryRun=All in a fresh namespace: the API server's refusals (empty: all accepted)."""
    admin = Api(cp.server, ssl_context=cp.credentials.ssl_context())
    try:
        try:
            await admin.create(
                "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "netpol"}}
            )
        except ApiError as exc:
            if exc.status != 409:
                raise
        refusals = []
        for obj in objects:
            body = {**obj, "metadata": {**obj["metadata"], "namespace": "netpol"}}
            try:
                await admin.request(
                    "POST",
                    "/apis/networking.k8s.io/v1/namespaces/netpol/networkpolicies",
                    params={"dryRun": "All"},
                    body=body,
                )
            except ApiError as exc:
                if exc.status != 422:
                    raise
                refusals.append(exc.message)
        return refusals
    finally:
        await admin.close()


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_api_server_accepts_every_policy(apiserver: ControlPlane, variant: str) -> None:
    rendered = of_kind(render(*VARIANTS[variant]), "NetworkPolicy")
    assert rendered
    assert asyncio.run(dry_run(apiserver, rendered)) == []


def test_the_dry_run_can_fail(apiserver: ControlPlane) -> None:
    """A CIDR the schema lets through but Kubernetes does not: the API server, not the test, judges."""
    rendered = of_kind(
        render(*ALL_ON, *sets(networkPolicy__metricsFrom=[{"ipBlock": {"cidr": "10.0.0.0/33"}}])), "NetworkPolicy"
    )
    refusals = asyncio.run(dry_run(apiserver, rendered))
    assert len(refusals) == len(rendered), refusals
    assert all("cidr" in r for r in refusals), refusals


# --- docs/security.md's table is what the chart renders -------------------------------------------

# docs/security.md names components as its Pod Security table does; every pod but the helm test pods has a policy
README_COMPONENTS = {name: component for name, component in COMPONENTS.items() if component != "tests"}


def documented_policies() -> dict[str, tuple[str, str, int]]:
    """The 'Network policies' table of docs/security.md: component -> (value, default, port)."""
    text = (REPO / "docs" / "security.md").read_text()
    section = text[text.index("## Network policies") :]
    table = section[section.index("| Component |") : section.index("\n\n", section.index("| Component |"))]
    rows = re.findall(r"^\| ([^|]+?) \| `([\w.]+)` \(\**(\w+)[^|]*\| [^|]*?\(?(\d+)\)? \|", table, re.MULTILINE)
    return {README_COMPONENTS[name]: (key, default, int(port)) for name, key, default, port in rows}


def test_the_readmes_table_names_each_policys_value_default_and_port() -> None:
    documented = documented_policies()
    assert set(documented) == set(README_COMPONENTS.values())
    base = sets(
        scheduler__enabled=True, draDriver__enabled=True, remediation__enabled=True,
        devicePlugin__nodeSelector={"allocator": "device-plugin"}, draDriver__nodeSelector={"allocator": "dra"},
    )  # fmt: skip
    on_by_default = set(policies(render(*base)))
    for component, (key, default, port) in documented.items():
        assert (component in on_by_default) == (default == "on"), component
        alone = policies(render(*base, "--set", f"{key}=true"))
        assert component in alone, f"{key}=true renders no policy for {component}"
        assert {p["port"] for rule in alone[component]["spec"]["ingress"] for p in rule["ports"]} == {port}
