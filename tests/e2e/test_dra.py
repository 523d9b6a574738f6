"""End to end: the chart's DRA driver (`draDriver.enabled`) on the real single-node cluster (make
cluster-up) with the real kube-scheduler, controller manager, kubelet and a CDI-enabled containerd,
over a simulated trn1.32xlarge and then an inf2.48xlarge.

A claim for 4 connected devices gets a torus row and the container sees exactly those /dev/neuronN;
a claim no node can satisfy stays Pending with the scheduler's reason; a restarted driver keeps the
running pod's devices and unprepares them afterwards; a claim pod created during the driver's rollout
starts without a failed prepare; a device error taints the device and its
cores in the node's ResourceSlices (a tolerating claim still gets it) and a reboot untaints them; on inf2 a claim for 3 cores gets cores on two connected devices.
The tests run in file order and share one release (the device plugin off: one `--set` pair).

Runs with `-m e2e` (make cluster-test) against $KUBECONFIG, which defaults to the test cluster's. It
needs the images `make images` builds (the DRA driver's among them) and a containerd with CDI on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
import yaml_streams
from cluster_access import (
    CTR,
    NODE,
    REPO,
    SHOW_DEVICES,
    SIM_ROOT,
    WORKLOAD_PYTHON,
    eventually,
    exporter_metrics,
    helm,
    kubectl,
    pod_phase,
    read,
    run,
    sim,
    workload_pod,
)

from neuron_driver.ultraserver import read_ultraserver
from neuron_model.ultraserver import LABEL_PREFIX, MODE_LABEL, node_id_label, node_labels, server_id_label

CHART = REPO / "charts" / "neuron-helm-chart"
RELEASE = "neuron-helm-chart"
NAMESPACE = "neuron-e2e-dra"
WORKLOADS = "neuron-e2e-dra-workloads"
VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
WORKLOAD_IMAGE = f"localhost/neuron-helm-chart/dra-driver:{VERSION}"  # any project image: it has Python
DRIVER = f"{RELEASE}-dra-driver"
INF2_ROOT = SIM_ROOT.parent / "e2e-dra-inf2"
TRN2_ROOT = SIM_ROOT.parent / "e2e-dra-trn2"
TRN2U_ROOT = SIM_ROOT.parent / "e2e-dra-trn2u"
ULTRASERVER = "00c0ffee12345678"
CDI_DIR = Path("/var/run/cdi")
GROUP4 = "resource.aws.com/devicegroup4_id"

# isolated: make cluster-test runs this module on its second cluster, beside the rest of the e2e suite
pytestmark = [pytest.mark.e2e, pytest.mark.isolated, pytest.mark.timeout(900)]


# --- helpers ---------------------------------------------------------------------------------


def install(*args: str) -> None:
    helm(
        "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
        "--set", "devicePlugin.enabled=false,draDriver.enabled=true",
        # every object <release>-<component> in NAMESPACE (the problem detector's too), which these tests name
        "--set", "objectNames=release",
        "--set", "simulation.enabled=true", "--set", f"simulation.hostRoot={SIM_ROOT}",
        # cores as devices, as on 1.37 with cores on: the features these tests take (arcs, core claims and
        # their extended resource, taints on cores); the 1.36 default, cores as capacity, has its own test
        "--set", "draDriver.coresAsCapacity=false",
        *args, "--wait", "--timeout", "300s",
    )  # fmt: skip


def published() -> dict[str, dict[str, Any]]:
    """The node's published devices by name, from the highest pool generation only."""
    items = read("resourceslices", field_selector=f"spec.nodeName={NODE}")["items"]
    newest = max((s["spec"]["pool"]["generation"] for s in items), default=0)
    return {
        d["name"]: d
        for s in items
        if s["spec"]["driver"] == "neuron.aws.com" and s["spec"]["pool"]["generation"] == newest
        for d in s["spec"].get("devices") or []
    }


def counts() -> tuple[int, int]:
    names = published()
    return sum(n.startswith("neurondevice") for n in names), sum(n.startswith("neuroncore") for n in names)


def claim_template(
    name: str, device_class: str, count: int, match: str | None, config: dict[str, Any] | None = None
) -> dict[str, Any]:
    request: dict[str, Any] = {"name": "neuron", "exactly": {"deviceClassName": device_class, "count": count}}
    devices: dict[str, Any] = {"requests": [request]}
    if match:
        devices["constraints"] = [{"requests": ["neuron"], "matchAttribute": match}]
    if config:
        devices["config"] = [{"opaque": {"driver": "neuron.aws.com", "parameters": config}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": WORKLOADS},
        "spec": {"spec": {"devices": devices}},
    }


def create_pod(name: str, template: str | None, restart: str = "Never", limits: dict[str, int] | None = None) -> None:
    """A workload that prints what it was given; through a claim from `template`, or, with
    `limits`, through the device plugin's extended resource names (no claim in the pod)."""
    resources: dict[str, Any] = {"claims": [{"name": "neuron"}]} if template else {"limits": limits or {}}
    claims = [{"name": "neuron", "resourceClaimTemplateName": template}] if template else []
    manifest = workload_pod(name, WORKLOADS, WORKLOAD_IMAGE, resources, restartPolicy=restart, resourceClaims=claims)
    kubectl("apply", "-f", "-", stdin=manifest)


def create_template(
    name: str, device_class: str, count: int, match: str | None, config: dict[str, Any] | None = None
) -> None:
    kubectl("apply", "-f", "-", stdin=json.dumps(claim_template(name, device_class, count, match, config)))


def pod(name: str) -> dict[str, Any]:
    return read("pod", name, namespace=WORKLOADS)


def shown(name: str) -> dict[str, list[str]]:
    """What a running workload printed: its /dev/neuronN and NEURON_RT_VISIBLE_CORES."""
    seen: dict[str, list[str]] = {}

    def logged() -> bool:
        seen.clear()
        for line in kubectl("logs", "-n", WORKLOADS, name).splitlines():
            key, _, value = line.partition("=")
            seen.setdefault(key, []).append(value)
        return "cores" in seen

    eventually(logged, f"pod {name} printed its devices")
    return seen


def seen_devices(name: str) -> list[int]:
    return sorted(int(d.removeprefix("/dev/neuron")) for d in shown(name).get("device", []))


def allocated(pod_name: str) -> list[str]:
    """The device names the scheduler allocated to the pod's claim."""
    (status,) = pod(pod_name)["status"]["resourceClaimStatuses"]
    claim = read("resourceclaim", status["resourceClaimName"], namespace=WORKLOADS)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["driver"] for r in results} == {"neuron.aws.com"}
    assert {r["pool"] for r in results} == {NODE}
    return sorted(r["device"] for r in results)


def claim_uid(pod_name: str) -> str:
    (status,) = pod(pod_name)["status"]["resourceClaimStatuses"]
    claim = read("resourceclaim", status["resourceClaimName"], namespace=WORKLOADS)
    return str(claim["metadata"]["uid"])


def index(name: str) -> int:
    return int(name.removeprefix("neurondevice").removeprefix("neuroncore"))


def unschedulable_reason(name: str) -> str:
    for condition in pod(name)["status"].get("conditions", []):
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            return str(condition.get("message", ""))
    return ""


def delete_pods(*names: str) -> None:
    kubectl("delete", "pod", "-n", WORKLOADS, *names, "--ignore-not-found", "--wait=true", "--timeout=60s")


def restart(component: str = "dra-driver") -> None:
    selector = f"app.kubernetes.io/component={component}"
    before = kubectl("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "name").split()
    kubectl("delete", "-n", NAMESPACE, *before, "--wait=true", "--timeout=60s")
    kubectl("rollout", "status", "-n", NAMESPACE, f"daemonset/{RELEASE}-{component}", "--timeout=180s")


def simulated_reboot() -> None:
    """A reboot as the node agents see it (as test_scheduler does): a new boot id, an empty kernel log,
    the detector (whose verdicts the driver takes) and the driver restarted."""
    sim("inject", "--root", SIM_ROOT, "reboot")
    for component in ("problem-detector", "dra-driver"):
        restart(component)


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def release() -> Iterator[None]:
    """The chart with the DRA driver instead of the device plugin, a clean simulated node, the
    workloads' namespace; all removed afterwards."""
    sim("inject", "--root", SIM_ROOT, "reboot")
    kubectl("create", "namespace", WORKLOADS, check=False)
    install()
    eventually(lambda: counts() == (16, 32), "16 devices and 32 cores published", timeout=180)
    yield
    kubectl("delete", "namespace", WORKLOADS, "--ignore-not-found", "--wait=true", "--timeout=120s", check=False)
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found", "--wait", check=False)
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
    kubectl("delete", "resourceslices", "--field-selector", f"spec.nodeName={NODE}", "--ignore-not-found", check=False)
    sim("inject", "--root", SIM_ROOT, "reboot")


# --- the tests, in order ----------------------------------------------------------------------


def test_the_slices_carry_the_torus_groups_and_the_driver_is_ready() -> None:
    devices = published()
    assert devices["neurondevice5"]["attributes"][GROUP4] == {"string": "4"}  # a string, as AWS publishes it
    assert devices["neurondevice5"]["attributes"]["instanceType"] == {"string": "trn1.32xlarge"}
    assert devices["neuroncore11"]["attributes"]["deviceId"] == {"int": 5}
    kubectl("rollout", "status", "-n", NAMESPACE, f"daemonset/{DRIVER}", "--timeout=60s")
    result = helm("test", RELEASE, "-n", NAMESPACE, "--logs", "--timeout", "300s")
    assert "(trn1.32xlarge) publishes 16 devices and 32 cores for DRA" in result.stdout


def test_the_nodes_ec2_placement_labels_become_awss_attributes() -> None:
    """The driver reads its own Node (the chart's RBAC allows get on nodes) for the labels EKS sets
    and publishes them as AWS's driver does (following a change is the driver's own integration test)."""
    label = "topology.k8s.aws/network-node-layer-3"
    try:
        kubectl("label", "node", NODE, f"{label}=nn-e2e", "--overwrite")
        # the driver reads the Node every minute: restart it to read it now
        kubectl("rollout", "restart", "daemonset", DRIVER, "-n", NAMESPACE)
        kubectl("rollout", "status", "daemonset", DRIVER, "-n", NAMESPACE, "--timeout=180s")
        eventually(
            lambda: published()["neurondevice0"]["attributes"].get("networkNodeLayer3") == {"string": "nn-e2e"},
            "networkNodeLayer3 in the slices",
        )
        assert published()["neuroncore1"]["attributes"]["networkNodeLayer3"] == {"string": "nn-e2e"}
    finally:
        kubectl("label", "node", NODE, f"{label}-")


def test_four_connected_devices_and_the_container_sees_exactly_them() -> None:
    create_template("four-connected", "neuron.aws.com", 4, GROUP4)
    create_pod("four", "four-connected")
    eventually(lambda: pod_phase("four", WORKLOADS) == "Running", "the 4-device pod running", timeout=180)
    devices = [index(d) for d in allocated("four")]
    assert len(devices) == 4
    assert len({d // 4 for d in devices}) == 1, f"{devices} is not one torus row"
    assert seen_devices("four") == sorted(devices)
    cores = sorted(int(c) for c in shown("four")["cores"][0].split(","))
    assert cores == [c for d in sorted(devices) for c in (2 * d, 2 * d + 1)]
    assert (CDI_DIR / f"neuron.aws.com_claim-{claim_uid('four')}.json").exists()


def test_the_exporter_labels_dra_held_devices_with_their_pod_and_claim() -> None:
    (status,) = pod("four")["status"]["resourceClaimStatuses"]
    claim = status["resourceClaimName"]
    devices = [index(d) for d in allocated("four")]

    def attributed() -> set[int]:
        held = set()
        for line in exporter_metrics(NAMESPACE).splitlines():
            if line.startswith("neuron_core_allocation_info{") and 'pod="four"' in line:
                assert f'namespace="{WORKLOADS}"' in line, line
                assert f'claim="{claim}"' in line, line
                held.add(int(line.split('core="', 1)[1].split('"', 1)[0]))
        return held

    eventually(lambda: attributed() == {c for d in devices for c in (2 * d, 2 * d + 1)}, "the pod's cores attributed")


def test_an_unsatisfiable_claim_stays_pending_with_the_schedulers_reason() -> None:
    # eight devices with one devicegroup4 id: no group of four has eight members
    create_template("eight-in-a-row", "neuron.aws.com", 8, GROUP4)
    create_pod("eight", "eight-in-a-row")
    eventually(lambda: "claim" in unschedulable_reason("eight"), "eight unschedulable, naming its claim", timeout=120)
    reason = unschedulable_reason("eight")
    assert "cannot allocate all claims" in reason, reason
    assert pod_phase("eight", WORKLOADS) == "Pending"
    assert not pod("eight")["spec"].get("nodeName")
    delete_pods("eight")


def test_restarting_the_driver_keeps_the_running_pods_devices() -> None:
    uid = claim_uid("four")
    before = seen_devices("four")
    restart()
    assert pod_phase("four", WORKLOADS) == "Running"
    assert pod("four")["status"]["containerStatuses"][0]["restartCount"] == 0
    assert seen_devices("four") == before
    # the new driver process still knows the claim: deleting the pod unprepares it
    delete_pods("four")
    eventually(lambda: not (CDI_DIR / f"neuron.aws.com_claim-{uid}.json").exists(), "the claim's CDI spec removed")
    # and it prepares new claims
    create_pod("four-again", "four-connected")
    eventually(lambda: pod_phase("four-again", WORKLOADS) == "Running", "a new 4-device pod running", timeout=180)
    delete_pods("four-again")


def driver_pods() -> dict[str, dict[str, Any]]:
    """The driver's pods on the node by UID: each one's phase and whether it is Ready and terminating."""
    items = read("pods", namespace=NAMESPACE, selector="app.kubernetes.io/component=dra-driver")["items"]
    return {
        p["metadata"]["uid"]: {
            "ready": any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])),
            "terminating": "deletionTimestamp" in p["metadata"],
        }
        for p in items
        if p["spec"].get("nodeName") == NODE
    }


def test_a_claim_pod_created_during_the_drivers_rollout_starts_without_a_failed_prepare() -> None:
    """The kubelet's seamless upgrade of DRA plugins (issue 58 item 3): the chart rolls the driver
    with `maxSurge: 1`, and each pod's sockets carry its UID, so the node's new driver pod registers
    beside the old one, which stops only once the new one is Ready. A claim pod created right after
    `kubectl rollout restart` is prepared by one of them: it runs, and the kubelet never reports a
    failed prepare (`FailedPrepareDynamicResources`, "... is not registered") for it."""
    strategy = read("daemonset", DRIVER, namespace=NAMESPACE)["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}, strategy
    (old,) = driver_pods()
    kubectl("rollout", "restart", "daemonset", DRIVER, "-n", NAMESPACE)
    create_template("during-rollout", "neuron.aws.com", 1, None)
    create_pod("rolled", "during-rollout")
    overlap: list[set[str]] = []  # the node's driver pods seen at once, the old one among them

    def rolled_and_running() -> bool:
        pods = driver_pods()
        if len(pods) > 1 and old in pods:
            overlap.append(set(pods))
        done = old not in pods and len(pods) == 1 and all(p["ready"] for p in pods.values())
        return done and pod_phase("rolled", WORKLOADS) == "Running"

    eventually(rolled_and_running, "the rollout done and the claim pod running", timeout=240)
    kubectl("rollout", "status", "-n", NAMESPACE, f"daemonset/{DRIVER}", "--timeout=60s")
    assert overlap, "the new driver pod never ran beside the old one: the DaemonSet did not surge"
    events = read("events", namespace=WORKLOADS, field_selector="involvedObject.name=rolled")["items"]
    failed = [f"{e['reason']}: {e.get('message', '')}" for e in events if "Prepare" in e.get("reason", "")]
    assert failed == [], failed
    assert len(allocated("rolled")) == 1
    delete_pods("rolled")


def test_a_reboot_that_empties_the_cdi_directory_loses_no_pods_devices() -> None:
    """/var/run/cdi is a tmpfs: after a reboot the driver restarts and the kubelet restarts the
    pod's container, naming the claim's CDI device; it must run again with the same devices."""
    create_pod("survivor", "four-connected", restart="Always")
    eventually(lambda: pod_phase("survivor", WORKLOADS) == "Running", "the survivor pod running", timeout=180)
    before = seen_devices("survivor")
    spec = CDI_DIR / f"neuron.aws.com_claim-{claim_uid('survivor')}.json"
    assert spec.exists()
    spec.unlink()  # the reboot, as the runtime's CDI directory sees it
    restart()
    assert spec.exists(), "the restarted driver did not write the checkpointed claim's CDI spec again"
    container = pod("survivor")["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    run(*CTR, "tasks", "kill", "-s", "SIGKILL", container)

    def restarted() -> bool:
        status = pod("survivor")["status"]["containerStatuses"][0]
        return status["restartCount"] >= 1 and "running" in status["state"]

    eventually(restarted, "the survivor's container restarted and running", timeout=180)
    assert seen_devices("survivor") == before
    delete_pods("survivor")


def test_the_device_plugins_resource_names_run_unchanged_on_a_dra_node() -> None:
    """DeviceClasses map aws.amazon.com/neuron and aws.amazon.com/neuroncore (on by default): a
    pod written for the device plugin gets its devices from DRA, with no claim of its own."""
    create_pod("legacy-devices", None, limits={"aws.amazon.com/neuron": 2})
    create_pod("legacy-cores", None, limits={"aws.amazon.com/neuroncore": 3})
    for name in ("legacy-devices", "legacy-cores"):
        eventually(lambda name=name: pod_phase(name, WORKLOADS) == "Running", f"{name} running", timeout=180)  # type: ignore[misc]
    devices = seen_devices("legacy-devices")
    assert len(devices) == 2
    assert sorted(int(c) for c in shown("legacy-devices")["cores"][0].split(",")) == [
        c for d in devices for c in (2 * d, 2 * d + 1)
    ]
    cores = sorted(int(c) for c in shown("legacy-cores")["cores"][0].split(","))
    assert len(cores) == 3
    assert seen_devices("legacy-cores") == sorted({c // 2 for c in cores})
    # the scheduler made the claims itself (the pods name none)
    for name in ("legacy-devices", "legacy-cores"):
        assert pod(name)["status"].get("extendedResourceClaimStatus"), f"{name} has no extended-resource claim"
    delete_pods("legacy-devices", "legacy-cores")


def tainted() -> dict[str, list[dict[str, str]]]:
    return {name: d["taints"] for name, d in published().items() if d.get("taints")}


def pinned_template(name: str, device: int, tolerate: bool) -> dict[str, Any]:
    """A claim for exactly device `device` (an admin's diagnostic pod would ask so), tolerating
    the unhealthy taint or not."""
    request: dict[str, Any] = {
        "deviceClassName": "neuron.aws.com",
        "selectors": [{"cel": {"expression": f'device.attributes["neuron.aws.com"].deviceId == {device}'}}],
    }
    if tolerate:
        request["tolerations"] = [{"key": "neuron.aws.com/unhealthy", "operator": "Exists"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": WORKLOADS},
        "spec": {"spec": {"devices": {"requests": [{"name": "neuron", "exactly": request}]}}},
    }


def test_a_device_error_taints_it_and_its_cores_and_recovery_untaints() -> None:
    sim("inject", "--root", SIM_ROOT, "fault", "--kind", "NC_UNCORRECTABLE_ERROR", "--device", "3")
    eventually(
        lambda: set(tainted()) == {"neurondevice3", "neuroncore6", "neuroncore7"},
        "device 3 and its two cores tainted",
        timeout=120,
    )
    assert counts() == (16, 32)  # kept in the slices: the scheduler can say why a claim waits
    (taint,) = tainted()["neuroncore7"]
    assert (taint["key"], taint["value"], taint["effect"]) == (
        "neuron.aws.com/unhealthy",
        "NC_UNCORRECTABLE_ERROR",
        "NoSchedule",
    )
    # row 0 is broken: four connected devices now come from another row
    create_pod("four-after-error", "four-connected")
    eventually(
        lambda: pod_phase("four-after-error", WORKLOADS) == "Running", "a 4-device pod after the error", timeout=180
    )
    devices = [index(d) for d in allocated("four-after-error")]
    assert 3 not in devices
    assert len({d // 4 for d in devices}) == 1
    # a claim for device 3 itself waits; one that tolerates the taint (a diagnostic pod) gets it
    for name, tolerate in (("device3", False), ("device3-diagnostic", True)):
        kubectl("apply", "-f", "-", stdin=json.dumps(pinned_template(name, 3, tolerate)))
        create_pod(name, name)
    eventually(lambda: pod_phase("device3-diagnostic", WORKLOADS) == "Running", "the tolerating pod", timeout=180)
    assert allocated("device3-diagnostic") == ["neurondevice3"]
    assert seen_devices("device3-diagnostic") == [3]

    # the driver's health stream reaches the pod's status (KEP-4680, ResourceHealthStatus); the
    # kubelet names the resource by its first CDI device (the claim's), else driver/pool/device
    uid = claim_uid("device3-diagnostic")

    def reported_unhealthy() -> bool:
        statuses = pod("device3-diagnostic")["status"]["containerStatuses"][0].get("allocatedResourcesStatus") or []
        return any(
            r.get("health") == "Unhealthy"
            and (
                r.get("resourceID") == f"neuron.aws.com/claim={uid}-neuron"
                or r.get("resourceID", "").endswith("/neurondevice3")
            )
            for s in statuses
            for r in s.get("resources") or []
        )

    eventually(reported_unhealthy, "device 3 Unhealthy in the pod's allocatedResourcesStatus", timeout=120)
    eventually(lambda: "claim" in unschedulable_reason("device3"), "the untolerating pod unschedulable", timeout=120)
    assert pod_phase("device3", WORKLOADS) == "Pending"
    delete_pods("four-after-error", "device3", "device3-diagnostic")
    simulated_reboot()
    eventually(lambda: not tainted(), "every taint gone after the reboot", timeout=180)
    assert counts() == (16, 32)


def test_three_cores_on_inf2_land_on_two_connected_devices() -> None:
    sim("create", "--instance-type", "inf2.48xlarge", "--root", INF2_ROOT, "--char-devices", "--force")
    kubectl("label", "node", NODE, "node.kubernetes.io/instance-type=inf2.48xlarge", "--overwrite")
    try:
        install("--set", f"simulation.hostRoot={INF2_ROOT}")
        eventually(lambda: counts() == (12, 24), "inf2.48xlarge: 12 devices and 24 cores published", timeout=180)
        create_template("three-cores", "neuroncore.aws.com", 3, "resource.aws.com/devicegroup2_id")
        create_pod("three", "three-cores")
        eventually(lambda: pod_phase("three", WORKLOADS) == "Running", "the 3-core pod running", timeout=180)
        cores = [index(c) for c in allocated("three")]
        assert len(cores) == 3
        devices = sorted({c // 2 for c in cores})
        assert len(devices) == 2
        assert devices[1] - devices[0] in (1, 11), f"devices {devices} are not neighbours on the ring"
        assert seen_devices("three") == devices
        assert sorted(int(c) for c in shown("three")["cores"][0].split(",")) == sorted(cores)
        delete_pods("three")
        # any arc of the ring as one device: the container sees four consecutive devices
        arc = claim_template("any-arc-of-4", "neurongroup.aws.com", 1, None)
        arc["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
            {"cel": {"expression": 'device.attributes["neuron.aws.com"].deviceCount == 4'}}
        ]
        kubectl("apply", "-f", "-", stdin=json.dumps(arc))
        create_pod("arc", "any-arc-of-4")
        eventually(lambda: pod_phase("arc", WORKLOADS) == "Running", "the arc pod running", timeout=180)
        (group,) = allocated("arc")
        first = int(group.split("-")[1])
        assert seen_devices("arc") == sorted((first + i) % 12 for i in range(4))
        delete_pods("arc")
    finally:
        kubectl("label", "node", NODE, "node.kubernetes.io/instance-type=trn1.32xlarge", "--overwrite")
        install()
        run("rm", "-rf", INF2_ROOT)
    eventually(lambda: counts() == (16, 32), "back to trn1.32xlarge", timeout=180)


AWS_SPECS = Path(__file__).parent / "aws-dra-specs"  # AWS's published examples, byte for byte (see UPSTREAM)
AWS_DRIVER_VERSION = "2.25.4.0"  # what AWS's specific-driver-version example selects


def aws_spec(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """AWS's ResourceClaimTemplate as published, and its workload with each container's image (which
    the test cluster cannot pull) swapped for the project's, printing what it was given."""
    docs = [d for d in yaml_streams.load_all((AWS_SPECS / f"{name}.yaml").read_text()) if d]
    (template,) = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
    (workload,) = [d for d in docs if d["kind"] != "ResourceClaimTemplate"]
    pod_spec = workload["spec"] if workload["kind"] == "Pod" else workload["spec"]["template"]["spec"]
    for c in pod_spec["containers"]:
        c.pop("args", None)
        c.update(image=WORKLOAD_IMAGE, imagePullPolicy="Never", command=[WORKLOAD_PYTHON, "-c", SHOW_DEVICES])
    pod_spec["terminationGracePeriodSeconds"] = 1
    return template, workload


def apply_in_workloads(*docs: dict[str, Any]) -> None:
    kubectl("apply", "-n", WORKLOADS, "-f", "-", stdin=yaml_streams.dump_all(docs))


def run_awss_published_claims() -> None:
    """AWS's DRA guide's ResourceClaimTemplates, applied unchanged on a simulated trn2.48xlarge."""
    groups = {name: d["attributes"]["resource.aws.com/devicegroup4_id"]["string"] for name, d in published().items()
              if name.startswith("neurondevice")}  # fmt: skip
    # 1x4-connected-devices: four devices of one devicegroup4 (a torus row), and the container sees them
    apply_in_workloads(*aws_spec("1x4-connected-devices"))
    eventually(lambda: pod_phase("pod0", WORKLOADS) == "Running", "AWS's 1x4-connected pod running", timeout=180)
    devices = allocated("pod0")
    assert len(devices) == 4
    assert len({groups[d] for d in devices}) == 1, devices
    assert seen_devices("pod0") == sorted(index(d) for d in devices)
    kubectl("delete", "-f", str(AWS_SPECS / "1x4-connected-devices.yaml"), "-n", WORKLOADS, "--wait=true")
    # all-devices: all 16 devices of the node
    apply_in_workloads(*aws_spec("all-devices"))
    eventually(lambda: pod_phase("pod0", WORKLOADS) == "Running", "AWS's all-devices pod running", timeout=180)
    assert seen_devices("pod0") == list(range(16))
    kubectl("delete", "-f", str(AWS_SPECS / "all-devices.yaml"), "-n", WORKLOADS, "--wait=true")
    # lnc-setting-trn2: all 16 at LNC 1 (the node's default is 2): every physical core visible
    apply_in_workloads(*aws_spec("lnc-setting-trn2"))
    eventually(lambda: pod_phase("pod0", WORKLOADS) == "Running", "AWS's LNC 1 pod running", timeout=180)
    seen = shown("pod0")
    assert (seen["lnc"], len(seen["device"])) == (["1"], 16)
    assert sorted(int(c) for c in seen["cores"][0].split(",")) == list(range(128))
    kubectl("delete", "-f", str(AWS_SPECS / "lnc-setting-trn2.yaml"), "-n", WORKLOADS, "--wait=true")
    # specific-driver-version: each of the Deployment's two replicas claims every device of a node whose
    # driver is 2.25.4.0; one node here, so one replica runs and the other waits for the devices
    template, deployment = aws_spec("specific-driver-version")
    apply_in_workloads(template, deployment)

    def one_running_one_waiting() -> bool:
        items = read("pods", namespace=WORKLOADS, selector="app=my-app")["items"]
        phases = sorted(p["status"].get("phase", "") for p in items if not p["metadata"].get("deletionTimestamp"))
        return phases == ["Pending", "Running"]

    eventually(one_running_one_waiting, "one replica of AWS's driver-version Deployment running", timeout=180)
    kubectl("delete", "-f", str(AWS_SPECS / "specific-driver-version.yaml"), "-n", WORKLOADS, "--wait=true")


def ultraserver_labels() -> dict[str, str]:
    labels = read("node", NODE)["metadata"].get("labels", {})
    return {k: v for k, v in labels.items() if k.startswith(LABEL_PREFIX)}


def test_awss_ultraserver_labels_and_claims_on_a_simulated_trn2u_node() -> None:
    """The node as node 1 of a simulated 4-node trn2u UltraServer: the DRA driver labels its Node
    with AWS's UltraServer labels (the keys AWS's LeaderWorkerSet examples use) through the chart's
    admission policy, and AWS's published trn2u ResourceClaimTemplates, applied unchanged, give a
    pod the whole node (one `neuron_node` device) with the runtime's UltraServer variables of the
    mode each asks for (LeaderWorkerSet is not in the test cluster: a plain pod stands in for its
    leader). Back on the trn1, which is in no UltraServer, the labels are removed."""
    sim("create-ultraserver", "--root", TRN2U_ROOT, "--server-id", ULTRASERVER, "--char-devices", "--force")
    root = TRN2U_ROOT / "node-1"
    reading = read_ultraserver(root)
    expected = node_labels(reading)
    identity = reading.identity
    kubectl("label", "node", NODE, "node.kubernetes.io/instance-type=trn2u.48xlarge", "--overwrite")
    try:
        install("--set", f"simulation.hostRoot={root}")
        eventually(lambda: ultraserver_labels() == expected, "AWS's UltraServer labels on the node", timeout=120)
        assert expected[server_id_label(4)] == ULTRASERVER
        assert expected[node_id_label(4)] == "1"
        assert expected[MODE_LABEL] == "1_2_4"
        eventually(lambda: "neuronnode" in published(), "the whole node published as one device", timeout=120)
        assert identity is not None
        for spec, mode, (server, node) in (
            ("4-node-inference-us", "1", identity.group(4)),
            ("2-node-inference-us", "2", identity.group(2)),
            ("us-and-lnc-config", "2", identity.group(2)),
        ):
            # the ResourceClaimTemplate as published; the LeaderWorkerSet beside it needs its controller
            docs = yaml_streams.load_all((AWS_SPECS / f"{spec}.yaml").read_text())
            (template,) = [d for d in docs if d and d["kind"] == "ResourceClaimTemplate"]
            apply_in_workloads(template)
            create_pod("us", template["metadata"]["name"])
            eventually(lambda: pod_phase("us", WORKLOADS) == "Running", f"the pod of AWS's {spec} running", timeout=180)
            assert allocated("us") == ["neuronnode"]
            seen = shown("us")
            assert seen_devices("us") == list(range(16))
            assert (seen["ultraserver_mode"], seen["ultraserver_server_id"], seen["ultraserver_node_id"]) == (
                [mode],
                [server],
                [str(node)],
            ), spec
            delete_pods("us")
            kubectl("delete", "resourceclaimtemplate", "-n", WORKLOADS, template["metadata"]["name"], "--wait=true")
    finally:
        kubectl("label", "node", NODE, "node.kubernetes.io/instance-type=trn1.32xlarge", "--overwrite")
        install()
    eventually(lambda: ultraserver_labels() == {}, "no UltraServer label on the trn1 node", timeout=120)


def test_awss_published_claims_and_neuron_config_on_trn2() -> None:
    """On a simulated trn2.48xlarge: AWS's published ResourceClaimTemplates run unchanged; AWS's opaque
    NeuronConfig on one device (at the node's default LNC 2) gives the container LNC 1 and all 8
    physical cores of its device; an invalid value is refused at admission, naming the field."""
    sim("create", "--instance-type", "trn2.48xlarge", "--root", TRN2_ROOT, "--char-devices", "--force",
        "--driver-version", AWS_DRIVER_VERSION)  # fmt: skip
    kubectl("label", "node", NODE, "node.kubernetes.io/instance-type=trn2.48xlarge", "--overwrite")
    try:
        install("--set", f"simulation.hostRoot={TRN2_ROOT}")
        eventually(lambda: counts() == (16, 64), "trn2.48xlarge: 16 devices and 64 cores published", timeout=180)
        run_awss_published_claims()
        aws = {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}
        create_template("one-lnc1", "neuron.aws.com", 1, None, aws)
        create_pod("lnc1", "one-lnc1")
        eventually(lambda: pod_phase("lnc1", WORKLOADS) == "Running", "the LNC 1 pod running", timeout=180)
        (device,) = [index(d) for d in allocated("lnc1")]
        seen = shown("lnc1")
        assert seen["lnc"] == ["1"]
        assert sorted(int(c) for c in seen["cores"][0].split(",")) == list(range(8 * device, 8 * device + 8))
        # a value no Neuron family accepts: refused when the template is created (the chart's admission
        # policy, draDriver.configPolicy), naming the field, instead of at prepare
        with pytest.raises(AssertionError) as refused:
            create_template("one-lnc3", "neuron.aws.com", 1, None, {**aws, "logicalNeuronCore": 3})
        assert "spec.spec.devices.config[0].opaque.parameters.logicalNeuronCore: 3 is not 1 or 2" in str(refused.value)
        delete_pods("lnc1")
    finally:
        kubectl("label", "node", NODE, "node.kubernetes.io/instance-type=trn1.32xlarge", "--overwrite")
        install()


def test_a_config_only_the_node_can_refuse_is_refused_at_prepare() -> None:
    """LNC 2 is a setting some family accepts (trn2), so the admission policy admits it; the trn1 node
    does not, and says so at prepare, naming the field (the pod's Events show it)."""
    lnc2 = {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 2}
    create_template("one-lnc2", "neuron.aws.com", 1, None, lnc2)
    create_pod("lnc2", "one-lnc2")

    def refused() -> bool:
        events = kubectl("get", "events", "-n", WORKLOADS, "--field-selector", "involvedObject.name=lnc2")
        return "logicalNeuronCore 2 is not supported on trn1" in events

    eventually(refused, "the LNC 2 pod's prepare refused on trn1, naming logicalNeuronCore", timeout=180)
    assert pod_phase("lnc2", WORKLOADS) == "Pending"
    delete_pods("lnc2")


def test_the_136_default_cores_as_capacity_two_pods_share_a_device_each_with_its_own_core() -> None:
    """The chart's default on this 1.36 cluster (draDriver.coresAsCapacity=auto): each device published
    once, shareable, its cores a capacity; two pods asking one core of device 0 both run on it, each
    seeing one core of its own, and a third waits for the scheduler's reason."""
    try:
        install("--set", "draDriver.coresAsCapacity=auto")

        def shareable() -> bool:
            devices = published()
            return counts() == (16, 0) and all(d.get("allowMultipleAllocations") for d in devices.values())

        eventually(shareable, "16 shareable devices published, no core devices", timeout=180)
        assert published()["neurondevice0"]["capacity"]["cores"]["value"] == "2"
        template = claim_template("a-core-of-device-0", "neuron.aws.com", 1, None)
        exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
        exactly["capacity"] = {"requests": {"cores": "1"}}
        exactly["selectors"] = [{"cel": {"expression": 'device.attributes["neuron.aws.com"].deviceId == 0'}}]
        kubectl("apply", "-f", "-", stdin=json.dumps(template))
        for name in ("share-a", "share-b", "share-c"):
            create_pod(name, "a-core-of-device-0")
        eventually(
            lambda: [pod_phase(n, WORKLOADS) for n in ("share-a", "share-b")] == ["Running", "Running"],
            "both shares of device 0 running",
            timeout=180,
        )
        cores = [shown(n)["cores"][0] for n in ("share-a", "share-b")]
        assert sorted(cores) == ["0", "1"], cores
        assert seen_devices("share-a") == seen_devices("share-b") == [0]
        eventually(lambda: unschedulable_reason("share-c"), "the third share waits: device 0 has no core left")
        assert pod_phase("share-c", WORKLOADS) == "Pending"
        delete_pods("share-a", "share-b", "share-c")
    finally:
        install()
        eventually(lambda: counts() == (16, 32), "cores as devices again", timeout=180)
