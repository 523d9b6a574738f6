"""The driver against the real kube-apiserver and kube-scheduler of the older releases EKS offers DRA
on (1.34, 1.35; built from their modules by `make k8s-versions` and cached like the pinned one), with
their default feature gates: what each API server keeps of the slices, that the driver then publishes
only what is safe, and that the release's own scheduler never hands out a device together with one of
its cores. The pinned release (1.36) is every other test's."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from dra_harness import Harness, eventually
from simcluster.controlplane import ControlPlane, k8s_release, older_k8s_versions, private_control_plane
from simcluster.schedulers import start_scheduler
from test_scheduling import allocation, claim_and_pod, create_node, ready_for_claims, unschedulable

from neuron_sim import node as sim

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
OLDER = [v.removeprefix("v") for v in older_k8s_versions()]


@pytest.fixture(scope="module", params=OLDER)
def older(request: pytest.FixtureRequest, apiserver: ControlPlane) -> Iterator[tuple[str, ControlPlane]]:
    """A control plane of an older release, with its scheduler and the chart's DeviceClasses. The
    release is chosen only while its processes start, so the session's shared API server (requested
    first) and every other test keep the pinned release."""
    version = f"v{request.param}"
    with contextlib.ExitStack() as stack:
        with k8s_release(version):  # not built: the control plane fails the test, naming make setup
            cp = stack.enter_context(private_control_plane(f"dra-{version}-"))
            start_scheduler(cp, "default-scheduler")
        ready_for_claims(cp)
        yield version, cp


@pytest.mark.asyncio
async def test_an_older_release_gets_only_what_is_safe_and_its_scheduler_never_shares_silicon(
    start_driver, older: tuple[str, ControlPlane]
) -> None:  # type: ignore[no-untyped-def]
    version, cp = older
    node = f"old-{uuid.uuid4().hex[:8]}"
    h: Harness = await start_driver("trn1.2xlarge", node=node, cp=cp)  # 1 device, 2 cores
    await create_node(h.api, node)
    await eventually(lambda: h.driver.publisher.synced, timeout=30)
    names = await h.device_names()
    counters = not h.driver.publisher.counters_dropped
    print(f"{version}: shared counters kept: {counters}; published: {sorted(names)}")
    assert h.driver.metrics.counters_kept._value.get() == (1 if counters else 0)
    if counters:
        assert names == {"neurondevice0", "neuroncore0", "neuroncore1"}
        # the whole device first; then a core: the counters must keep the core's claim waiting
        device_claim, _ = await claim_and_pod(h.api, node, "neuron.aws.com", 1)
        await eventually(lambda: allocation(h.api, device_claim), timeout=60)
        core_claim, core_pod = await claim_and_pod(h.api, node, "neuroncore.aws.com", 1)
        await eventually(lambda: unschedulable(h.api, core_pod), timeout=60)
        assert await allocation(h.api, core_claim) is None, f"{version} handed out a core of an allocated device"
    else:
        assert names == {"neurondevice0"}, "cores published on a server without shared counters"
        claim, _ = await claim_and_pod(h.api, node, "neuron.aws.com", 1)
        await eventually(lambda: allocation(h.api, claim), timeout=60)
    # a fault: tainted where the server keeps taints, else left out
    sim.inject_fault(h.root, "NC_UNCORRECTABLE_ERROR", 0, via="kernel")
    await eventually(lambda: h.driver.metrics.unhealthy_devices._value.get() == 1)

    async def settled() -> bool:
        """Tainted, or, once the publisher has seen the server drop the taint, left out."""
        devices = {d["name"]: d for s in await h.slices() for d in s["spec"].get("devices") or []}
        if h.driver.publisher.taints_dropped:
            return "neurondevice0" not in devices
        return bool(devices.get("neurondevice0", {}).get("taints"))

    await eventually(settled, timeout=30)
    kept = not h.driver.publisher.taints_dropped
    assert h.driver.metrics.taints_kept._value.get() == (1 if kept else 0)
    print(f"{version}: device taints kept: {kept}")


def test_the_charts_notes_say_what_an_older_release_gets(older: tuple[str, ControlPlane]) -> None:
    """The NOTES of an install against the older release's API server (a server-side dry run, so
    Helm sees the real version) say that only whole devices are published and faults leave."""
    version, cp = older
    out = subprocess.run(
        [str(REPO / ".venv/bin/helm"), "install", "neuron", str(REPO / "charts/neuron-helm-chart"),
         "--kubeconfig", str(cp.kubeconfig), "--namespace", "default", "--dry-run=server",
         "--set", "devicePlugin.enabled=false,draDriver.enabled=true",
         # the fixture's DeviceClasses (not Helm's) hold the chart's names
         "--set", "draDriver.deviceClasses.device=dry.neuron,draDriver.deviceClasses.core=dry.neuroncore",
         "--set", "draDriver.deviceClasses.group=dry.neurongroup"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    notes = " ".join(out.stdout.split("NOTES:", 1)[1].split())
    assert f"This cluster runs Kubernetes {version}" in notes
    assert "the driver publishes whole devices only" in notes
