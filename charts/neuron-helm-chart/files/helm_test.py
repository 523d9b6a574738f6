"""`helm test` checks, run inside this project's problem-detector image (Python, the Kubernetes
client and neuron_model's instance table): `helm_test.py CHECK...` runs the named checks at the same
time, each to its end, prints each one's lines under its name, and exits 0 only when every one passed.
The chart runs the checks that read the components through the API in one pod, and allocation and
scheduling, which must hold a core or a device, each in a pod of its own.

  capacity    every node running the device plugin advertises the neuron/neuroncore counts its
              instance type implies
  allocation  run in a pod holding one neuroncore: exactly one /dev/neuronN and one visible core
  metrics     every node-metrics pod serves a neuron_device_info sample (it found the node's devices)
  monitoring  where the API server serves the Prometheus operator's API (or monitoring is forced), the
              release has its ServiceMonitor or PodMonitor and, when enabled, its PrometheusRule:
              the exporter will be scraped and its alerts loaded
  health      every node running the problem detector carries the NeuronHealth condition
  remediation every remediation controller replica answers /readyz and serves neuron_remediation_leader on
              /metrics, exactly one of them holds the Lease (leader 1), and that one has made a pass over
              the fleet (neuron_remediation_passes_total above 0): it listed the Nodes and pods and acts
  scheduling  run in a pod that neuron-scheduler placed (only it binds a pod naming it), holding one
              whole device: exactly one /dev/neuronN, and the runtime told to use that device's cores
  slices      every node running the DRA driver publishes, in a pool named after it, the Neuron
              devices (and cores) its instance type implies

Settings come from the environment the chart sets (see templates/tests/).
"""

from __future__ import annotations

import os
import re
import ssl
import stat
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NoReturn

RELEASE_NAMESPACE = os.environ.get("RELEASE_NAMESPACE", "default")
TIMEOUT = float(os.environ.get("TEST_TIMEOUT_SECONDS", "120"))

# the check the calling thread runs, named on each line it prints: several run in one pod's log
_running = threading.local()
_print_lock = threading.Lock()


class CheckFailed(Exception):
    """A check's verdict: what it found wrong."""


def log(message: str) -> None:
    check = getattr(_running, "check", None)
    with _print_lock:
        print(f"[{check}] {message}" if check else message, flush=True)


def fail(message: str) -> NoReturn:
    raise CheckFailed(message)


def component_namespace(variable: str) -> str:
    """The namespace of the component a check lists the pods of (the device plugin's is kube-system with AWS's
    names), from the check's own variable: one pod runs checks of components in different namespaces."""
    return os.environ.get(variable) or RELEASE_NAMESPACE


def eventually(check: Callable[[], str | None], what: str) -> None:
    """Retry `check` (None means passed, else the reason) until TIMEOUT, then fail with the last reason."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        reason = check()
        if reason is None:
            log(f"ok: {what}")
            return
        if time.monotonic() > deadline:
            fail(f"{what}: {reason} (after {TIMEOUT:.0f} s)")
        time.sleep(2)


def core_api() -> Any:
    from kubernetes import client, config

    config.load_incluster_config()
    return client.CoreV1Api()


def component_pods(api: Any, namespace: str, selector: str) -> list[Any]:
    pods = api.list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in pods if p.spec.node_name]


# Waiting reasons of a container that is merely on its way; any other (ErrImagePull, ImagePullBackOff,
# CrashLoopBackOff, CreateContainerConfigError, ...) is why a component never becomes ready.
STARTING = {"ContainerCreating", "PodInitializing"}


def stuck_containers(api: Any, namespace: str, selector: str) -> str:
    """The kubelet's own word on each of the component's containers that is stuck, e.g. a pull error naming the
    image reference and what the registry answered; empty when none is."""
    stuck: list[str] = []
    for pod in component_pods(api, namespace, selector):
        statuses = (pod.status.init_container_statuses or []) + (pod.status.container_statuses or [])
        for status in statuses:
            waiting = status.state.waiting if status.state else None
            if waiting and waiting.reason not in STARTING:
                stuck.append(f"pod {pod.metadata.name} container {status.name}: {waiting.reason}: {waiting.message}")
    return "; ".join(stuck)


def with_stuck(reason: str | None, api: Any, namespace: str, selector: str) -> str | None:
    """A check's reason for failing, followed by what the kubelet says of the component's stuck containers."""
    if reason is None:
        return None
    stuck = stuck_containers(api, namespace, selector)
    return f"{reason} [{stuck}]" if stuck else reason


def nodes_running(api: Any, namespace: str, selector: str, component: str) -> list[str]:
    """The nodes the component's pods are scheduled on, once there is at least one."""
    nodes: list[str] = []

    def scheduled() -> str | None:
        nodes[:] = sorted({p.spec.node_name for p in component_pods(api, namespace, selector)})
        return None if nodes else f"no {component} pod ({selector}) is scheduled in {namespace}"

    eventually(scheduled, f"{component} pods are scheduled")
    return nodes


def expected_counts(instance_type: str, lnc_setting: int) -> tuple[int, int]:
    from neuron_model.instance_types import INSTANCE_TYPES

    it = INSTANCE_TYPES.get(instance_type.removeprefix("ml."))
    if it is None:
        fail(f"instance type {instance_type!r} is not in neuron_model's table; cannot say what it should advertise")
    lnc = lnc_setting or it.family.default_lnc
    if lnc not in it.family.supported_lnc:
        fail(f"tests.logicalNcConfig={lnc} is not supported by {it.family.name} ({it.family.supported_lnc})")
    return it.devices, it.devices * it.logical_cores_per_device(lnc)


def test_capacity() -> None:
    api = core_api()
    namespace = component_namespace("DEVICE_PLUGIN_NAMESPACE")
    selector = os.environ["DEVICE_PLUGIN_SELECTOR"]
    prefix = os.environ.get("RESOURCE_PREFIX", "aws.amazon.com")
    label = os.environ.get("INSTANCE_TYPE_LABEL", "node.kubernetes.io/instance-type")
    lnc = int(os.environ.get("LOGICAL_NC_CONFIG", "0"))
    for name in nodes_running(api, namespace, selector, "device plugin"):
        node = api.read_node(name)
        instance_type = (node.metadata.labels or {}).get(label)
        if not instance_type:
            fail(f"node {name} has no {label} label")
        devices, cores = expected_counts(instance_type, lnc)

        def advertised(name: str = name, devices: int = devices, cores: int = cores) -> str | None:
            capacity = api.read_node(name).status.capacity or {}
            got = (capacity.get(f"{prefix}/neuron"), capacity.get(f"{prefix}/neuroncore"))
            want = (str(devices), str(cores))
            reason = None if got == want else f"capacity neuron/neuroncore is {got}, expected {want}"
            return with_stuck(reason, api, namespace, selector)

        eventually(advertised, f"node {name} ({instance_type}) advertises {devices} neuron and {cores} neuroncore")


def test_allocation() -> None:
    devices = sorted(p for p in Path("/dev").glob("neuron*") if re.fullmatch(r"neuron\d+", p.name))
    if len(devices) != 1:
        fail(f"a pod holding one neuroncore should see exactly one /dev/neuronN, saw {[str(d) for d in devices]}")
    if not stat.S_ISCHR(devices[0].stat().st_mode):
        fail(f"{devices[0]} is not a character device")
    visible = os.environ.get("NEURON_RT_VISIBLE_CORES", "")
    if not re.fullmatch(r"\d+", visible):
        fail(f"NEURON_RT_VISIBLE_CORES should name exactly one core, got {visible!r}")
    log(f"ok: one neuroncore holds {devices[0]} and NEURON_RT_VISIBLE_CORES={visible}")


def test_scheduling() -> None:
    devices = sorted(p for p in Path("/dev").glob("neuron*") if re.fullmatch(r"neuron\d+", p.name))
    if len(devices) != 1:
        fail(f"a pod holding one neuron device should see exactly one /dev/neuronN, saw {[str(d) for d in devices]}")
    visible = os.environ.get("NEURON_RT_VISIBLE_CORES", "")
    if not re.fullmatch(r"\d+([-,]\d+)*", visible):
        fail(f"NEURON_RT_VISIBLE_CORES should name the device's cores, got {visible!r}")
    log(f"ok: placed by the Neuron-aware scheduler, holding {devices[0]} (NEURON_RT_VISIBLE_CORES={visible})")


def secure_reader(variable: str) -> tuple[str, dict[str, str], ssl.SSLContext | None]:
    """The scheme, headers and TLS context to read a component's /metrics with: with `variable` set (the component's
    secureMetrics), HTTPS against the chart's CA as the chart's scraper, whose token is in that directory."""
    credentials = os.environ.get(variable)
    if not credentials:
        return "http", {}, None
    context = ssl.create_default_context(cafile=str(Path(credentials, "ca.crt")))
    # dialled by pod IP, which the certificate (made for the Service's name) does not list: the chart's own CA is
    # what proves the server is the component
    context.check_hostname = False
    return "https", {"Authorization": "Bearer " + Path(credentials, "token").read_text().strip()}, context


def sample(body: str, name: str) -> float | None:
    """The value of the unlabelled sample `name` in a Prometheus text exposition, or None when absent."""
    for line in body.splitlines():
        metric, _, value = line.partition(" ")
        if metric == name:
            return float(value.split()[0])
    return None


# a device the exporter found, under its native name or neuron-monitor's (nodeMetrics.naming)
DEVICE_INFO = ("neuron_device_info{", "neuron_hardware_info{")


def test_metrics() -> None:
    api = core_api()
    namespace = component_namespace("NODE_METRICS_NAMESPACE")
    selector = os.environ["NODE_METRICS_SELECTOR"]
    port = int(os.environ["NODE_METRICS_PORT"])
    ips: list[tuple[str, str]] = []

    def ready_pods() -> str | None:
        pods = component_pods(api, namespace, selector)
        ips[:] = [(p.metadata.name, p.status.pod_ip) for p in pods if p.status.pod_ip]
        if not pods:
            return f"no node-metrics pod ({selector}) in {namespace}"
        return None if len(ips) == len(pods) else "some node-metrics pods have no IP yet"

    scheme, headers, context = secure_reader("NODE_METRICS_CREDENTIALS")
    eventually(ready_pods, "node-metrics pods have addresses")
    for pod, ip in ips:

        def serves(ip: str = ip) -> str | None:
            url = f"{scheme}://{ip}:{port}/metrics"
            try:
                request = urllib.request.Request(url, headers=headers)
                with urllib.request.urlopen(request, timeout=10, context=context) as response:
                    body = response.read().decode()
            except OSError as e:
                return with_stuck(f"GET {url} failed: {e}", api, namespace, selector)
            info = [
                line for line in body.splitlines() if line.startswith(("neuron_device_info{", "neuron_hardware_info{"))
            ]
            return None if info else "the response holds no neuron_device_info (or neuron_hardware_info) sample"

        eventually(serves, f"{pod} ({ip}:{port}) serves the node's devices' metrics")


def test_remediation() -> None:
    api = core_api()
    namespace = component_namespace("REMEDIATION_NAMESPACE")
    selector = os.environ["REMEDIATION_SELECTOR"]
    port = int(os.environ["REMEDIATION_PORT"])
    replicas = int(os.environ.get("REMEDIATION_REPLICAS", "1"))
    scheme, headers, context = secure_reader("REMEDIATION_CREDENTIALS")

    def get(url: str) -> str:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            body: str = response.read().decode()
            return body

    def one_leader_acting() -> str | None:
        # a replica on its way out (a rollout) is not counted: its successor is
        pods = [p for p in component_pods(api, namespace, selector) if not p.metadata.deletion_timestamp]
        if len(pods) < replicas:
            reason = f"{len(pods)} remediation controller pods ({selector}) in {namespace}, expected {replicas}"
            return with_stuck(reason, api, namespace, selector)
        leaders: list[str] = []
        passes: dict[str, float] = {}
        for pod in pods:
            ip = pod.status.pod_ip
            if not ip:
                return with_stuck(f"pod {pod.metadata.name} has no IP yet", api, namespace, selector)
            base = f"{scheme}://{ip}:{port}"
            try:
                get(f"{base}/readyz")
                body = get(f"{base}/metrics")
            except OSError as e:  # an HTTP error (503 not ready, 401/403 refused) is one too
                return with_stuck(f"pod {pod.metadata.name}: GET {base} failed: {e}", api, namespace, selector)
            leader = sample(body, "neuron_remediation_leader")
            if leader is None:
                return f"pod {pod.metadata.name}'s /metrics holds no neuron_remediation_leader sample"
            if leader == 1:
                leaders.append(pod.metadata.name)
                passes[pod.metadata.name] = sample(body, "neuron_remediation_passes_total") or 0
        if len(leaders) != 1:
            return f"{len(leaders)} replicas report neuron_remediation_leader 1 ({', '.join(leaders)}), expected one"
        (leader_pod,) = leaders
        if not passes[leader_pod]:
            return f"the leader {leader_pod} has made no pass over the fleet yet (neuron_remediation_passes_total 0)"
        return None

    eventually(one_leader_acting, "the remediation controller answers, one replica leads and it acts")


def test_monitoring() -> None:
    from kubernetes import client, config

    config.load_incluster_config()
    kind = os.environ["MONITOR_KIND"]
    expected = [(kind, os.environ["MONITOR_NAME"])]
    if os.environ.get("PROMETHEUS_RULE") == "true":
        expected.append(("PrometheusRule", os.environ["MONITOR_NAME"]))
    served = any(
        g.name == "monitoring.coreos.com" and any(v.version == "v1" for v in g.versions)
        for g in client.ApisApi().get_api_versions().groups
    )
    if not served and os.environ.get("MONITORING_FORCED") != "true":
        log("ok: the API server serves no monitoring.coreos.com/v1 (no Prometheus operator): nothing to scrape with")
        return
    objects = client.CustomObjectsApi()
    plural = {"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors", "PrometheusRule": "prometheusrules"}
    for kind, name in expected:

        def exists(kind: str = kind, name: str = name) -> str | None:
            try:
                objects.get_namespaced_custom_object(
                    "monitoring.coreos.com", "v1", RELEASE_NAMESPACE, plural[kind], name
                )
            except client.ApiException as e:
                return f"{kind} {name}: {e.status} {e.reason}"
            return None

        eventually(exists, f"the {kind} {name} exists")


def test_health() -> None:
    api = core_api()
    condition = os.environ.get("CONDITION_TYPE", "NeuronHealth")
    namespace = component_namespace("NPD_NAMESPACE")
    selector = os.environ["NPD_SELECTOR"]
    for name in nodes_running(api, namespace, selector, "problem detector"):

        def has_condition(name: str = name) -> str | None:
            conditions = api.read_node(name).status.conditions or []
            found = [c for c in conditions if c.type == condition]
            reason = None if found else f"node {name} has no {condition} condition"
            return with_stuck(reason, api, namespace, selector)

        eventually(has_condition, f"node {name} carries {condition}")


def published_devices_and_cores(slices: list[dict[str, Any]], node: str) -> tuple[int, int]:
    """The Neuron devices and cores `node`'s pool publishes in its newest generation. Cores count as
    devices or as the capacity of shareable devices (draDriver.coresAsCapacity), both at once: the driver
    publishes cores as devices where the API server drops shareable devices."""
    ours = [s for s in slices if s["spec"]["driver"] == "neuron.aws.com" and s["spec"]["pool"]["name"] == node]
    newest = max((s["spec"]["pool"]["generation"] for s in ours), default=0)
    listed = [d for s in ours if s["spec"]["pool"]["generation"] == newest for d in s["spec"].get("devices", [])]
    names = [d["name"] for d in listed]
    cores = sum(n.startswith("neuroncore") for n in names) + sum(
        int(d["capacity"]["cores"]["value"]) for d in listed if d.get("allowMultipleAllocations")
    )
    return sum(n.startswith("neurondevice") for n in names), cores


def test_slices() -> None:
    from kubernetes import client

    api = core_api()
    objects = client.CustomObjectsApi()
    label = os.environ.get("INSTANCE_TYPE_LABEL", "node.kubernetes.io/instance-type")
    lnc = int(os.environ.get("LOGICAL_NC_CONFIG", "0"))
    with_cores = os.environ.get("PUBLISH_CORES", "true") == "true"
    namespace = component_namespace("DRA_DRIVER_NAMESPACE")
    for name in nodes_running(api, namespace, os.environ["DRA_DRIVER_SELECTOR"], "DRA driver"):
        instance_type = (api.read_node(name).metadata.labels or {}).get(label)
        if not instance_type:
            fail(f"node {name} has no {label} label")
        devices, cores = expected_counts(instance_type, lnc)
        cores = cores if with_cores else 0

        def published(name: str = name, devices: int = devices, cores: int = cores) -> str | None:
            slices = objects.list_cluster_custom_object(
                "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.nodeName={name}"
            )["items"]
            got = published_devices_and_cores(slices, name)
            return None if got == (devices, cores) else f"published devices/cores {got}, expected {(devices, cores)}"

        eventually(published, f"node {name} ({instance_type}) publishes {devices} devices and {cores} cores for DRA")


MODES = {
    "capacity": test_capacity,
    "allocation": test_allocation,
    "metrics": test_metrics,
    "monitoring": test_monitoring,
    "health": test_health,
    "scheduling": test_scheduling,
    "slices": test_slices,
    "remediation": test_remediation,
}


def run_checks(checks: Mapping[str, Callable[[], None]]) -> list[str]:
    """Run every check at the same time, each to its end (one failing hides no other), and return the names of
    those that failed. Each prints its lines under its name; a failure ends with the check's reason."""

    def run(name: str, check: Callable[[], None]) -> bool:
        _running.check = name
        try:
            check()
        except CheckFailed as e:
            log(f"FAIL: {e}")
            return False
        except Exception as e:  # a check's own crash (the API refused, a malformed answer) is its failure too
            log(f"FAIL: {type(e).__name__}: {e}")
            return False
        finally:
            _running.check = None
        return True

    with ThreadPoolExecutor(max_workers=max(1, len(checks))) as pool:
        passed = dict(zip(checks, pool.map(run, checks, checks.values()), strict=True))
    return [name for name, ok in passed.items() if not ok]


def main(argv: list[str]) -> int:
    wanted = argv[1:]
    unknown = [name for name in wanted if name not in MODES]
    if not wanted or unknown or len(set(wanted)) != len(wanted):
        print(f"usage: helm_test.py CHECK... (each once, of {', '.join(MODES)})", file=sys.stderr)
        return 2
    failed = run_checks({name: MODES[name] for name in wanted})
    if failed:
        print(f"FAIL: {len(failed)} of {len(wanted)} checks failed: {', '.join(failed)}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
