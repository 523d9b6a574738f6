"""The chart's DRA driver (`draDriver.enabled`): its DaemonSet, DeviceClasses, least-privilege RBAC
and the admission policy that keeps each node's driver to its own ResourceSlices (checked for real
against a kube-apiserver with pod-bound tokens), and the refusal to share nodes with the device
plugin. Rendered by the real Helm 4 (the helpers of test_chart.py)."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart import admission
from chart.test_chart import (
    CHART,
    MONITORING_API,
    by_component,
    container,
    daemonset,
    helm,
    of_kind,
    refusal,
    render,
    sets,
)
from prometheus_server import generator
from simcluster.controlplane import ControlPlane, private_control_plane

from neuron_common.kube import Api

pytestmark = pytest.mark.integration  # starts external processes: make integration

ON = sets(devicePlugin__enabled=False, draDriver__enabled=True)
RELEASE = "neuron-helm-chart"
DRIVER = f"{RELEASE}-dra-driver"


def test_off_by_default() -> None:
    docs = render()
    assert by_component(docs, "dra-driver") == []
    assert of_kind(docs, "DeviceClass") == []


def test_the_one_set_pair_switches_the_release_to_dra() -> None:
    docs = render(*ON)
    assert [d for d in of_kind(docs, "DaemonSet") if d["metadata"]["name"].endswith("device-plugin")] == []
    ds = daemonset(docs, "dra-driver")
    c = container(ds)
    assert c["image"] == "localhost/neuron-helm-chart/dra-driver:0.1.0"
    assert c["args"][:15] == [
        "--host-root=/host",
        "--host-dev-root=/",
        "--plugin-dir=/var/lib/kubelet/plugins/neuron.aws.com",
        "--registry-dir=/var/lib/kubelet/plugins_registry",
        "--cdi-spec-dir=/var/run/cdi",
        "--listen=0.0.0.0:9844",
        "--log-level=info",
        "--health-quiet-period=300",
        "--heartbeat-stale-after=300",  # firmwareHeartbeat.staleAfter, the same on every node agent
        "--publish-cores",
        "--no-cores-as-capacity",  # Helm's own Kubernetes version, before 1.36
        "--publish-groups",
        "--device-taints",
        "--taint-effect-until-reboot=NoSchedule",
        "--taint-effect-replace-instance=NoSchedule",
    ]
    # with the problem detector, its verdicts rather than the kernel log
    assert c["args"][15:] == [
        "--kmsg-path=none",
        "--verdict-dir=/var/lib/neuron-problem-detector/verdicts",
        "--ultraserver-labels",  # AWS's UltraServer labels on its node
    ]
    assert c["env"][0] == {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    pod = ds["spec"]["template"]["spec"]
    assert "automountServiceAccountToken" not in pod  # it needs its pod-bound token
    (sa,) = [s for s in of_kind(docs, "ServiceAccount") if s["metadata"]["name"] == DRIVER]
    assert "automountServiceAccountToken" not in sa


def test_the_driver_rolls_with_a_surge_and_names_its_sockets_after_its_pod() -> None:
    """The kubelet's seamless upgrade of DRA plugins (issue 58 item 3): by default the DaemonSet
    starts a node's new pod beside the old one (`maxSurge: 1`, none unavailable), and each pod, given
    its UID by the downward API, serves sockets of its own (the driver's parser reads the rendered
    args and environment), so the new pod registers without unlinking the old one's."""
    from neuron_dra_driver import config as driver_config

    ds = daemonset(render(*ON), "dra-driver")
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    c = container(ds)
    env = {e["name"]: e for e in c["env"]}
    assert env["NEURON_DRA_POD_UID"] == {
        "name": "NEURON_DRA_POD_UID",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}},
    }
    paths: list[tuple[str, str]] = []
    for uid in ("7c1d2a40-0000-4000-8000-00000000000a", "7c1d2a40-0000-4000-8000-00000000000b"):
        parsed = driver_config.parse(c["args"], env={"NODE_NAME": "node-a", "NEURON_DRA_POD_UID": uid})
        assert parsed.registration_socket.name == f"neuron.aws.com-{uid}-reg.sock"
        assert parsed.dra_socket.name == f"dra-{uid}.sock"
        paths.append((str(parsed.registration_socket), str(parsed.dra_socket)))
    assert len({p for pair in paths for p in pair}) == 4  # nothing shared but the checkpoint and its lock


def test_writable_host_paths_are_the_kubelets_plugin_dirs_and_cdi() -> None:
    ds = daemonset(render(*ON), "dra-driver")
    volumes = {v["name"]: v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v}
    rw = {volumes[m["name"]]: m["mountPath"] for m in container(ds)["volumeMounts"] if not m.get("readOnly")}
    # mounted at the host's own paths: the kubelet dials the socket path the driver registers
    assert rw == {
        "/var/lib/kubelet/plugins/neuron.aws.com": "/var/lib/kubelet/plugins/neuron.aws.com",
        "/var/lib/kubelet/plugins_registry": "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi": "/var/run/cdi",
    }
    assert volumes["host-sys"] == "/sys"
    assert volumes["host-dev"] == "/dev"


def test_a_custom_kubelet_root_moves_every_socket() -> None:
    c = container(daemonset(render(*ON, *sets(kubeletRootDir="/data/kubelet")), "dra-driver"))
    assert "--plugin-dir=/data/kubelet/plugins/neuron.aws.com" in c["args"]
    assert "--registry-dir=/data/kubelet/plugins_registry" in c["args"]


def test_device_classes() -> None:
    docs = render(*ON)
    classes = {d["metadata"]["name"]: d["spec"] for d in of_kind(docs, "DeviceClass")}
    assert set(classes) == {"neuron.aws.com", "neuroncore.aws.com", "neurongroup.aws.com"}
    group = " ".join(classes["neurongroup.aws.com"]["selectors"][0]["cel"]["expression"].split())
    assert group.endswith('.resourceType == "neuron_device_group"')
    device = " ".join(classes["neuron.aws.com"]["selectors"][0]["cel"]["expression"].split())
    core = " ".join(classes["neuroncore.aws.com"]["selectors"][0]["cel"]["expression"].split())
    # whole devices, and on UltraServer nodes the whole node (AWS's trn2u claims select it in this class)
    assert device == (
        'device.driver == "neuron.aws.com" && device.attributes["neuron.aws.com"].resourceType '
        'in ["neuron_device", "neuron_node"]'
    )
    assert core == (
        'device.driver == "neuron.aws.com" && device.attributes["neuron.aws.com"].resourceType == "neuron_core"'
    )
    # the device plugin's names by default, so its pods run unchanged on DRA nodes
    assert classes["neuron.aws.com"]["extendedResourceName"] == "aws.amazon.com/neuron"
    assert classes["neuroncore.aws.com"]["extendedResourceName"] == "aws.amazon.com/neuroncore"
    unmapped = render(
        *ON,
        *sets(
            draDriver__deviceClasses__deviceExtendedResourceName="",
            draDriver__deviceClasses__coreExtendedResourceName="",
        ),
    )
    assert all("extendedResourceName" not in d["spec"] for d in of_kind(unmapped, "DeviceClass"))
    renamed = render(*ON, *sets(draDriver__deviceClasses__deviceExtendedResourceName="example.com/accel"))
    (device_class,) = [d for d in of_kind(renamed, "DeviceClass") if d["metadata"]["name"] == "neuron.aws.com"]
    assert device_class["spec"]["extendedResourceName"] == "example.com/accel"


def test_without_cores_no_core_class_and_the_driver_publishes_none() -> None:
    docs = render(*ON, *sets(draDriver__publishCores=False))
    assert [d["metadata"]["name"] for d in of_kind(docs, "DeviceClass")] == ["neuron.aws.com"]
    assert "--no-publish-cores" in container(daemonset(docs, "dra-driver"))["args"]


def _notes(kube_version: str, *args: str, tmp: Path) -> str:
    """NOTES.txt as a cluster of `kube_version` gets it: `helm install --dry-run` takes no
    --kube-version and `helm template` leaves NOTES out, so a copy of the chart renders it inside
    a manifest of its own."""
    chart = tmp / "chart"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes_copy.tpl").write_text('{{- define "test.notes" -}}\n' + notes + "\n{{- end -}}\n")
    (chart / "templates" / "notes-as-rendered.yaml").write_text('notes: {{ include "test.notes" . | toJson }}\n')
    out = helm(
        "template", "x", str(chart), "--kube-version", kube_version, *args,
        "--show-only", "templates/notes-as-rendered.yaml",
    ).stdout  # fmt: skip
    return str(yaml.safe_load(out)["notes"])


@pytest.mark.parametrize(
    ("kube_version", "cores", "shares"),
    [("1.35.4", True, False), ("1.36.3", True, True), ("1.37.2", False, False), ("1.38.0", False, False)],
)
def test_auto_publishes_cores_where_the_measured_rule_keeps_them_and_says_why_where_not(
    kube_version: str, cores: bool, shares: bool, tmp_path: Path
) -> None:
    """Issue 58 item 2: the default `auto` follows kube-scheduler's allocator measured at 1,000 nodes
    (docs/benchmarks.md): from 1.37 on, where the best layout with cores reaches 0.31 of AWS's and
    whole devices alone 1.00, only devices; on 1.36 cores as capacity (0.52, cores as devices 0.002);
    before, cores as devices (the API server drops them, the driver falls back). Set, the value wins."""
    docs = render(*ON, "--kube-version", kube_version)
    classes = [d["metadata"]["name"] for d in of_kind(docs, "DeviceClass")]
    args = container(daemonset(docs, "dra-driver"))["args"]
    # the core class only for cores as devices: a core claim naming it on shares would get whole devices
    assert ("neuroncore.aws.com" in classes) is (cores and not shares)
    assert ("--publish-cores" if cores else "--no-publish-cores") in args
    assert ("--cores-as-capacity" if shares else "--no-cores-as-capacity") in args
    notes = _notes(kube_version, *ON, tmp=tmp_path)
    said = "Single NeuronCores are not published on Kubernetes"
    assert (said in notes) is not cores
    if not cores:
        assert all(s in notes for s in ("1.00", "0.31", "--set draDriver.publishCores=true")), notes
        assert "aws.amazon.com/neuroncore" in notes  # the pods that would wait
    assert ("Cores are published as a capacity of each device" in notes) is shares
    if shares:
        assert all(s in notes for s in ("0.52", "0.002", "capacity: {requests: {cores:", "coresAsCapacity=false")), (
            notes
        )
    for value, on in ((True, True), (False, False)):
        pinned = render(
            *ON, "--kube-version", kube_version, *sets(draDriver__publishCores=value, draDriver__coresAsCapacity=False)
        )
        assert ("neuroncore.aws.com" in [d["metadata"]["name"] for d in of_kind(pinned, "DeviceClass")]) is on
        assert ("--publish-cores" if on else "--no-publish-cores") in container(daemonset(pinned, "dra-driver"))["args"]
    assert said not in _notes(kube_version, *ON, *sets(draDriver__publishCores=False), tmp=tmp_path / "off")


def test_cores_as_capacity_renders_the_flag_and_only_the_device_class() -> None:
    docs = render(*ON, *sets(draDriver__publishCores=True, draDriver__coresAsCapacity=True))
    assert [d["metadata"]["name"] for d in of_kind(docs, "DeviceClass")] == ["neuron.aws.com"]
    args = container(daemonset(docs, "dra-driver"))["args"]
    assert "--publish-cores" in args
    assert "--cores-as-capacity" in args


def test_cores_as_capacity_without_cores_is_refused_naming_both_values() -> None:
    failed = refusal(*ON, *sets(draDriver__publishCores=False, draDriver__coresAsCapacity=True))
    assert "draDriver.coresAsCapacity=true" in failed
    assert "draDriver.publishCores resolves to false" in failed
    # auto never contradicts: without cores it is off
    docs = render(*ON, "--kube-version", "1.37.2", *sets(draDriver__coresAsCapacity="auto"))
    assert "--no-cores-as-capacity" in container(daemonset(docs, "dra-driver"))["args"]


def test_rbac_is_least_privilege() -> None:
    docs = render(*ON)
    (role,) = [r for r in of_kind(docs, "ClusterRole") if r["metadata"]["name"] == DRIVER]
    assert role["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["list", "watch", "create", "patch", "delete"],
        },
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},  # its Node's placement labels
    ]
    assert [r for r in of_kind(docs, "Role") if DRIVER in r["metadata"]["name"]] == []


def test_refuses_the_device_plugin_on_the_same_nodes() -> None:
    message = refusal(*sets(draDriver__enabled=True))
    assert "devicePlugin.enabled and draDriver.enabled would both run on the same Neuron nodes" in message
    assert "--set devicePlugin.enabled=false,draDriver.enabled=true" in message
    same = sets(draDriver__enabled=True, draDriver__nodeSelector={"a": "x"}, devicePlugin__nodeSelector={"a": "x"})
    assert "same Neuron nodes" in refusal(*same)
    only_one_side = sets(draDriver__enabled=True, draDriver__nodeSelector={"a": "dra"})
    assert "same Neuron nodes" in refusal(*only_one_side)


def test_both_on_disjoint_nodes_is_allowed() -> None:
    docs = render(
        *sets(
            draDriver__enabled=True,
            draDriver__nodeSelector={"neuron.aws.com/allocator": "dra"},
            devicePlugin__nodeSelector={"neuron.aws.com/allocator": "device-plugin"},
        )
    )
    assert daemonset(docs, "dra-driver")["spec"]["template"]["spec"]["nodeSelector"] == {
        "neuron.aws.com/allocator": "dra"
    }
    assert daemonset(docs, "device-plugin")["spec"]["template"]["spec"]["nodeSelector"] == {
        "neuron.aws.com/allocator": "device-plugin"
    }


def test_the_dra_driver_alone_is_a_release() -> None:
    docs = render(*ON, *sets(nodeMetrics__enabled=False, npd__enabled=False))
    assert [d["metadata"]["name"] for d in of_kind(docs, "DaemonSet")] == [DRIVER]


def test_the_drivers_monitor_feeds_the_dra_dashboard() -> None:
    def ours(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
        return [d for d in of_kind(docs, kind) if d["metadata"]["name"] == DRIVER]

    assert ours(render(*ON), "ServiceMonitor") == [], "like the exporter's: only where the monitoring API is served"
    assert ours(render(*ON, *MONITORING_API, *sets(draDriver__monitoring__enabled=False)), "ServiceMonitor") == []
    off = render(*ON, *MONITORING_API, *sets(nodeMetrics__monitoring__kind="none"))
    assert ours(off, "ServiceMonitor") == ours(off, "PodMonitor") == ours(off, "Service") == []
    assert len(ours(render(*ON, *sets(nodeMetrics__monitoring__force=True)), "ServiceMonitor")) == 1
    assert ours(render(*MONITORING_API), "ServiceMonitor") == [], "no driver, no monitor"

    docs = render(*ON, *MONITORING_API, *sets(nodeMetrics__monitoring__additionalLabels={"release": "kps"}))
    (sm,) = ours(docs, "ServiceMonitor")
    (service,) = ours(docs, "Service")
    pod = daemonset(docs, "dra-driver")["spec"]["template"]
    assert sm["metadata"]["labels"]["release"] == "kps"
    assert sm["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["clusterIP"] == "None"  # every driver pod, never a load-balanced one
    (endpoint,) = sm["spec"]["endpoints"]
    (port,) = service["spec"]["ports"]
    assert endpoint["port"] == port["name"]
    assert port["targetPort"] in {p["name"] for p in container(daemonset(docs, "dra-driver"))["ports"]}
    assert endpoint["path"] == "/metrics"
    # the node the board groups by, and the job the dashboards' test scrapes the driver as
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in endpoint["relabelings"]
    assert {"targetLabel": "job", "replacement": generator().DRA_DRIVER} in endpoint["relabelings"]

    pods = render(*ON, *MONITORING_API, *sets(nodeMetrics__monitoring__kind="PodMonitor"))
    (pm,) = ours(pods, "PodMonitor")
    assert ours(pods, "Service") == [], "a PodMonitor needs no Service"
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in container(daemonset(pods, "dra-driver"))["ports"]}
    assert (
        pm["spec"]["selector"]["matchLabels"].items()
        <= daemonset(pods, "dra-driver")["spec"]["template"]["metadata"]["labels"].items()
    )


# --- the admission policy, for real ----------------------------------------------------------


@pytest.fixture(scope="module")
def apiserver() -> Iterator[ControlPlane]:
    with private_control_plane("dra-chart-cp-") as cp:
        yield cp


def _slice(node: str, driver: str = "neuron.aws.com") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-0"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "neurondevice0"}],
        },
    }


async def _admission(cp: ControlPlane) -> dict[str, str]:
    """Installs the chart's RBAC and policy, makes a pod-bound token for a driver on node-a, and
    tries the writes a driver may and may not make; the outcome of each."""
    admin = Api(cp.server, ssl_context=cp.credentials.ssl_context())
    docs = render(*ON)
    wanted = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    paths = {
        "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "ValidatingAdmissionPolicy": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
        "ValidatingAdmissionPolicyBinding": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
    }
    try:
        for doc in docs:
            if doc["kind"] in wanted and doc["metadata"]["name"].startswith(DRIVER):
                await admin.create(paths[doc["kind"]], doc)
        await admin.create(
            "/api/v1/namespaces/kube-system/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": DRIVER}},
        )
        for node in ("node-a", "node-b"):
            await admin.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        pod = await admin.create(
            "/api/v1/namespaces/kube-system/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "driver-a"},
                "spec": {
                    "nodeName": "node-a",
                    "serviceAccountName": DRIVER,
                    "containers": [{"name": "c", "image": "x"}],
                },
            },
        )
        token = await admin.create(
            f"/api/v1/namespaces/kube-system/serviceaccounts/{DRIVER}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "expirationSeconds": 600,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": "driver-a",
                        "uid": pod["metadata"]["uid"],
                    },
                },
            },
        )
        bearer = token["status"]["token"]
        unbound = await admin.create(
            f"/api/v1/namespaces/kube-system/serviceaccounts/{DRIVER}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}},
        )
        context = ssl.create_default_context(cafile=str(cp.credentials.ca))
        driver = Api(cp.server, ssl_context=context, authorization=lambda: f"Bearer {bearer}")
        stranger = Api(cp.server, ssl_context=context, authorization=lambda: f"Bearer {unbound['status']['token']}")
        # the policy takes a moment to be enforced after it is created
        await _until_enforced(driver)
        outcomes: dict[str, str] = {}
        slices = "/apis/resource.k8s.io/v1/resourceslices"
        await admin.create(slices, _slice("node-b"))
        attempts = {
            "own slice": driver.apply(f"{slices}/node-a-neuron.aws.com-0", _slice("node-a"), "neuron-dra-driver"),
            "own slice delete": driver.delete(f"{slices}/node-a-neuron.aws.com-0"),
            "another node's slice": driver.apply(
                f"{slices}/node-b-neuron.aws.com-1",
                _slice("node-b") | {"metadata": {"name": "node-b-neuron.aws.com-1"}},
                "x",
            ),
            "another node's slice delete": driver.delete(f"{slices}/node-b-neuron.aws.com-0"),
            "another driver": driver.apply(
                f"{slices}/node-a-gpu.example.com-0", _slice("node-a", "gpu.example.com"), "neuron-dra-driver"
            ),
            "a token bound to no pod": stranger.apply(
                f"{slices}/node-a-neuron.aws.com-0", _slice("node-a"), "neuron-dra-driver"
            ),
            "read a claim": driver.get("/apis/resource.k8s.io/v1/namespaces/kube-system/resourceclaims/none"),
            "write a claim": driver.create(
                "/apis/resource.k8s.io/v1/namespaces/kube-system/resourceclaims",
                {"metadata": {"name": "x"}, "spec": {}},
            ),
        }
        outcomes.update(await admission.outcomes(attempts))
        await driver.close()
        await stranger.close()
        return outcomes
    finally:
        await admin.close()


async def _until_enforced(driver: Api) -> None:
    slices = "/apis/resource.k8s.io/v1/resourceslices"
    probe = _slice("node-b") | {"metadata": {"name": "probe"}}
    await admission.until_enforced(lambda: driver.apply(f"{slices}/probe", probe, "probe"), "may write only")


def test_a_driver_writes_only_its_own_nodes_slices(apiserver: ControlPlane) -> None:
    outcomes = asyncio.run(_admission(apiserver))
    assert outcomes["own slice"] == "allowed"
    assert outcomes["own slice delete"] == "allowed"
    assert outcomes["another node's slice"].startswith("403")
    assert "may write only neuron.aws.com ResourceSlices of node node-a" in outcomes["another node's slice"]
    assert outcomes["another node's slice delete"].startswith("403")
    assert outcomes["another driver"].startswith("403")
    assert outcomes["a token bound to no pod"].startswith("403")
    assert "token bound to its pod" in outcomes["a token bound to no pod"]
    assert outcomes["read a claim"].startswith("404")  # allowed to read; there is none
    assert outcomes["write a claim"].startswith("403")  # RBAC: claims are read-only


def test_helm_test_checks_the_published_slices() -> None:
    docs = render(*ON)
    (pod,) = [p for p in of_kind(docs, "Pod") if p["metadata"]["name"].endswith("-tests-components")]
    (c,) = pod["spec"]["containers"]
    assert "slices" in c["command"][2:]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["DRA_DRIVER_SELECTOR"].endswith("app.kubernetes.io/component=dra-driver")
    assert env["DRA_DRIVER_NAMESPACE"] == daemonset(docs, "dra-driver")["metadata"]["namespace"]
    assert env["PUBLISH_CORES"] == "true"
    (role,) = [r for r in of_kind(docs, "ClusterRole") if r["metadata"]["name"] == f"{RELEASE}-tests"]
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]} in role["rules"]
    # without the DRA driver, neither the check nor the permission
    plain = render()
    (pod,) = [p for p in of_kind(plain, "Pod") if p["metadata"]["name"].endswith("-tests-components")]
    assert "slices" not in pod["spec"]["containers"][0]["command"]
    assert "DRA_DRIVER_SELECTOR" not in {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    (role,) = [r for r in of_kind(plain, "ClusterRole") if r["metadata"]["name"] == f"{RELEASE}-tests"]
    assert all("resource.k8s.io" not in rule["apiGroups"] for rule in role["rules"])


def test_device_taints_are_values_and_a_wrong_effect_is_refused() -> None:
    off = container(daemonset(render(*ON, *sets(draDriver__deviceTaints__enabled=False)), "dra-driver"))
    assert "--no-device-taints" in off["args"]
    evict = render(*ON, *sets(draDriver__deviceTaints__replaceInstance="NoExecute"))
    assert "--taint-effect-replace-instance=NoExecute" in container(daemonset(evict, "dra-driver"))["args"]
    # the driver's own flag parser accepts every value the chart may render
    from neuron_dra_driver import config as driver_config

    for effect in ("NoSchedule", "NoExecute"):
        driver_config.parse(["--node-name", "n", f"--taint-effect-until-reboot={effect}"], env={})
    assert "untilReboot" in refusal(*ON, *sets(draDriver__deviceTaints__untilReboot="Evict"))
