"""End to end: the chart installed by Helm on the real single-node cluster (make cluster-up) over
a simulated Neuron node, with the project's own images. The tests run in file order and share one
release; each leaves the node as it found it (no pod held, no error, no taint).

Runs with `-m e2e` (make test does, after the cluster tests) against $KUBECONFIG, which defaults to
the test cluster's; pytest-helm-charts supplies the cluster connection and the DaemonSet waits.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykube
import pytest
import yaml
import yaml_streams
from chart_tools import KMM_API, NFD_API, NODE_ENABLEMENT_GROUPS, NODE_ENABLEMENT_VARIANTS, chart_tools
from cluster_access import (
    BIN,
    CLUSTER_DIR,
    KUBECONFIG,
    NODE,
    REPO,
    SHOW_DEVICES,
    SIM_ROOT,
    eventually,
    exporter_metrics,
    helm,
    helm_test_checks,
    helm_test_suites,
    https_get,
    kubectl,
    node,
    pod_phase,
    read,
    restart_kubelet,
    run,
    secret_value,
    sim,
    unschedulable,
    workload_pod,
)
from nfd_tools import nfd_bin, worker_env
from pytest_helm_charts.clusters import Cluster
from pytest_helm_charts.k8s.daemon_set import wait_for_daemon_sets_to_run
from pytest_helm_charts.utils import wait_for_objects_condition

CHART = REPO / "charts" / "neuron-helm-chart"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
TRN2_ROOT = SIM_ROOT.parent / "e2e-trn2"
RELEASE = "neuron-helm-chart"
NAMESPACE = "neuron-e2e"
WORKLOADS = "neuron-e2e-workloads"
VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
WORKLOAD_IMAGE = f"localhost/neuron-helm-chart/device-plugin:{VERSION}"
DAEMONSETS = {
    "devicePlugin": f"{RELEASE}-device-plugin",
    "nodeMetrics": f"{RELEASE}-node-metrics",
    "npd": f"{RELEASE}-problem-detector",
}
# off by default, and installed by a ci values file (tests/e2e/test_dra.py tests it)
OPTIONAL_DAEMONSETS = {"draDriver": f"{RELEASE}-dra-driver"}
RESOURCE = "aws.amazon.com"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


# --- helpers ---------------------------------------------------------------------------------


def allocatable() -> tuple[str | None, str | None]:
    a = node()["status"].get("allocatable", {})
    return a.get(f"{RESOURCE}/neuron"), a.get(f"{RESOURCE}/neuroncore")


def neuron_health() -> dict[str, Any] | None:
    found = [c for c in node()["status"]["conditions"] if c["type"] == "NeuronHealth"]
    return found[0] if found else None


def strictly_ready(ds: pykube.DaemonSet) -> bool:
    """Every pod runs the current template and is ready (stricter than pytest-helm-charts' count check,
    which an old pod still counting as ready would pass)."""
    status = ds.obj.get("status", {})
    desired = status.get("desiredNumberScheduled", -1)
    return bool(
        status.get("observedGeneration") == ds.obj["metadata"]["generation"]
        and desired > 0
        and status.get("updatedNumberScheduled") == desired
        and status.get("numberReady") == desired
        and status.get("numberAvailable") == desired
        and not status.get("numberUnavailable")
    )


def wait_daemonsets(kube_cluster: Cluster, names: list[str]) -> None:
    wait_for_daemon_sets_to_run(kube_cluster.kube_client, names, NAMESPACE, timeout_sec=180)
    wait_for_objects_condition(
        kube_cluster.kube_client, pykube.DaemonSet, names, NAMESPACE, strictly_ready, timeout_sec=180, missing_ok=False
    )


def install(kube_cluster: Cluster, *args: str, values: Path | None = None) -> list[str]:
    """helm upgrade --install in simulation mode; returns the DaemonSets that must then be running."""
    files = ["-f", str(values)] if values else []
    helm(
        "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
        # every object <release>-<component> in NAMESPACE, which these tests name (AWS's names, the default, are
        # tests/e2e/test_install_page.py's)
        "--set", "objectNames=release",
        "--set", "simulation.enabled=true", "--set", f"simulation.hostRoot={SIM_ROOT}", *files, *args,
        "--wait", "--timeout", "300s",
    )  # fmt: skip
    rendered = yaml.safe_load(helm("get", "values", RELEASE, "-n", NAMESPACE, "--all", "-o", "yaml").stdout)
    expected = [name for key, name in (DAEMONSETS | OPTIONAL_DAEMONSETS).items() if rendered[key]["enabled"]]
    wait_daemonsets(kube_cluster, expected)
    present = {d["metadata"]["name"] for d in read("ds", namespace=NAMESPACE)["items"]}
    assert present == set(expected), f"DaemonSets {present}, expected {expected}"
    return expected


def pod_manifest(name: str, limits: dict[str, int], script: str) -> str:
    """A workload pod running `script` (Python) with the project's image."""
    return workload_pod(name, WORKLOADS, WORKLOAD_IMAGE, {"limits": limits}, script)


def start_pod(name: str, limits: dict[str, int]) -> dict[str, list[str]]:
    kubectl("apply", "-f", "-", stdin=pod_manifest(name, limits, SHOW_DEVICES))
    eventually(lambda: pod_phase(name, WORKLOADS) == "Running", f"pod {name} running", 180)
    seen: dict[str, list[str]] = {}

    def logged() -> bool:
        lines = kubectl("logs", "-n", WORKLOADS, name).splitlines()
        seen.clear()
        for line in lines:
            key, _, value = line.partition("=")
            seen.setdefault(key, []).append(value)
        return "cores" in seen

    eventually(logged, f"pod {name} printed its devices")
    return seen


def delete_pods(*names: str) -> None:
    kubectl("delete", "pod", "-n", WORKLOADS, *names, "--ignore-not-found", "--wait=true", "--timeout=60s")


def restart_daemonset_pods(kube_cluster: Cluster, component: str) -> None:
    name = f"{RELEASE}-{component}"
    before = kubectl(
        "get", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/component={component}", "-o", "name"
    ).split()
    assert before, f"no pod of {name}"
    kubectl("delete", "-n", NAMESPACE, *before, "--wait=true", "--timeout=60s")
    eventually(
        lambda: set(
            kubectl(
                "get", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/component={component}", "-o", "name"
            ).split()
        ).isdisjoint(before),
        f"{name}'s pod replaced",
    )
    wait_daemonsets(kube_cluster, [name])


def simulated_reboot(kube_cluster: Cluster) -> None:
    """A reboot as the node agents see it: a new boot id, an empty kernel log, every agent restarted."""
    sim("inject", "--root", SIM_ROOT, "reboot")
    for component in ("problem-detector", "device-plugin", "node-metrics"):
        if kubectl("get", "ds", "-n", NAMESPACE, f"{RELEASE}-{component}", check=False):
            restart_daemonset_pods(kube_cluster, component)


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def cluster_prepared(kube_cluster: Cluster, namespace_factory: Callable[..., Any]) -> Iterator[None]:
    """CRDs of the optional objects (so the ci variants that force them install), the NFD label the nfd
    variant places on, a clean simulated node, and the workloads' namespace (pytest-helm-charts')."""
    paths = chart_tools()
    kubectl("apply", "--server-side", "-f", paths["CRDS"])
    kubectl("label", "node", NODE, "feature.node.kubernetes.io/aws-neuron=true", "--overwrite")
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found", "--wait")
    sim("inject", "--root", SIM_ROOT, "reboot")
    namespace_factory(WORKLOADS)
    yield
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found", "--wait", check=False)
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
    kubectl("label", "node", NODE, "feature.node.kubernetes.io/aws-neuron-", check=False)
    kubectl("taint", "node", NODE, "aws.amazon.com/neuron-unhealthy-", check=False)
    kubectl("delete", "-f", paths["CRDS"], "--ignore-not-found", "--wait=false", check=False)


# --- KMM and NFD objects against the API server's own validation ------------------------------


@pytest.mark.parametrize("variant", NODE_ENABLEMENT_VARIANTS)
def test_every_kmm_and_nfd_object_passes_a_server_side_dry_run(variant: str) -> None:
    """Every shape of KMM and NFD object the chart renders, validated by the API server against the CRDs
    cluster_prepared installed (the pinned NFD release's and the vendored KMM release's); nothing is created."""
    out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *NODE_ENABLEMENT_VARIANTS[variant],
               *NFD_API, *KMM_API).stdout  # fmt: skip
    objects = [d for d in yaml_streams.load_all(out) if d and d["apiVersion"].startswith(NODE_ENABLEMENT_GROUPS)]
    assert objects
    kubectl(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    )
    applied = kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", stdin=yaml_streams.dump_all(objects))
    for d in objects:
        assert f"{d['metadata']['name']} serverside-applied (server dry run)" in applied, applied


def test_the_api_server_refuses_a_rule_its_crd_forbids() -> None:
    """The dry-run above can fail: an operator outside the CRD's enum is refused."""
    out = helm("template", RELEASE, str(CHART), *NODE_ENABLEMENT_VARIANTS["rule"], *NFD_API).stdout
    (rule,) = [d for d in yaml_streams.load_all(out) if d and d["kind"] == "NodeFeatureRule"]
    rule["spec"]["rules"][0]["matchFeatures"][0]["matchExpressions"]["vendor"]["op"] = "Equals"
    result = run(BIN / "kubectl", "apply", "--server-side", "--dry-run=server", "-f", "-", check=False,
                 stdin=yaml.safe_dump(rule))  # fmt: skip
    assert result.returncode != 0
    assert "Equals" in result.stderr


# --- the whole stack -------------------------------------------------------------------------


def test_all_on_allocatable_is_what_trn1_32xlarge_implies(kube_cluster: Cluster) -> None:
    install(kube_cluster, values=CHART / "ci" / "all-on-values.yaml")
    eventually(lambda: allocatable() == ("16", "32"), "allocatable 16 neuron / 32 neuroncore")
    assert node()["status"]["capacity"][f"{RESOURCE}/neuron"] == "16"


def test_a_pod_with_two_cores_sees_its_device_and_is_attributed() -> None:
    seen = start_pod("cores2", {f"{RESOURCE}/neuroncore": 2})
    try:
        cores = [int(c) for c in seen["cores"][0].split(",")]
        assert len(cores) == 2
        assert cores[1] == cores[0] + 1, "two cores of one device, contiguous"
        assert seen["device"] == [f"/dev/neuron{cores[0] // 2}"]
        # the device whose cores are held is no longer offered whole
        eventually(lambda: allocatable() == ("15", "32"), "neuron 15 while two of its cores are held")
        labels = f'namespace="{WORKLOADS}",pod="cores2",container="main"'

        def attributed() -> bool:
            return any(
                labels in line and line.startswith("neuron_") for line in exporter_metrics(NAMESPACE).splitlines()
            )

        # within one attribution period (10 s by default), plus one scrape
        eventually(attributed, "the exporter's metrics carry the pod's labels", timeout=25)
    finally:
        delete_pods("cores2")
    eventually(lambda: allocatable() == ("16", "32"), "everything free again")


def test_four_devices_form_a_torus_row_and_too_many_stay_pending() -> None:
    seen = start_pod("devices4", {f"{RESOURCE}/neuron": 4})
    try:
        devices = sorted(int(d.removeprefix("/dev/neuron")) for d in seen["device"])
        assert devices in ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]), devices
        assert seen["cores"][0] == ",".join(str(c) for d in devices for c in (2 * d, 2 * d + 1))
        kubectl(
            "apply", "-f", "-", stdin=pod_manifest("too-many", {f"{RESOURCE}/neuron": 13}, "import time; time.sleep(1)")
        )
        # the scheduler's verdict on it first: only after it is Pending a proof that nothing placed it
        refused = eventually(lambda: unschedulable("too-many", WORKLOADS), "the scheduler to refuse too-many", 60)
        assert f"Insufficient {RESOURCE}/neuron" in refused, refused
        assert pod_phase("too-many", WORKLOADS) == "Pending"
        events = kubectl(
            "get", "events", "-n", WORKLOADS, "--field-selector", "involvedObject.name=too-many", "-o", "json"
        )
        assert any(f"Insufficient {RESOURCE}/neuron" in e["message"] for e in json.loads(events)["items"])
    finally:
        delete_pods("devices4", "too-many")


def test_helm_test_passes() -> None:
    result = helm("test", RELEASE, "-n", NAMESPACE, "--logs", "--timeout", "300s")
    # the checks that read the components run in one pod; allocation, holding a core, in its own
    assert helm_test_suites(result.stdout) == {"components": "Succeeded", "allocation": "Succeeded"}, result.stdout
    checks = helm_test_checks(result.stdout)
    # all-on-values.yaml installs the remediation controller: its check too
    wanted = ("capacity", "metrics", "monitoring", "health", "remediation", "allocation")
    assert checks == dict.fromkeys(wanted, True), result.stdout
    assert "advertises 16 neuron and 32 neuroncore" in result.stdout
    # this module installed the Prometheus operator's CRDs: the monitoring check found the objects
    assert f"ok: the ServiceMonitor {RELEASE}-node-metrics exists" in result.stdout
    assert f"ok: the PrometheusRule {RELEASE}-node-metrics exists" in result.stdout


def test_a_hardware_error_becomes_condition_event_and_unhealthy_device(kube_cluster: Cluster) -> None:
    sim("inject", "--root", SIM_ROOT, "hw-error", "--kind", "NC_UNCORRECTABLE_ERROR", "--device", "3", "--core", "1")
    eventually(lambda: (neuron_health() or {}).get("status") == "True", "NeuronHealth True")
    condition = neuron_health()
    assert condition is not None
    assert condition["reason"] == "NeuronHasError_NC_UNCORRECTABLE_ERROR"

    def event() -> bool:
        events = kubectl(
            "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={NODE}", "-o", "json"
        )
        return any(e["reason"] == "NeuronHasError_NC_UNCORRECTABLE_ERROR" for e in json.loads(events)["items"])

    eventually(event, "a NeuronHasError_NC_UNCORRECTABLE_ERROR Event on the Node")
    eventually(lambda: allocatable() == ("15", "30"), "neuron3 and its cores Unhealthy")
    # remediation is off by default: no taint, not cordoned
    spec = node()["spec"]
    assert not [t for t in spec.get("taints", []) if t["key"] == "aws.amazon.com/neuron-unhealthy"]
    assert not spec.get("unschedulable")


def test_restarting_each_daemonset_pod_loses_nothing(kube_cluster: Cluster) -> None:
    for component in ("problem-detector", "device-plugin", "node-metrics"):
        restart_daemonset_pods(kube_cluster, component)
        # same boot: the detector keeps its verdict and the plugin re-reads it
        condition = neuron_health()
        assert condition is not None
        assert condition["status"] == "True", component
        assert condition["reason"] == "NeuronHasError_NC_UNCORRECTABLE_ERROR"
        eventually(lambda: allocatable() == ("15", "30"), f"neuron3 still Unhealthy after restarting {component}")
    eventually(lambda: "neuron_device_info{" in exporter_metrics(NAMESPACE), "the exporter serving again")


def test_remediation_on_taints_and_a_reboot_clears_everything(kube_cluster: Cluster) -> None:
    install(kube_cluster, "--set", "npd.remediation.taint=true", values=CHART / "ci" / "all-on-values.yaml")
    taint = {"key": "aws.amazon.com/neuron-unhealthy", "value": "true", "effect": "NoSchedule"}
    eventually(lambda: taint in node()["spec"].get("taints", []), "the unhealthy taint")
    simulated_reboot(kube_cluster)
    eventually(lambda: (neuron_health() or {}).get("status") == "False", "NeuronHealth False after the reboot")
    eventually(lambda: taint not in node()["spec"].get("taints", []), "the taint removed")
    eventually(lambda: allocatable() == ("16", "32"), "every device healthy again")
    install(kube_cluster, values=CHART / "ci" / "all-on-values.yaml")


def test_plugin_only_marks_a_device_unhealthy_from_a_kernel_line(kube_cluster: Cluster) -> None:
    """Without the problem detector the plugin follows the kernel log itself: a NEURON_HW_ERR line naming a
    device takes that device and its cores out of allocatable, with no detector verdict to relay it."""
    device = 5
    recovered = False
    try:
        expected = install(kube_cluster, values=CHART / "ci" / "device-plugin-only-values.yaml")
        assert expected == [DAEMONSETS["devicePlugin"]]
        ds = read("ds", DAEMONSETS["devicePlugin"], namespace=NAMESPACE)
        args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        assert not [a for a in args if a.startswith(("--kmsg-path", "--verdict-dir"))], (
            f"the default kernel log: {args}"
        )
        eventually(lambda: allocatable() == ("16", "32"), "every device healthy before the kernel line")
        devices, cores = (int(n or 0) for n in allocatable())
        cores_per_device = cores // devices  # every device of an instance has the same cores
        sim("inject", "--root", SIM_ROOT, "hw-error", "--kind", "NC_UNCORRECTABLE_ERROR", "--device", str(device))
        eventually(
            lambda: allocatable() == (str(devices - 1), str(cores - cores_per_device)),
            f"neuron{device} and its {cores_per_device} cores Unhealthy from the kernel line",
        )
        simulated_reboot(kube_cluster)
        eventually(lambda: allocatable() == ("16", "32"), "every device healthy after the reboot")
        recovered = True
    finally:
        if not recovered:  # leave no kernel line behind for the tests after this one
            sim("inject", "--root", SIM_ROOT, "reboot")
        install(kube_cluster, values=CHART / "ci" / "all-on-values.yaml")
    eventually(lambda: allocatable() == ("16", "32"), "every device healthy with the whole stack back")


def test_kubelet_restart_plugin_reregisters(kube_cluster: Cluster) -> None:
    restart_kubelet()
    eventually(lambda: allocatable() == ("16", "32"), "allocatable back after the kubelet restart")
    wait_daemonsets(kube_cluster, list(DAEMONSETS.values()))
    # proof of re-registration with the new kubelet: a pod is admitted with a core
    seen = start_pod("after-restart", {f"{RESOURCE}/neuroncore": 1})
    delete_pods("after-restart")
    assert len(seen["device"]) == 1


def test_upgrade_with_changed_values_rolls_out(kube_cluster: Cluster) -> None:
    name = DAEMONSETS["nodeMetrics"]
    generation = read("ds", name, namespace=NAMESPACE)["metadata"]["generation"]
    install(kube_cluster, "--set", "nodeMetrics.attributionInterval=5", values=CHART / "ci" / "all-on-values.yaml")
    ds = read("ds", name, namespace=NAMESPACE)
    assert ds["metadata"]["generation"] > generation
    pods = read("pods", namespace=NAMESPACE, selector="app.kubernetes.io/component=node-metrics")
    running = [p for p in pods["items"] if p["metadata"].get("deletionTimestamp") is None]
    assert running
    assert all("--attribution-interval=5" in p["spec"]["containers"][0]["args"] for p in running)


def test_protected_metrics_serve_readers_only(kube_cluster: Cluster) -> None:
    """Issue 24 item 3 on the real cluster: with secureMetrics the agents' pods become ready (the
    kubelet probes HTTPS), each /metrics refuses an anonymous caller and a ServiceAccount without the
    reader role, and serves a reader named in metricsAuth.readers and the chart's own scraper (whose
    token Secret the controller manager fills), over TLS checked against the chart's CA."""
    kubectl("create", "namespace", "monitoring", check=False)
    kubectl("create", "serviceaccount", "prometheus", "-n", "monitoring", check=False)
    reader = json.dumps([{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}])
    ports = {"node-metrics": 9840, "device-plugin": 9841, "problem-detector": 9842}
    try:
        install(
            kube_cluster, *(f"--set={key}.secureMetrics=true" for key in ("nodeMetrics", "devicePlugin", "npd")),
            f"--set-json=metricsAuth.readers={reader}", values=CHART / "ci" / "all-on-values.yaml",
        )  # fmt: skip
        ca = secret_value(NAMESPACE, f"{RELEASE}-metrics-tls", "ca.crt")
        server_name = f"{RELEASE}-metrics.{NAMESPACE}.svc"
        eventually(lambda: secret_value(NAMESPACE, f"{RELEASE}-metrics-scraper", "token") != b"", "the scraper's token")
        tokens = {
            "prometheus": kubectl("create", "token", "prometheus", "-n", "monitoring").strip(),
            "scraper": secret_value(NAMESPACE, f"{RELEASE}-metrics-scraper", "token").decode(),
            "stranger": kubectl("create", "token", "default", "-n", "monitoring").strip(),
        }
        for component, port in ports.items():
            pods = read("pods", namespace=NAMESPACE, selector=f"app.kubernetes.io/component={component}")
            (pod,) = [p for p in pods["items"] if p["metadata"].get("deletionTimestamp") is None]
            assert "--metrics-auth=kubernetes" in pod["spec"]["containers"][0]["args"]
            address = pod["status"]["podIP"]

            def get(token: str | None, address: str = address, port: int = port) -> tuple[int, str]:
                return https_get(address, port, "/metrics", ca_pem=ca, server_name=server_name, token=token)

            assert get(None)[0] == 401, component
            assert get(tokens["stranger"])[0] == 403, component
            for who in ("prometheus", "scraper"):
                status, body = get(tokens[who])
                assert status == 200, (component, who)
                assert 'neuron_metrics_auth_decisions_total{verdict="forbidden"}' in body
            assert https_get(address, port, "/healthz", ca_pem=ca, server_name=server_name)[0] == 200
        # and `helm test`'s metrics check reads the protected exporter as the chart's scraper, over TLS
        result = helm(
            "test",
            RELEASE,
            "-n",
            NAMESPACE,
            "--filter",
            f"name={RELEASE}-tests-components",
            "--logs",
            "--timeout",
            "300s",
        )
        assert "serves the node's devices' metrics" in result.stdout
        assert helm_test_checks(result.stdout)["metrics"] is True, result.stdout
    finally:
        install(kube_cluster, values=CHART / "ci" / "all-on-values.yaml")
        kubectl("delete", "namespace", "monitoring", "--wait=false", check=False)
    assert "neuron_device_info{" in exporter_metrics(NAMESPACE)  # plain HTTP again


def test_trn2_48xlarge_advertises_16_devices_and_64_cores(kube_cluster: Cluster) -> None:
    sim("create", "--instance-type", "trn2.48xlarge", "--root", TRN2_ROOT, "--char-devices", "--force")
    kubectl("label", "node", NODE, "node.kubernetes.io/instance-type=trn2.48xlarge", "--overwrite")
    try:
        install(kube_cluster, "--set", f"simulation.hostRoot={TRN2_ROOT}", values=CHART / "ci" / "all-on-values.yaml")
        eventually(lambda: allocatable() == ("16", "64"), "trn2.48xlarge at the default logical-core setting: 16 / 64")
        result = helm("test", RELEASE, "-n", NAMESPACE, "--logs", "--timeout", "300s")
        assert "(trn2.48xlarge) advertises 16 neuron and 64 neuroncore" in result.stdout
    finally:
        kubectl("label", "node", NODE, "node.kubernetes.io/instance-type=trn1.32xlarge", "--overwrite")
        install(kube_cluster, values=CHART / "ci" / "all-on-values.yaml")
        run("rm", "-rf", TRN2_ROOT)
    eventually(lambda: allocatable() == ("16", "32"), "back to trn1.32xlarge")


# --- a real node-feature-discovery labels the node from its simulated PCI functions -------------

NFD_NAMESPACE = "node-feature-discovery"
NFD_LABEL = "feature.node.kubernetes.io/aws-neuron"
NFD_MASTER_PORT = 18089
# the label of a second NodeFeature of the node, the positive marker that nfd-master has handled the first
NFD_MARKER = "feature.node.kubernetes.io/e2e-handled"
NON_NEURON_ROOT = SIM_ROOT.parent / "e2e-non-neuron"


@pytest.fixture
def nfd_master(tmp_path: Path) -> Iterator[None]:
    """The real nfd-master (tests/nfd/build-nfd.sh) as a host process with the cluster's kubeconfig, as the
    cluster's own components run; the node loses the label cluster_prepared set, so only NFD can set it."""
    kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NFD_NAMESPACE}}),
    )
    kubectl("label", "node", NODE, f"{NFD_LABEL}-", check=False)
    log = (CLUSTER_DIR / "logs" / "nfd-master.log").open("w")
    master = subprocess.Popen(
        [str(nfd_bin() / "nfd-master"), f"-kubeconfig={KUBECONFIG}", f"-port={NFD_MASTER_PORT}",
         f"-config={tmp_path / 'absent.conf'}"],
        env=worker_env(NODE, NFD_NAMESPACE), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip

    def healthy() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{NFD_MASTER_PORT}/healthz", timeout=5) as response:
            return response.status == 200  # type: ignore[no-any-return]

    try:
        eventually(healthy, "nfd-master serving /healthz (see .run/cluster/logs/nfd-master.log)", 60)
        yield
    finally:
        master.terminate()
        master.wait(timeout=30)
        log.close()
        kubectl("delete", "namespace", NFD_NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        annotations = ("feature-labels", "master.version", "worker.version", "feature-annotations")
        kubectl("annotate", "node", NODE, *(f"nfd.node.kubernetes.io/{a}-" for a in annotations), check=False)
        kubectl("label", "node", NODE, f"{NFD_MARKER}-", check=False)
        kubectl("label", "node", NODE, f"{NFD_LABEL}=true", "--overwrite")  # as cluster_prepared left it
        run("rm", "-rf", NON_NEURON_ROOT)


def publish_features(root: Path, tmp_path: Path) -> None:
    """One discovery by the real nfd-worker with `root` as the host (its working directory, see build-nfd.sh),
    published as the node's NodeFeature object; nfd-master turns it into labels."""
    (tmp_path / "nfd-worker.conf").write_text("{}")
    result = subprocess.run(
        [str(nfd_bin() / "nfd-worker"), "-oneshot", f"-kubeconfig={KUBECONFIG}",
         f"-config={tmp_path / 'nfd-worker.conf'}", "-feature-sources=pci", "-label-sources=custom", "-owner-refs="],
        cwd=root, env=worker_env(NODE, NFD_NAMESPACE), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def nfd_master_has_handled_the_node() -> None:
    """Publishes a second NodeFeature of the node, whose only content is a label, and waits for
    nfd-master to set it, then to take it off again once the object is gone. nfd-master merges all
    the node's NodeFeatures, seen in order on one watch: with the marker set, the worker's NodeFeature
    published before it has been handled, and a label it did not bring then, it never will."""
    marker = {
        "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
        "kind": "NodeFeature",
        "metadata": {"name": "e2e-handled", "namespace": NFD_NAMESPACE,
                     "labels": {"nfd.node.kubernetes.io/node-name": NODE}},
        "spec": {"labels": {NFD_MARKER: "true"}},
    }  # fmt: skip
    kubectl("apply", "-f", "-", stdin=json.dumps(marker))

    def labels() -> dict[str, str]:
        return node()["metadata"].get("labels", {})  # type: ignore[no-any-return]

    eventually(lambda: labels().get(NFD_MARKER) == "true", f"nfd-master setting {NFD_MARKER}", 60)
    kubectl("delete", "nodefeature", "e2e-handled", "-n", NFD_NAMESPACE, "--wait=true")
    eventually(lambda: NFD_MARKER not in labels(), f"nfd-master taking {NFD_MARKER} off", 60)


def nfd_label() -> str | None:
    return node()["metadata"].get("labels", {}).get(NFD_LABEL)  # type: ignore[no-any-return]


def agent_pods() -> list[str]:
    out = kubectl("get", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name")
    return out.split()


def test_real_nfd_labels_the_node_from_its_simulated_pci_devices(
    kube_cluster: Cluster, nfd_master: None, tmp_path: Path
) -> None:
    """nfd-worker over the simulated trn1.32xlarge, nfd-master with the chart's NodeFeatureRule: the node gets
    the label from its PCI functions and the agents land on it; over a node whose PCI functions are not Neuron
    (Amazon's NIC and NVMe share the vendor id) the label goes, and the agents with it."""
    publish_features(SIM_ROOT, tmp_path)
    features = read("nodefeature", NODE, namespace=NFD_NAMESPACE)
    functions = [e["attributes"] for e in features["spec"]["features"]["instances"]["pci.device"]["elements"]]
    assert len([f for f in functions if (f["vendor"], f["device"]) == ("1d0f", "7164")]) == 16, functions
    nfd_master_has_handled_the_node()
    assert nfd_label() is None, "no rule yet, so no label"
    # placement.mode=nfd and the NodeFeatureRule (its API is served: the CRDs are installed)
    install(kube_cluster, values=CHART / "ci" / "nfd-values.yaml")
    eventually(lambda: nfd_label() == "true", f"{NFD_LABEL}=true from the simulated PCI functions")
    wait_daemonsets(kube_cluster, list(DAEMONSETS.values()))
    eventually(lambda: allocatable() == ("16", "32"), "the device plugin on the NFD-labelled node")

    sim("create-non-neuron", "--root", NON_NEURON_ROOT, "--force")
    publish_features(NON_NEURON_ROOT, tmp_path)
    eventually(lambda: nfd_label() is None, f"{NFD_LABEL} removed from a node without Neuron PCI functions")
    for name in DAEMONSETS.values():
        eventually(
            lambda name=name: read("ds", name, namespace=NAMESPACE)["status"].get(
                "desiredNumberScheduled"
            ) == 0,
            f"{name} wants no pod on the node",
        )  # fmt: skip
    eventually(lambda: agent_pods() == [], "no Neuron agent pod left on the node", 120)

    # the same node's Neuron functions back: labelled again, and the agents return
    publish_features(SIM_ROOT, tmp_path)
    eventually(lambda: nfd_label() == "true", f"{NFD_LABEL}=true again")
    wait_daemonsets(kube_cluster, list(DAEMONSETS.values()))
    install(kube_cluster, values=CHART / "ci" / "all-on-values.yaml")


def test_uninstall_leaves_no_object_behind() -> None:
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "300s")
    kinds = ",".join([
        "all", "configmaps", "secrets", "serviceaccounts", "roles", "rolebindings", "clusterroles",
        "clusterrolebindings", "servicemonitors", "podmonitors", "prometheusrules", "nodefeaturerules", "networkpolicies",
    ])  # fmt: skip
    # the DaemonSets' pods go by garbage collection, after helm's wait on the objects it deleted
    eventually(
        lambda: kubectl("get", kinds, "-A", "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name").strip() == "",
        "every object of the release gone",
        timeout=90,
    )
    assert kubectl("get", "pods", "-n", NAMESPACE, "-o", "name").strip() == "", "test pods or agents left behind"
    assert kubectl("get", "secrets", "-n", NAMESPACE, "-l", f"owner=helm,name={RELEASE}", "-o", "name").strip() == ""
    # the device plugin's resources leave with it
    eventually(lambda: allocatable() in (("0", "0"), (None, None)), "no Neuron resource advertised")


# --- every ci values file, through chart-testing ---------------------------------------------
#
# `ct install` installs the chart with each ci values file, waits for it (helm --wait), runs
# `helm test` and removes it. The chart's test pods are the checks each install must pass: the
# device plugin's capacity (16 neuron / 32 neuroncore on this trn1.32xlarge) and an allocation, the
# NeuronHealth condition, the exporter serving neuron_device_info, its ServiceMonitor or PodMonitor
# and PrometheusRule where the API server serves the Prometheus operator's API (this module installed
# its CRDs) or monitoring is forced, the DRA driver's slices, a pod placed by neuron-scheduler. One ct
# run serves both tests below: installing each file a second time with helm alone checked the same.


@dataclass(frozen=True)
class CtRun:
    returncode: int
    output: str

    def section(self, values: Path) -> str:
        """What ct printed for one values file: from its "Installing chart with values file" line to
        the next one's."""
        parts = re.split(r'(?m)^Installing chart with values file "charts/neuron-helm-chart/ci/([^"]+)"', self.output)
        sections = dict(zip(parts[1::2], parts[2::2], strict=True))
        assert values.name in sections, f"ct printed nothing for {values.name}"
        return sections[values.name]


@pytest.fixture(scope="module")
def ct_install() -> CtRun:
    """One `ct install` of the chart with every ci values file (`--upgrade` once main holds an earlier
    chart version to upgrade from)."""
    paths = chart_tools()
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    previous = run("git", "-C", REPO, "show", "origin/main:charts/neuron-helm-chart/Chart.yaml", check=False)
    upgrade = previous.returncode == 0 and yaml.safe_load(previous.stdout)["version"] != version
    result = run(
        paths["CT"], "install", "--config", REPO / "ct.yaml", "--charts", "charts/neuron-helm-chart",
        "--helm-extra-set-args", f"--set=simulation.enabled=true --set=simulation.hostRoot={SIM_ROOT}",
        *(["--upgrade"] if upgrade else []),
        timeout=1700, check=False,
    )  # fmt: skip
    return CtRun(result.returncode, result.stdout + result.stderr)


@pytest.mark.isolated
@pytest.mark.timeout(1800)
def test_ct_install_passes(ct_install: CtRun) -> None:
    """The real chart-testing install: every ci values file installed, waited on, helm-tested and removed."""
    assert ct_install.returncode == 0, ct_install.output[-6000:]
    for values in CI_VALUES:
        assert f'Installing chart with values file "charts/neuron-helm-chart/ci/{values.name}"' in ct_install.output
    assert "✔︎ neuron-helm-chart" in ct_install.output


def merged_values(values: Path) -> dict[str, Any]:
    """The chart's values with a ci values file over them, as Helm merges them."""

    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for key, value in over.items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out

    return merge(yaml.safe_load((CHART / "values.yaml").read_text()), yaml.safe_load(values.read_text()) or {})


@pytest.mark.isolated
@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_each_ci_values_file_installs_and_passes_its_checks(ct_install: CtRun, values: Path) -> None:
    """The install with this file rendered a DaemonSet for each enabled node agent and no other, and
    every check its components call for ran in `helm test` and succeeded."""
    merged = merged_values(values)
    enabled = {key for key in DAEMONSETS | OPTIONAL_DAEMONSETS if merged[key]["enabled"]}
    rendered = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values), "--set", "objectNames=release",
                    "--set", "simulation.enabled=true", "--set", f"simulation.hostRoot={SIM_ROOT}").stdout  # fmt: skip
    docs = [d for d in yaml_streams.load_all(rendered) if d]
    daemonsets = {d["metadata"]["name"] for d in docs if d["kind"] == "DaemonSet"}
    assert daemonsets == {(DAEMONSETS | OPTIONAL_DAEMONSETS)[key] for key in enabled}
    # the checks each test pod runs: `helm_test.py CHECK...` exits 0 only when every one it names passed
    test_pods = {
        d["metadata"]["name"].rsplit("-tests-", 1)[1]: d["spec"]["containers"][0]["command"][2:]
        for d in docs
        if d["kind"] == "Pod" and d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"
    }
    checks = {
        "devicePlugin": {"capacity", "allocation"},
        "draDriver": {"slices"},
        "nodeMetrics": {"metrics"}
        | ({"monitoring"} if merged["nodeMetrics"]["monitoring"]["kind"] != "none" else set()),
        "npd": {"health"},
    }
    wanted = set().union(*(checks[key] for key in enabled))
    assert wanted, f"{values.name} enables no node agent"
    if merged["remediation"]["enabled"]:  # the controller: it answers, one replica leads and it acts
        wanted.add("remediation")
    rendered_checks = {check for checks in test_pods.values() for check in checks}
    assert wanted <= rendered_checks, (
        f"{values.name}: the test pods run {sorted(rendered_checks)}, not {sorted(wanted)}"
    )
    ran = helm_test_suites(ct_install.section(values))
    assert set(test_pods) <= set(ran), f"{values.name}: helm test ran {sorted(ran)}, not all of {sorted(test_pods)}"
    assert all(phase == "Succeeded" for phase in ran.values()), f"{values.name}: {ran}"
