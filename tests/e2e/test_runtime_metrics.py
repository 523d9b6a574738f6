"""End to end (issue 25): the Neuron runtime's metrics, from neuron-monitor through the chart's
exporter, carry the pod, namespace, container (and claim) of the workload holding the cores, on the
real single-node cluster, through the device plugin and through the DRA driver; and AWS's published
neuron-monitor dashboard, run by a real Prometheus scraping the exporter pod with neuron-monitor's
names beside the native ones (`nodeMetrics.naming=both`), shows data on every query.

STAND-IN: AWS's neuron-monitor needs Neuron hardware and a Neuron runtime, and aws-neuronx-tools is
not served to this machine. Where a real node would have neuron-monitor under /opt/aws/neuron, the
simulated node has the protocol-faithful stand-in (`neuron-sim monitor`, the user guide's documents
for the node's devices and cores; libs/neuron-sim/src/neuron_sim/monitor.py), run by the exporter's
own interpreter inside its pod as `nodeMetrics.neuronMonitorCommand`, exactly as the chart runs a
real one. Which runtimes it reports, and on which cores, is a file the test writes: a runtime on the
cores the kubelet gave a pod, as a workload's Neuron runtime would be. Everything else (kubelet,
PodResources, device plugin, DRA driver, scheduler, Prometheus, the dashboard) is real.

Runs with `-m e2e` (make cluster-test) against $KUBECONFIG, which defaults to the test cluster's.
The tests run in file order and share one release.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_access import (
    NODE,
    REPO,
    SIM_ROOT,
    WORKLOAD_PYTHON,
    eventually,
    exporter_metrics,
    helm,
    kubectl,
    pod_phase,
    read,
    sim,
    workload_pod,
)
from prometheus_server import awss_queries, check_awss_query, prometheus, query, wait_for

from neuron_driver import layout

CHART = REPO / "charts" / "neuron-helm-chart"
RELEASE = "neuron-e2e-runtime"
NAMESPACE = "neuron-e2e-runtime"
WORKLOADS = "neuron-e2e-runtime-workloads"
VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
WORKLOAD_IMAGE = f"localhost/neuron-helm-chart/node-metrics:{VERSION}"  # any project image: it has Python
# where the node's neuron-monitor would be; under the simulated root, which the chart mounts
STANDIN = SIM_ROOT / layout.NEURON_DIR / "standin"
RUNTIMES = STANDIN / "runtimes.json"
MONITOR = shlex.join([
    WORKLOAD_PYTHON, "-m", "neuron_sim.cli", "monitor", "--root", str(SIM_ROOT), "--period", "1",
    "--runtimes-file", str(RUNTIMES),
])  # fmt: skip

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def install(*args: str) -> None:
    helm(
        "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
        "--set", "objectNames=release", "--set", "npd.enabled=false",
        "--set", "simulation.enabled=true", "--set", f"simulation.hostRoot={SIM_ROOT}",
        "--set-string", f"nodeMetrics.neuronMonitorCommand={MONITOR}",
        # the stand-in's package, where the image's interpreter finds it (a real neuron-monitor needs none)
        "--set-json", f"nodeMetrics.extraEnv={json.dumps([{'name': 'PYTHONPATH', 'value': str(STANDIN)}])}",
        "--set", "nodeMetrics.attributionInterval=2",
        *args, "--wait", "--timeout", "300s",
    )  # fmt: skip


def run_on_cores(name: str, runtime_pid: int, **pod_spec: Any) -> list[int]:
    """A workload pod given Neuron cores; once it runs, a Neuron runtime reports on exactly the cores
    the kubelet gave it (NEURON_RT_VISIBLE_CORES). Returns those cores."""
    resources = pod_spec.pop("resources")
    kubectl("apply", "-f", "-", stdin=workload_pod(name, WORKLOADS, WORKLOAD_IMAGE, resources, **pod_spec))
    eventually(lambda: pod_phase(name, WORKLOADS) == "Running", f"pod {name} running", timeout=180)
    shown: list[str] = []

    def printed() -> bool:
        shown[:] = [
            line.removeprefix("cores=") for line in kubectl("logs", "-n", WORKLOADS, name).splitlines()
            if line.startswith("cores=")
        ]  # fmt: skip
        return bool(shown and shown[0])

    eventually(printed, f"pod {name} printed its cores")
    cores = sorted(int(c) for c in shown[0].split(","))
    RUNTIMES.write_text(json.dumps([{"pid": runtime_pid, "tag": f"{name}-runtime", "cores": cores}]))
    return cores


def series(text: str, family: str, **labels: str) -> list[str]:
    """The sample lines of `family` carrying every one of `labels`."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return [line for line in text.splitlines() if line.startswith(family + "{") and all(w in line for w in wanted)]


def core_of(line: str) -> int:
    return int(line.split('core="', 1)[1].split('"', 1)[0])


@pytest.fixture(scope="module", autouse=True)
def standin() -> Iterator[None]:
    """The stand-in neuron-monitor on the node (no runtime yet), the workloads' namespace; the
    release, the namespaces and the stand-in removed afterwards."""
    sim("inject", "--root", SIM_ROOT, "reboot")
    shutil.rmtree(STANDIN, ignore_errors=True)
    shutil.copytree(
        REPO / "libs/neuron-sim/src/neuron_sim", STANDIN / "neuron_sim", ignore=shutil.ignore_patterns("__pycache__")
    )
    RUNTIMES.write_text("[]")
    kubectl("create", "namespace", WORKLOADS, check=False)
    yield
    kubectl("delete", "namespace", WORKLOADS, "--ignore-not-found", "--wait=true", "--timeout=120s", check=False)
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found", "--wait", check=False)
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
    kubectl("delete", "resourceslices", "--field-selector", f"spec.nodeName={NODE}", "--ignore-not-found", check=False)
    shutil.rmtree(STANDIN, ignore_errors=True)


def test_a_runtimes_utilization_and_latency_carry_its_pod_through_the_device_plugin() -> None:
    install()
    cores = run_on_cores("plugin-job", 4242, resources={"limits": {"aws.amazon.com/neuroncore": 2}})
    assert len(cores) == 2
    owner = {"namespace": WORKLOADS, "pod": "plugin-job", "container": "main", "claim": ""}

    def attributed() -> bool:
        text = exporter_metrics(NAMESPACE)
        return (
            {core_of(s) for s in series(text, "neuron_core_utilization_ratio", **owner, pid="4242")} == set(cores)
            and bool(series(text, "neuron_runtime_execution_latency_seconds", **owner, runtime_tag="plugin-job-runtime"))
            and bool(series(text, "neuron_runtime_executions_total", **owner, status="completed"))
        )  # fmt: skip

    eventually(attributed, "the runtime's utilization, latency and executions under plugin-job", timeout=120)
    text = exporter_metrics(NAMESPACE)
    (running,) = [
        line for line in text.splitlines() if line.startswith('neuron_exporter_monitor_state{state="running"}')
    ]
    assert float(running.split()[-1]) == 1, running
    # no core outside the pod's gets the pod's labels
    assert {core_of(s) for s in series(text, "neuron_core_utilization_ratio", pod="plugin-job")} == set(cores)


def test_awss_neuron_monitor_dashboard_shows_the_exporters_data() -> None:
    """AWS's board (vendored unchanged) over a real Prometheus scraping the exporter pod with both
    namings (`nodeMetrics.naming=both`; the integration tests run drop-in mode alone too): every query
    answers with numbers and the labels its panel shows; the pod label comes too, and the native
    series this chart's boards read are there beside them."""
    install("--set", "nodeMetrics.naming=both")
    pods = read("pods", namespace=NAMESPACE, selector="app.kubernetes.io/component=node-metrics")["items"]
    (exporter,) = [p for p in pods if p["metadata"].get("deletionTimestamp") is None]
    scrape = {
        "job_name": "neuron-monitor",  # the Service's job, as the observability accelerator scrapes it
        "static_configs": [{"targets": [f"{exporter['status']['podIP']}:9840"]}],
    }

    async def check(base: str) -> None:
        await wait_for(base, 'neuroncore_utilization_ratio{pod="plugin-job"}', "the pod's utilization", timeout=120)
        await asyncio.sleep(8)  # rates over a few scrapes, before the instant checked (3 s back)
        for where, expr, shown in awss_queries():
            await check_awss_query(base, where, expr, shown)
        held = (await query(base, 'neuroncore_utilization_ratio{pod="plugin-job"}'))["result"]
        assert {s["metric"]["namespace"] for s in held} == {WORKLOADS}
        native = (await query(base, 'neuron_core_utilization_ratio{pod="plugin-job"}'))["result"]
        assert {s["metric"]["core"] for s in native} == {s["metric"]["neuroncore"] for s in held}
        # the family both namings call alike, served once with both label sets
        memory = (await query(base, 'neuron_runtime_memory_used_bytes{pod="plugin-job"}'))["result"]
        assert memory
        assert all({"location", "memory_location", "pid", "instance_type"} <= set(s["metric"]) for s in memory)

    with tempfile.TemporaryDirectory(prefix="prom-e2e-") as work, prometheus(Path(work), [scrape]) as base:
        asyncio.run(check(base))


def test_a_runtimes_utilization_carries_its_pod_and_claim_through_dra() -> None:
    kubectl("delete", "pod", "-n", WORKLOADS, "plugin-job", "--ignore-not-found", "--wait=true", "--timeout=60s")
    RUNTIMES.write_text("[]")
    install("--set", "devicePlugin.enabled=false,draDriver.enabled=true")
    kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-device", "namespace": WORKLOADS},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "neuron", "exactly": {"deviceClassName": "neuron.aws.com", "count": 1}},
        ]}}},
    }))  # fmt: skip
    cores = run_on_cores(
        "dra-job", 5151,
        resources={"claims": [{"name": "neuron"}]},
        resourceClaims=[{"name": "neuron", "resourceClaimTemplateName": "one-device"}],
    )  # fmt: skip
    (status,) = read("pod", "dra-job", namespace=WORKLOADS)["status"]["resourceClaimStatuses"]
    owner = {"namespace": WORKLOADS, "pod": "dra-job", "container": "main", "claim": status["resourceClaimName"]}

    def attributed() -> bool:
        text = exporter_metrics(NAMESPACE)
        return {core_of(s) for s in series(text, "neuron_core_utilization_ratio", **owner, pid="5151")} == set(
            cores
        ) and bool(series(text, "neuron_runtime_execution_latency_seconds", **owner))

    eventually(attributed, "the runtime's utilization and latency under dra-job and its claim", timeout=120)
