"""Object names and namespaces (issue 31 item 1; docs/installing.md, "Object names and namespaces"): by default
the components AWS's chart also has are named and placed as it does, wherever the release is installed;
`objectNames: release` and each component's `fullnameOverride`/`namespaceOverride` name and place them otherwise,
and everything that refers to them follows."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
import yaml_streams
from chart.test_chart import CHART, HELM, MONITORING_API, REPO, of_kind, refusal, sets
from simcluster.controlplane import ControlPlane, private_control_plane

pytestmark = pytest.mark.integration  # helm

RELEASE = "neuron-helm-chart"
AWS = {
    "device-plugin": ("DaemonSet", "neuron-device-plugin", "kube-system"),
    "problem-detector": ("DaemonSet", "node-problem-detector", "neuron-healthcheck-system"),
    "scheduler-extender": ("Deployment", "k8s-neuron-scheduler", "kube-system"),
    "kube-scheduler": ("Deployment", "my-scheduler", "kube-system"),
}
SCHEDULING = sets(scheduler__enabled=True)
KUBECTL = str(REPO / ".venv" / "bin" / "kubectl")


def render(namespace: str, *args: str) -> list[dict[str, Any]]:
    """The chart as `helm upgrade --install neuron-helm-chart` renders it in `namespace`."""
    out = subprocess.run(
        [HELM, "template", RELEASE, str(CHART), "--namespace", namespace, *args],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [d for d in yaml_streams.load_all(out) if d]


def component(docs: list[dict[str, Any]], name: str, kind: str) -> list[dict[str, Any]]:
    return [
        d
        for d in of_kind(docs, kind)
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == name
        and "helm.sh/hook" not in d["metadata"].get("annotations", {})
    ]


def workload(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (w,) = component(docs, name, AWS[name][0] if name in AWS else "DaemonSet")
    return w


def where(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def scheduler_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = component(docs, "kube-scheduler", "ConfigMap")
    return yaml.safe_load(cm["data"]["config.yaml"])  # type: ignore[no-any-return]


def policy_user(docs: list[dict[str, Any]], name: str) -> str:
    (vap,) = [d for d in of_kind(docs, "ValidatingAdmissionPolicy") if d["metadata"]["name"] == name]
    (condition,) = vap["spec"]["matchConditions"]
    return str(condition["expression"])


def binding_subjects(docs: list[dict[str, Any]], kind: str, name: str) -> list[tuple[str, str]]:
    (binding,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return [(s["namespace"], s["name"]) for s in binding["subjects"]]


# --- the default: AWS's names and namespaces ---------------------------------------------------------


@pytest.mark.parametrize("namespace", ["default", "neuron-system"])
def test_by_default_the_components_have_aws_names_wherever_the_release_is(namespace: str) -> None:
    docs = render(namespace, *SCHEDULING)
    for name, (_, expected, expected_ns) in AWS.items():
        assert where(workload(docs, name)) == (expected_ns, expected), name
    # everything AWS's chart does not have stays in the release namespace, release-scoped
    assert where(workload(docs, "node-metrics")) == (namespace, f"{RELEASE}-node-metrics")
    sas = {where(d) for d in of_kind(docs, "ServiceAccount")}
    assert {
        ("kube-system", "neuron-device-plugin"),
        ("neuron-healthcheck-system", "node-problem-detector"),
        ("kube-system", "k8s-neuron-scheduler"),
        ("kube-system", "my-scheduler"),
        (namespace, f"{RELEASE}-node-metrics"),
        (namespace, f"{RELEASE}-tests"),
    } <= sas


def test_the_install_pages_command_puts_the_plugin_in_kube_system_and_creates_no_namespace() -> None:
    """`helm upgrade --install neuron-helm-chart <chart> --set "npd.enabled=false"` in the default namespace."""
    docs = render("default", "--set", "npd.enabled=false")
    ds = workload(docs, "device-plugin")
    assert where(ds) == ("kube-system", "neuron-device-plugin")
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "neuron-device-plugin"
    assert "nodeSelector" not in ds["spec"]["template"]["spec"], "the page's NODE SELECTOR column says <none>"
    assert of_kind(docs, "Namespace") == []
    assert {d["metadata"]["namespace"] for d in docs if d["metadata"].get("namespace")} == {"default", "kube-system"}


def test_the_detectors_namespace_is_created_kept_and_only_when_needed() -> None:
    (ns,) = of_kind(render("default"), "Namespace")
    assert ns["metadata"]["name"] == "neuron-healthcheck-system"
    assert ns["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert of_kind(render("default", *sets(npd__createNamespace=False)), "Namespace") == []
    # never the release namespace (Helm's) nor a namespace every cluster has
    assert of_kind(render("ops", *sets(npd__namespaceOverride="ops")), "Namespace") == []
    assert of_kind(render("default", *sets(npd__namespaceOverride="kube-system")), "Namespace") == []
    (other,) = of_kind(render("default", *sets(npd__namespaceOverride="neuron-health")), "Namespace")
    assert other["metadata"]["name"] == "neuron-health"


def test_rbac_and_admission_policies_name_the_service_accounts_where_they_are() -> None:
    docs = render("default", *SCHEDULING)
    assert binding_subjects(docs, "ClusterRoleBinding", "neuron-device-plugin") == [
        ("kube-system", "neuron-device-plugin")
    ]
    assert binding_subjects(docs, "ClusterRoleBinding", "node-problem-detector") == [
        ("neuron-healthcheck-system", "node-problem-detector")
    ]
    assert binding_subjects(docs, "ClusterRoleBinding", "k8s-neuron-scheduler") == [
        ("kube-system", "k8s-neuron-scheduler")
    ]
    assert binding_subjects(docs, "ClusterRoleBinding", "my-scheduler") == [("kube-system", "my-scheduler")]
    assert "system:serviceaccount:kube-system:neuron-device-plugin" in policy_user(
        docs, "neuron-device-plugin-own-neuronnode"
    )
    assert "system:serviceaccount:neuron-healthcheck-system:node-problem-detector" in policy_user(
        docs, "node-problem-detector-own-node"
    )
    labels = policy_user(docs, f"{RELEASE}-ultraserver-labels")
    assert "system:serviceaccount:kube-system:neuron-device-plugin" in labels
    assert binding_subjects(docs, "ClusterRoleBinding", f"{RELEASE}-ultraserver-labels") == [
        ("kube-system", "neuron-device-plugin")
    ]


def test_the_second_scheduler_reaches_awss_extension_url_and_leads_in_its_namespace() -> None:
    docs = render("default", *SCHEDULING)
    config = scheduler_config(docs)
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "https://k8s-neuron-scheduler.kube-system.svc:9843"
    assert extender["tlsConfig"]["serverName"] == "k8s-neuron-scheduler.kube-system.svc"
    assert config["leaderElection"]["resourceNamespace"] == "kube-system"
    assert [p["schedulerName"] for p in config["profiles"]] == ["neuron-scheduler", "my-scheduler"]
    (secret,) = [d for d in of_kind(docs, "Secret") if d["metadata"]["name"] == "k8s-neuron-scheduler-tls"]
    assert secret["metadata"]["namespace"] == "kube-system"
    (service,) = component(docs, "scheduler-extender", "Service")
    assert where(service) == ("kube-system", "k8s-neuron-scheduler")
    (policy,) = component(docs, "scheduler-extender", "NetworkPolicy")
    assert policy["metadata"]["namespace"] == "kube-system"
    roles = {where(d) for d in of_kind(docs, "Role")}
    assert {("kube-system", "k8s-neuron-scheduler"), ("kube-system", "my-scheduler")} <= roles


def test_helm_test_lists_each_components_pods_in_its_namespace() -> None:
    docs = render("default", *SCHEDULING)
    env = {
        p["spec"]["containers"][0]["name"]: {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}
        for p in of_kind(docs, "Pod")
    }
    # one pod runs the checks that read the components, each in its component's namespace
    assert env["components"]["DEVICE_PLUGIN_NAMESPACE"] == "kube-system"
    assert env["components"]["NPD_NAMESPACE"] == "neuron-healthcheck-system"
    assert env["components"]["NODE_METRICS_NAMESPACE"] == "default"
    assert [name for name in env["allocation"] if name.endswith("_NAMESPACE")] == ["RELEASE_NAMESPACE"]
    test_roles = {where(d) for d in of_kind(docs, "RoleBinding") if d["metadata"]["name"] == f"{RELEASE}-tests"}
    assert test_roles == {("default", f"{RELEASE}-tests"), ("kube-system", f"{RELEASE}-tests"),
                          ("neuron-healthcheck-system", f"{RELEASE}-tests")}  # fmt: skip
    for binding in [d for d in of_kind(docs, "RoleBinding") if d["metadata"]["name"] == f"{RELEASE}-tests"]:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-tests", "namespace": "default"}]


def test_protected_metrics_have_their_certificate_in_each_agents_namespace() -> None:
    agents = sets(devicePlugin__secureMetrics=True, npd__secureMetrics=True, nodeMetrics__secureMetrics=True)
    docs = render("default", *agents, *SCHEDULING, *sets(scheduler__extender__secureMetrics=True), *MONITORING_API)
    tls = [d for d in of_kind(docs, "Secret") if d["metadata"]["name"] == f"{RELEASE}-metrics-tls"]
    assert {d["metadata"]["namespace"] for d in tls} == {"default", "kube-system", "neuron-healthcheck-system"}
    assert len({d["data"]["ca.crt"] for d in tls}) == 1, "one CA, one certificate"
    assert base64.b64decode(tls[0]["data"]["ca.crt"]).startswith(b"-----BEGIN CERTIFICATE-----")
    # the extender's monitor sits beside it, with the chart's scraper there too
    (monitor,) = component(docs, "scheduler-extender", "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == "kube-system"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["kube-system"]
    scrapers = {where(d) for d in of_kind(docs, "ServiceAccount") if d["metadata"]["name"].endswith("metrics-scraper")}
    assert scrapers == {("default", f"{RELEASE}-metrics-scraper"), ("kube-system", f"{RELEASE}-metrics-scraper")}
    delegated = set(binding_subjects(docs, "ClusterRoleBinding", f"{RELEASE}-metrics-auth"))
    assert {("kube-system", "neuron-device-plugin"), ("neuron-healthcheck-system", "node-problem-detector"),
            ("default", f"{RELEASE}-node-metrics"), ("kube-system", "k8s-neuron-scheduler")} == delegated  # fmt: skip


def test_openshift_grants_the_scc_in_each_agents_namespace() -> None:
    docs = render("default", *sets(openshift__grantPrivilegedScc=True))
    grants = {
        d["metadata"]["namespace"]: [s["name"] for s in d["subjects"]]
        for d in of_kind(docs, "RoleBinding")
        if d["metadata"]["name"].endswith("privileged-scc")
    }
    assert grants == {
        "default": [f"{RELEASE}-node-metrics"],
        "kube-system": ["neuron-device-plugin"],
        "neuron-healthcheck-system": ["node-problem-detector"],
    }


# --- objectNames: release, and each component's own values -------------------------------------------


def test_release_names_put_every_object_in_the_release_namespace() -> None:
    docs = render("neuron-system", *SCHEDULING, *sets(objectNames="release"))
    for name, (kind, _, _) in AWS.items():
        assert where(workload(docs, name)) == ("neuron-system", f"{RELEASE}-{name}"), kind
    namespaces = {d["metadata"]["namespace"] for d in docs if d["metadata"].get("namespace")}
    assert namespaces == {"neuron-system", "kube-system"}
    # in kube-system only what must be there: kube-scheduler's reader of the API server's authentication config
    assert [d["metadata"]["name"] for d in docs if d["metadata"].get("namespace") == "kube-system"] == [
        f"{RELEASE}-kube-scheduler-auth-reader"
    ]
    assert of_kind(docs, "Namespace") == []
    (extender,) = scheduler_config(docs)["extenders"]
    assert extender["urlPrefix"] == f"https://{RELEASE}-scheduler-extender.neuron-system.svc:9843"


def test_each_component_can_be_named_and_placed_on_its_own() -> None:
    docs = render(
        "default", *SCHEDULING,
        *sets(devicePlugin__fullnameOverride="plugin", devicePlugin__namespaceOverride="neuron",
              npd__fullnameOverride="detector", npd__namespaceOverride="health",
              scheduler__extender__fullnameOverride="extender", scheduler__extender__namespaceOverride="sched",
              scheduler__kubeScheduler__fullnameOverride="second", scheduler__kubeScheduler__namespaceOverride="sched"),
    )  # fmt: skip
    assert where(workload(docs, "device-plugin")) == ("neuron", "plugin")
    assert where(workload(docs, "problem-detector")) == ("health", "detector")
    assert where(workload(docs, "scheduler-extender")) == ("sched", "extender")
    assert where(workload(docs, "kube-scheduler")) == ("sched", "second")
    assert scheduler_config(docs)["extenders"][0]["urlPrefix"] == "https://extender.sched.svc:9843"
    # an override wins over objectNames=release too
    docs = render("default", *sets(objectNames="release", devicePlugin__fullnameOverride="neuron-device-plugin"))
    assert where(workload(docs, "device-plugin")) == ("default", "neuron-device-plugin")
    assert where(workload(docs, "problem-detector")) == ("default", f"{RELEASE}-problem-detector")


def test_aws_name_keys_keep_their_meaning() -> None:
    """AWS's devicePlugin/npd fullnameOverride and namespaceOverride are this chart's; its scheduler's are refused
    with the extender's keys named."""
    aws = {"fullnameOverride": "neuron-device-plugin", "namespaceOverride": "kube-system"}
    docs = render("default", *sets(objectNames="release", devicePlugin=aws))
    assert where(workload(docs, "device-plugin")) == ("kube-system", "neuron-device-plugin")
    message = refusal(*sets(scheduler__fullnameOverride="k8s-neuron-scheduler"))
    assert "scheduler.fullnameOverride -> scheduler.extender.fullnameOverride" in message


# --- contradictions ---------------------------------------------------------------------------------


def test_the_extender_and_the_second_scheduler_in_different_namespaces_are_refused() -> None:
    message = refusal(*SCHEDULING, *sets(scheduler__kubeScheduler__namespaceOverride="elsewhere"))
    assert 'scheduler.extender runs in namespace "kube-system" and scheduler.kubeScheduler in "elsewhere"' in message
    # the extender alone, for a scheduler of your own, may be anywhere
    render("default", *SCHEDULING, *sets(scheduler__kubeScheduler__enabled=False,
                                         scheduler__extender__networkPolicy__enabled=False,
                                         scheduler__extender__namespaceOverride="elsewhere"))  # fmt: skip


def test_two_components_under_one_name_are_refused() -> None:
    message = refusal(*sets(devicePlugin__fullnameOverride="node-problem-detector"))
    assert 'devicePlugin and npd are both named "node-problem-detector"' in message
    message = refusal(*sets(objectNames="release", npd__fullnameOverride="x-neuron-helm-chart-node-metrics"))
    assert 'nodeMetrics and npd are both named "x-neuron-helm-chart-node-metrics"' in message


@pytest.mark.parametrize(
    ("key", "value"),
    [("objectNames", "kube"), ("devicePlugin.fullnameOverride", "Neuron_Plugin"), ("npd.namespaceOverride", "a" * 64)],
)
def test_the_schema_refuses_a_bad_name(key: str, value: str) -> None:
    message = refusal("--set", f"{key}={value}")
    assert key.rsplit(".", 1)[-1] in message, message


# --- against a real API server: what is already there ------------------------------------------------------------


@pytest.fixture(scope="module")
def apiserver() -> Iterator[ControlPlane]:
    with private_control_plane("object-names-cp-") as cp:
        yield cp


def kubectl(cp: ControlPlane, *args: str, stdin: str | None = None) -> None:
    subprocess.run([KUBECTL, "--kubeconfig", str(cp.kubeconfig), *args], input=stdin, text=True, check=True,
                   capture_output=True)  # fmt: skip


def dry_run(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    """`helm install --dry-run=server` in `default`: the chart's lookups ask the API server."""
    return subprocess.run(
        [HELM, "install", RELEASE, str(CHART), "--dry-run=server", "--kubeconfig", str(cp.kubeconfig),
         "--namespace", "default", *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def owned(kind: str, name: str, namespace: str | None, release: str, release_namespace: str) -> str:
    """An object as Helm leaves it for a release."""
    metadata: dict[str, Any] = {
        "name": name,
        "labels": {"app.kubernetes.io/managed-by": "Helm"},
        "annotations": {"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": release_namespace},
    }
    if namespace:
        metadata["namespace"] = namespace
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": metadata}
    if kind == "DaemonSet":
        labels = {"app": name}
        obj["apiVersion"] = "apps/v1"
        obj["spec"] = {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
            },
        }
    return json.dumps(obj)


def test_a_second_release_under_awss_names_is_refused_with_the_holder_named(apiserver: ControlPlane) -> None:
    kubectl(
        apiserver, "apply", "-f", "-", stdin=owned("DaemonSet", "neuron-device-plugin", "kube-system", "first", "ops")
    )
    try:
        result = dry_run(apiserver)
        assert result.returncode != 0, result.stdout
        assert (
            'DaemonSet kube-system/neuron-device-plugin already belongs to Helm release "first" in namespace "ops"'
            in (result.stderr)
        ), result.stderr
        assert "--set objectNames=release" in result.stderr
        kubectl(apiserver, "annotate", "daemonset", "-n", "kube-system", "neuron-device-plugin",
                "meta.helm.sh/release-name-", "meta.helm.sh/release-namespace-")  # fmt: skip
        unowned = dry_run(apiserver)
        assert "DaemonSet kube-system/neuron-device-plugin already exists and belongs to no Helm release" in (
            unowned.stderr
        ), unowned.stderr
        # the way out it names works
        assert dry_run(apiserver, "--set", "objectNames=release").returncode == 0
        # and the release that holds the names may upgrade
        kubectl(apiserver, "apply", "-f", "-",
                stdin=owned("DaemonSet", "neuron-device-plugin", "kube-system", RELEASE, "default"))  # fmt: skip
        assert dry_run(apiserver).returncode == 0
    finally:
        kubectl(apiserver, "delete", "daemonset", "-n", "kube-system", "neuron-device-plugin", "--ignore-not-found")


def test_an_existing_detector_namespace_is_used_not_taken_over(apiserver: ControlPlane) -> None:
    def rendered_namespaces() -> list[str]:
        result = dry_run(apiserver)
        assert result.returncode == 0, result.stderr
        docs = [d for d in yaml_streams.load_all(result.stdout.split("MANIFEST:", 1)[1].split("NOTES:", 1)[0]) if d]
        return [d["metadata"]["name"] for d in of_kind(docs, "Namespace")]

    assert rendered_namespaces() == ["neuron-healthcheck-system"], "created when missing"
    try:
        kubectl(apiserver, "create", "namespace", "neuron-healthcheck-system")  # by hand, as AWS's docs do
        assert rendered_namespaces() == [], "one made by hand is used as it is"
        kubectl(apiserver, "apply", "-f", "-",
                stdin=owned("Namespace", "neuron-healthcheck-system", None, RELEASE, "default"))  # fmt: skip
        assert rendered_namespaces() == ["neuron-healthcheck-system"], "this release's own is kept in the release"
    finally:
        kubectl(apiserver, "delete", "namespace", "neuron-healthcheck-system", "--ignore-not-found", "--wait=false")
