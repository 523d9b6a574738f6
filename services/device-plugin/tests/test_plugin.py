"""The plugin against the protocol-faithful kubelet stand-in (tests/standins/kubelet.py).

STAND-IN: the real kubelet runs in the cluster tests; here its device manager is emulated
over the real gRPC contracts on unix sockets.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from pathlib import Path

import aiohttp
import grpc
import pytest
from broken_loop import break_loop_and_probe
from grpc import aio
from oracles.neuron_sets import exhaustive_devices
from polling import until_async
from standins.kubelet import AdmissionError, Allocation

from kubelet_api import HEALTHY, UNHEALTHY
from kubelet_api.deviceplugin.v1beta1 import api_pb2 as dp
from kubelet_api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from neuron_device_plugin.node_report import build_report
from neuron_device_plugin.registration import ResourceServer, remove_stale_sockets
from neuron_driver import layout
from neuron_model import resources
from neuron_model.allocator import Topology
from neuron_model.instance_types import INSTANCE_TYPES
from neuron_sim import node as sim

NEURON = "aws.amazon.com/neuron"
NEURONCORE = "aws.amazon.com/neuroncore"

EXPECTED = {  # instance type: (devices, logical cores) with the default logical-core setting
    "inf1.24xlarge": (16, 64),
    "inf2.48xlarge": (12, 24),
    "trn1.32xlarge": (16, 32),
    "trn2.48xlarge": (16, 64),
}


async def eventually(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    await until_async(predicate, timeout=timeout, interval=0.02)


async def next_health_check(h) -> None:  # type: ignore[no-untyped-def]
    """Until a health check that began after this call has finished (its findings are in the
    plugin's state). The check is synchronous, so one that finishes after the hook is set began
    after it; a check that raises never finishes and times this out."""
    monitor = h.plugin.monitor
    done = asyncio.Event()
    after = monitor.after_tick

    def hook() -> None:
        after()
        done.set()

    monitor.after_tick = hook
    try:
        await asyncio.wait_for(done.wait(), 5)
    finally:
        monitor.after_tick = after


async def next_list(h) -> None:  # type: ignore[no-untyped-def]
    """Until the plugin has taken in a PodResources List the kubelet answered after this call."""
    asked = time.monotonic()
    await eventually(lambda: h.plugin.poller.latest is not None and h.plugin.poller.latest.started_at > asked)


@pytest.mark.parametrize("instance_type", sorted(EXPECTED))
async def test_registers_both_resources_with_counts_and_numa(start_plugin, instance_type: str) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin(instance_type)
    devices, cores = EXPECTED[instance_type]
    assert h.kubelet.capacity(NEURON) == devices
    assert h.kubelet.capacity(NEURONCORE) == cores
    assert len(h.kubelet.healthy(NEURON)) == devices
    assert set(h.kubelet.registrations) == {NEURON, NEURONCORE}
    neuron15 = h.kubelet.endpoints[NEURON].devices[f"neuron{devices - 1}"]
    assert [n.ID for n in neuron15.topology.nodes] == [1]  # second socket
    assert h.kubelet.endpoints[NEURON].options.get_preferred_allocation_available
    assert not h.kubelet.endpoints[NEURON].options.pre_start_required


async def test_trn2_lnc1_has_128_cores(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("trn2.48xlarge", lnc=1)
    assert h.kubelet.capacity(NEURONCORE) == 128


async def test_allocate_devices_every_size_topology_valid(start_plugin) -> None:  # type: ignore[no-untyped-def]
    # Lists every 20 ms: each round waits for the next one
    h = await start_plugin("trn1.32xlarge", "--holdings-interval", "0.02")
    it = INSTANCE_TYPES["trn1.32xlarge"]
    topo = Topology(it.topology, 16, it.adjacency(), 2, it.torus_shape)
    for size in (1, 4, 8, 16):
        response = await h.kubelet.allocate(NEURON, size, pod=f"p{size}")
        got = sorted(int(d.container_path.removeprefix("/dev/neuron")) for d in response.devices)
        assert tuple(got) in exhaustive_devices(topo, range(16), size)
        for spec in response.devices:
            assert spec.host_path == str(h.root / "dev" / spec.container_path.removeprefix("/dev/"))
            assert spec.permissions == "rw"
        cores = [int(c) for c in response.envs["NEURON_RT_VISIBLE_CORES"].split(",")]
        assert cores == [c for d in got for c in (2 * d, 2 * d + 1)]
        assert "NEURON_LOGICAL_NC_CONFIG" not in response.envs  # not set on this node
        h.kubelet.release(f"p{size}")
        await next_list(h)  # the plugin's next List sees the release


async def test_a_trainium3_node_hands_out_any_k_free_devices(start_plugin) -> None:  # type: ignore[no-untyped-def]
    """NeuronSwitch: any set of devices is connected, so every size fits while that many are free, even
    sizes no torus or ring has a group of, and the last ones wherever they are."""
    h = await start_plugin("trn3.48xlarge", "--holdings-interval", "0.02")
    assert (h.kubelet.capacity(NEURON), h.kubelet.capacity(NEURONCORE)) == (16, 64)  # LNC 2 by default
    held: set[int] = set()
    for size in (3, 5, 2, 6):  # 16 in all, none released
        response = await h.kubelet.allocate(NEURON, size, pod=f"p{size}")
        got = {int(d.container_path.removeprefix("/dev/neuron")) for d in response.devices}
        assert len(got) == size
        assert not got & held
        held |= got
        cores = [int(c) for c in response.envs["NEURON_RT_VISIBLE_CORES"].split(",")]
        assert cores == [c for d in sorted(got) for c in range(4 * d, 4 * d + 4)]
        await next_list(h)
    assert held == set(range(16))


async def test_allocate_cores_two_on_one_device(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("trn2.48xlarge", lnc=2)
    response = await h.kubelet.allocate(NEURONCORE, 2)
    [spec] = response.devices
    assert spec.container_path == "/dev/neuron0"
    assert response.envs["NEURON_RT_VISIBLE_CORES"] == "0,1"
    assert response.envs["NEURON_LOGICAL_NC_CONFIG"] == "2"  # set in the node's config file


async def test_every_core_size_on_inf1(start_plugin) -> None:  # type: ignore[no-untyped-def]
    # 4 devices x 4 cores; Lists every 20 ms: each round waits for the next one
    h = await start_plugin("inf1.6xlarge", "--holdings-interval", "0.02")
    for size in range(1, 17):
        response = await h.kubelet.allocate(NEURONCORE, size, pod=f"p{size}")
        cores = [int(c) for c in response.envs["NEURON_RT_VISIBLE_CORES"].split(",")]
        assert len(cores) == size
        assert len(response.devices) == -(-size // 4)  # fewest devices
        h.kubelet.release(f"p{size}")
        await next_list(h)


async def test_multi_container_and_sidecar_pods(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("inf2.48xlarge")
    init = await h.kubelet.allocate(NEURONCORE, 1, pod="p", container="init")
    a = await h.kubelet.allocate(NEURONCORE, 1, pod="p", container="app")
    b = await h.kubelet.allocate(NEURONCORE, 1, pod="p", container="sidecar")
    seen = [r.envs["NEURON_RT_VISIBLE_CORES"] for r in (init, a, b)]
    assert len(set(seen)) == 3
    # an app container reusing its init container's core (the kubelet passes it as must-include)
    reused = await h.kubelet.allocate(NEURONCORE, 2, pod="p", container="app2", reuse=[f"neuroncore{seen[0]}"])
    assert seen[0] in reused.envs["NEURON_RT_VISIBLE_CORES"].split(",")


async def test_cores_of_a_held_device_are_not_offered_and_are_refused(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("trn1.32xlarge")
    response = await h.kubelet.allocate(NEURON, 1, pod="whole")
    device = int(response.devices[0].container_path.removeprefix("/dev/neuron"))
    held_cores = {f"neuroncore{2 * device}", f"neuroncore{2 * device + 1}"}
    # the pending hand-out counts at once, before the kubelet's List confirms it
    await eventually(lambda: not (held_cores & h.kubelet.healthy(NEURONCORE)))
    assert len(h.kubelet.healthy(NEURONCORE)) == 30
    assert h.kubelet.capacity(NEURONCORE) == 32  # capacity stays: the silicon exists

    # a kubelet that raced (not yet updated) asks for those cores: refused, not shared, and
    # once the kubelet's List reports the holder, the refusal names it
    await eventually(lambda: any("whole" in h.owner for hs in h.plugin.state.holdings().devices.values() for h in hs))
    stub = h.kubelet.endpoints[NEURONCORE].stub
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(
            dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=sorted(held_cores))])
        )
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "default/whole/main (as aws.amazon.com/neuron)" in (err.value.details() or "")

    # and the other way round: a device with a core held is not offered as a whole device
    core_resp = await h.kubelet.allocate(NEURONCORE, 1, pod="one-core")
    core = int(core_resp.envs["NEURON_RT_VISIBLE_CORES"])
    await eventually(lambda: f"neuron{core // 2}" not in h.kubelet.healthy(NEURON))
    # releasing gives everything back once the kubelet's List no longer shows the pods
    h.kubelet.release("whole")
    h.kubelet.release("one-core")
    await eventually(lambda: len(h.kubelet.healthy(NEURONCORE)) == 32 and len(h.kubelet.healthy(NEURON)) == 16)


async def test_nothing_is_offered_until_the_kubelets_holdings_are_known(start_plugin) -> None:  # type: ignore[no-untyped-def]
    """A pod admitted before the plugin (re)started holds neuron0; until a List shows it, its cores
    looked free to the plugin and were handed out a second time."""

    async def held_before_the_plugin(kubelet) -> None:  # type: ignore[no-untyped-def]
        kubelet.allocations.append(
            Allocation("default", "old", "main", NEURON, ["neuron0"], dp.ContainerAllocateResponse())
        )
        kubelet.bucket.qps = kubelet.bucket.tokens = 0.0  # List refused (rate limit) until the test lets it answer

    h = await start_plugin("trn1.32xlarge", before_plugin=held_before_the_plugin, wait=False)
    await eventually(lambda: {NEURON, NEURONCORE} <= set(h.kubelet.registrations))
    await eventually(lambda: h.plugin.poller.errors["RESOURCE_EXHAUSTED"] >= 2)
    assert not h.kubelet.healthy(NEURONCORE)
    with pytest.raises(AdmissionError):
        await h.kubelet.allocate(NEURONCORE, 1, pod="new")

    h.kubelet.bucket.qps = 100.0
    await h.kubelet.wait_registered([NEURON, NEURONCORE])
    assert h.kubelet.healthy(NEURONCORE) == {f"neuroncore{i}" for i in range(2, 32)}
    response = await h.kubelet.allocate(NEURONCORE, 1, pod="new")
    assert response.envs["NEURON_RT_VISIBLE_CORES"] not in ("0", "1")


async def test_unknown_and_unhealthy_ids_are_refused(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("inf2.24xlarge")
    stub = h.kubelet.endpoints[NEURON].stub
    for bad in (["neuron99"], ["neuroncore1"], ["gpu0"]):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Allocate(dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=bad)]))
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert f"unknown device ID {bad[0]!r}" in (err.value.details() or "")
    sim.bump_counter(h.root, 2, "mem_ecc_uncorrected")
    await eventually(lambda: "neuron2" not in h.kubelet.healthy(NEURON))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(
            dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=["neuron2"])])
        )
    assert "unhealthy device neuron2: counter mem_ecc_uncorrected +1" in (err.value.details() or "")


async def test_more_than_free_is_refused_by_admission(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("inf2.24xlarge")
    await h.kubelet.allocate(NEURON, 4, pod="a")
    with pytest.raises(AdmissionError, match="Requested: 4, Available: 2"):
        await h.kubelet.allocate(NEURON, 4, pod="b")


# The driver generations the simulator writes (driver_layout.SIMULATED), by sim.GENERATION_VERSIONS' version of
# each; a representative pair of the health tests runs on every one, the rest on the default tree.
DRIVER_VERSIONS = pytest.mark.parametrize(
    "driver_version", list(sim.GENERATION_VERSIONS.values()), ids=list(sim.GENERATION_VERSIONS)
)


class TestHealth:
    @DRIVER_VERSIONS
    async def test_repairable_error_recovers_after_a_driver_reload(self, start_plugin, driver_version) -> None:  # type: ignore[no-untyped-def]
        h = await start_plugin("trn1.32xlarge", driver_version=driver_version)
        assert h.plugin.layout.ok, h.plugin.layout.lines()
        sim.bump_counter(h.root, 5, "mem_ecc_repairable_uncorrected")
        # the cores follow, on their own ListAndWatch stream: the kubelet may hear of them a moment later
        await eventually(
            lambda: (
                "neuron5" not in h.kubelet.healthy(NEURON)
                and {"neuroncore10", "neuroncore11"}.isdisjoint(h.kubelet.healthy(NEURONCORE))
            )
        )
        assert h.kubelet.capacity(NEURON) == 16
        h.clock.advance(2.0)  # longer than the 1 s quiet period: time alone does not mend it
        await next_health_check(h)
        assert not h.plugin.state.verdict(5).healthy
        assert "neuron5" not in h.kubelet.healthy(NEURON)
        sim.reload_driver(h.root)
        await eventually(lambda: "neuron5" in h.kubelet.healthy(NEURON), timeout=5)

    async def test_transient_fault_leaves_the_device_in_service(self, start_plugin) -> None:  # type: ignore[no-untyped-def]
        h = await start_plugin("trn1.32xlarge")
        sim.inject_fault(h.root, "HANG_ON_COLLECTIVES", 4)
        sim.inject_fault(h.root, "HANG_ON_COLLECTIVES", 4, via="core-counter")
        sim.inject_fault(h.root, "NC_UNCORRECTABLE_ERROR", 6)  # a later line proves the earlier ones were read
        await eventually(lambda: "neuron6" not in h.kubelet.healthy(NEURON))
        assert "neuron4" in h.kubelet.healthy(NEURON)

    @DRIVER_VERSIONS
    async def test_permanent_error_never_recovers(self, start_plugin, driver_version) -> None:  # type: ignore[no-untyped-def]
        h = await start_plugin("trn1.32xlarge", driver_version=driver_version)
        sim.bump_counter(h.root, 3, "sram_ecc_uncorrected")
        await eventually(lambda: "neuron3" not in h.kubelet.healthy(NEURON))
        h.clock.advance(2.0)  # longer than the 1 s quiet period
        await next_health_check(h)
        assert not h.plugin.state.verdict(3).healthy
        assert "neuron3" not in h.kubelet.healthy(NEURON)

    async def test_kernel_line_marks_the_named_device(self, start_plugin) -> None:  # type: ignore[no-untyped-def]
        h = await start_plugin("trn2.48xlarge")
        sim.inject_hw_error(h.root, "NC_UNCORRECTABLE_ERROR", 7, 1)
        await eventually(lambda: "neuron7" not in h.kubelet.healthy(NEURON))
        assert len(h.kubelet.healthy(NEURON)) == 15
        assert h.plugin.state.verdict(7).reason == "kernel NC_UNCORRECTABLE_ERROR nc-id=1"

    async def test_kernel_line_in_a_syslog_file(self, start_plugin, short_tmp) -> None:  # type: ignore[no-untyped-def]
        """--kernel-log-format=syslog: the host's rsyslog file, as the chart's kernelLog.syslogFile wires it."""
        from neuron_driver.kmsg import format_hw_error

        log = short_tmp / "kern.log"
        stamp = time.strftime("%b %e %H:%M:%S")
        line = format_hw_error("NC_UNCORRECTABLE_ERROR", 5, 0, "x")
        # an error of an earlier boot (its stamp before this boot began) is not this boot's
        earlier = time.strftime(
            "%b %e %H:%M:%S", time.localtime(time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) - 3600)
        )
        log.write_text(f"{earlier} ip kernel: [ 9.000000] {format_hw_error('DMA_ERROR', 2, 0, 'y')}\n")
        h = await start_plugin("trn1.32xlarge", "--kernel-log-format", "syslog", "--kmsg-path", str(log))
        with log.open("a") as f:
            f.write(f"{stamp} ip systemd[1]: Started kubelet.\n{stamp} ip kernel: [ 12.000000] {line}\n")
        await eventually(lambda: "neuron5" not in h.kubelet.healthy(NEURON))
        assert h.plugin.state.verdict(5).reason == "kernel NC_UNCORRECTABLE_ERROR nc-id=0"
        assert "neuron2" in h.kubelet.healthy(NEURON)

    async def test_an_unreadable_kernel_log_is_counted_and_counters_still_count(  # type: ignore[no-untyped-def]
        self, start_plugin, short_tmp
    ) -> None:
        """The health pipeline's error policy: a kernel log that cannot be read is counted (and
        logged, and retried), and the counter watch goes on taking devices out."""
        h = await start_plugin("trn1.32xlarge", "--kmsg-path", str(short_tmp / "no-such-kern.log"))
        await eventually(lambda: h.plugin.metrics.errors.labels("kernel_log")._value.get() >= 1)
        sim.bump_counter(h.root, 3, "mem_ecc_uncorrected")
        await eventually(lambda: "neuron3" not in h.kubelet.healthy(NEURON))
        assert h.plugin.metrics.errors.labels("counters")._value.get() == 0

    async def test_a_moved_health_counter_is_logged_and_counted_at_start(self, start_plugin, short_tmp, caplog) -> None:  # type: ignore[no-untyped-def]
        async def move(_: object) -> None:  # the first harness's node, before the plugin reads it
            sim.move_node(short_tmp / "node0", 0, "stats/hardware", "stats/hardware_v2")

        h = await start_plugin("trn2.3xlarge", driver_version="2.30.2.0", before_plugin=move)
        missing = h.plugin.layout.missing
        assert h.plugin.metrics.health_sources_missing._value.get() == len(missing) > 0
        assert "health counters unreadable: stats/hardware/mem_ecc_uncorrected not found on neuron0" in caplog.text
        assert "found at stats/hardware_v2/mem_ecc_uncorrected" in caplog.text

    async def test_the_firmwares_verdict_takes_a_failing_device_out_and_keeps_a_link_fault_in(  # type: ignore[no-untyped-def]
        self, start_plugin
    ) -> None:
        h = await start_plugin("trn2.48xlarge", driver_version="2.30.2.0")
        sim.set_unhealthy_components(h.root, 6, ["link_efa"])  # unfit for multi-node work only
        sim.set_unhealthy_components(h.root, 5, ["hbm"])
        await eventually(lambda: "neuron5" not in h.kubelet.healthy(NEURON))
        assert h.plugin.state.verdict(5).fault == "UNHEALTHY_HBM"
        assert "neuron6" in h.kubelet.healthy(NEURON)
        assert len(h.kubelet.healthy(NEURON)) == 15
        # named on the node: the NeuronNode report (what neuron-scheduler reads) has device 6 unfit for
        # multi-node work and free for work on this node, and device 5 unhealthy
        report = build_report(h.plugin.state, "node-a", dt.datetime.now(dt.UTC))
        assert report.multi_node_unfit == {6}
        assert 6 in report.free_devices
        assert report.unhealthy_devices == {5}

    async def test_a_heartbeat_standing_still_past_the_flag_takes_the_device_out(self, start_plugin) -> None:  # type: ignore[no-untyped-def]
        """--heartbeat-stale-after (the chart's firmwareHeartbeat.staleAfter) is the watch's threshold: with
        the default 300 s this test would wait five minutes."""
        h = await start_plugin("trn2.3xlarge", "--heartbeat-stale-after", "0.5s", driver_version="2.30.2.0")
        assert h.plugin.monitor.watch.heartbeats.stale_after == 0.5
        await next_health_check(h)  # the first value seen
        sim.beat_heartbeat(h.root, 0)
        await next_health_check(h)  # seen to change: from here on, standing still counts
        assert "neuron0" in h.kubelet.healthy(NEURON)
        await eventually(lambda: "neuron0" not in h.kubelet.healthy(NEURON), timeout=5)
        assert h.plugin.state.verdict(0).fault == "HEALTHCHECK_HEARTBEAT_STALE"

    async def test_core_status_counter(self, start_plugin) -> None:  # type: ignore[no-untyped-def]
        h = await start_plugin("trn2.48xlarge", lnc=1)
        sim.bump_counter(h.root, 9, "hw_dma_abort_error", core=3)
        await eventually(lambda: "neuron9" not in h.kubelet.healthy(NEURON))
        # each resource has its own ListAndWatch stream: the cores' list may arrive a moment later
        await eventually(lambda: not {f"neuroncore{72 + i}" for i in range(8)} & h.kubelet.healthy(NEURONCORE))

    async def test_vanished_device_is_unhealthy_not_dropped(self, start_plugin) -> None:  # type: ignore[no-untyped-def]
        h = await start_plugin("inf2.48xlarge")
        sim.vanish(h.root, 4)
        await eventually(lambda: "neuron4" not in h.kubelet.healthy(NEURON))
        assert h.kubelet.capacity(NEURON) == 12
        sim.restore(h.root, 4)
        await next_health_check(h)  # it has seen the device back: the 1 s quiet period starts
        h.clock.advance(1.0)
        await eventually(lambda: "neuron4" in h.kubelet.healthy(NEURON), timeout=5)

    async def test_problem_detector_verdict(self, start_plugin, short_tmp) -> None:  # type: ignore[no-untyped-def]
        from neuron_health.verdicts import boot_id, clear_verdict, write_verdict

        verdicts = short_tmp / "verdicts"
        h = await start_plugin("trn1.32xlarge", "--verdict-dir", str(verdicts))
        write_verdict(verdicts, 6, "NeuronHasError_DMA_ERROR", "from the detector", boot_id(h.root))
        await eventually(lambda: "neuron6" not in h.kubelet.healthy(NEURON))
        write_verdict(verdicts, 7, "NeuronHasError_DMA_ERROR", "from an earlier boot", "another-boot")
        await next_health_check(h)  # it has read the new verdict
        assert h.plugin.state.verdict(7).healthy
        assert "neuron7" in h.kubelet.healthy(NEURON)
        clear_verdict(verdicts, 6)
        await eventually(lambda: "neuron6" in h.kubelet.healthy(NEURON))


async def test_malformed_sysfs_still_serves(start_plugin, short_tmp) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("trn1.32xlarge", wait=False)
    await h.kubelet.wait_registered([NEURON, NEURONCORE])
    (h.root / "sys/devices/virtual/neuron_device/neuron2/stats/hardware/mem_ecc_uncorrected").write_text("garbage\n")
    (h.root / "sys/devices/virtual/neuron_device/neuron2/connected_devices").write_text("?\n")
    await next_health_check(h)  # one reads the garbage,
    await next_health_check(h)  # the next compares with it
    assert len(h.kubelet.healthy(NEURON)) == 16
    assert h.plugin.metrics.errors.labels("counters")._value.get() == 0  # no failed read (pipeline.COUNTERS)


async def test_kubelet_restarts_100_times(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("trn1.32xlarge")
    for _ in range(100):
        await h.kubelet.restart()
        await h.kubelet.wait_registered([NEURON, NEURONCORE], timeout=5)
        assert len(h.kubelet.healthy(NEURONCORE)) == 32
    assert h.kubelet.registrations.count(NEURON) >= 101


class _OtherPlugin(dp_grpc.DevicePluginServicer):
    """Another chart's plugin of the same resource: one device, a stream open until it stops."""

    async def GetDevicePluginOptions(self, request, context):  # type: ignore[no-untyped-def]
        return dp.DevicePluginOptions()

    async def ListAndWatch(self, request, context):  # type: ignore[no-untyped-def]
        yield dp.ListAndWatchResponse(devices=[dp.Device(ID="other0", health=HEALTHY)])
        await asyncio.Event().wait()


async def test_a_plugin_that_replaced_another_registers_again_when_the_other_goes(start_plugin, short_tmp) -> None:  # type: ignore[no-untyped-def]
    """The handover from AWS's chart: its plugin registered the resource first, this one replaced it,
    then its pod went. The device manager then disconnects the client registered under the name,
    this plugin's (the stand-in copies runClient); the plugin registers again, its devices healthy."""
    other = aio.server()
    dp_grpc.add_DevicePluginServicer_to_server(_OtherPlugin(), other)

    async def register_the_other_first(kubelet) -> None:  # type: ignore[no-untyped-def]
        other.add_insecure_port(f"unix://{kubelet.plugin_dir / 'other.sock'}")
        await other.start()
        async with aio.insecure_channel(f"unix://{kubelet.socket}") as ch:
            request = dp.RegisterRequest(version="v1beta1", endpoint="other.sock", resource_name=NEURON)
            await dp_grpc.RegistrationStub(ch).Register(request)
        await kubelet.wait_registered([NEURON])
        assert kubelet.healthy(NEURON) == {"other0"}

    h = await start_plugin("trn1.2xlarge", before_plugin=register_the_other_first)
    assert h.kubelet.registrations.count(NEURON) == 2
    assert h.kubelet.healthy(NEURON) == {"neuron0"}
    await other.stop(0)  # the other plugin's pod goes
    await eventually(lambda: NEURON in h.kubelet.disconnects)
    await eventually(lambda: h.kubelet.registrations.count(NEURON) == 3, timeout=10)
    await h.kubelet.wait_registered([NEURON])
    assert h.kubelet.healthy(NEURON) == {"neuron0"}
    assert h.kubelet.disconnects == [NEURON]  # its new client was not dropped again
    assert h.plugin.metrics.registered.labels(NEURON)._value.get() == 1


async def test_socket_removed_by_a_late_cleanup(start_plugin) -> None:  # type: ignore[no-untyped-def]
    """The kubelet's start-up cleanup deletes a socket the plugin registered in its first seconds."""
    h = await start_plugin("trn1.2xlarge")
    before = h.kubelet.registrations.count(NEURON)
    socket = h.kubelet.endpoints[NEURON].socket
    socket.unlink()
    await eventually(lambda: h.kubelet.registrations.count(NEURON) > before)
    assert socket.is_socket()
    assert h.kubelet.endpoints[NEURON].socket == socket  # the process keeps its one name


async def test_two_plugin_processes_of_one_resource_keep_their_own_sockets(short_tmp) -> None:  # type: ignore[no-untyped-def]
    """A handover or a surge rollout runs two plugins of a resource on one node. Neither may take the
    other's socket, and the one leaving must not take the staying one's with it (gRPC unlinks its
    path when a server stops): the kubelet would dial a path with no listener for 10 s."""
    leaving = ResourceServer(resources.neuron(), short_tmp, _OtherPlugin)
    staying = ResourceServer(resources.neuron(), short_tmp, _OtherPlugin)
    assert leaving.socket != staying.socket
    await leaving.start()
    await staying.start()
    try:
        assert leaving.intact()
        assert staying.intact()
        await leaving.stop(grace=0)
        assert not leaving.socket.exists()
        assert staying.intact()
        async with aio.insecure_channel(f"unix://{staying.socket}") as ch:
            await dp_grpc.DevicePluginStub(ch).GetDevicePluginOptions(dp.Empty(), timeout=5)
    finally:
        await staying.stop(grace=0)


def test_only_sockets_nobody_listens_on_are_removed_as_stale(short_tmp) -> None:  # type: ignore[no-untyped-def]
    import socket as sockets

    def bound(name: str, *, listening: bool) -> sockets.socket:
        s = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
        s.bind(str(short_tmp / name))
        if listening:
            s.listen()
        return s

    live = bound("neuron-neuron-live.sock", listening=True)
    held = [
        live,
        bound("neuron-neuron-dead.sock", listening=False),  # bound, never listening: connects are refused
        bound("neuron-neuron.sock", listening=False),  # the name before each process had its own
        bound("neuron-neuroncore-dead.sock", listening=False),  # another resource's
        bound("neuron-neuron-mine.sock", listening=False),
    ]
    (short_tmp / "neuron-neuron-file.sock").write_text("not a socket")
    try:
        removed = remove_stale_sockets(short_tmp, resources.neuron(), keep=short_tmp / "neuron-neuron-mine.sock")
        assert sorted(p.name for p in removed) == ["neuron-neuron-dead.sock", "neuron-neuron.sock"]
        left = sorted(p.name for p in short_tmp.iterdir())
        assert left == [
            "neuron-neuron-file.sock",
            "neuron-neuron-live.sock",
            "neuron-neuron-mine.sock",
            "neuron-neuroncore-dead.sock",
        ]
    finally:
        for s in held:
            s.close()


async def test_waits_for_a_missing_device_plugin_directory(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("trn1.2xlarge", kubelet=False)
    # each registrar has found no directory, and kept looking rather than given up
    await eventually(lambda: all(r._failures_logged >= 2 for r in h.plugin.registrars))
    assert not h.task.done()
    assert not h.plugin.ready()[0]
    await h.kubelet.start()  # creates the directory and kubelet.sock
    await h.kubelet.wait_registered([NEURON, NEURONCORE], timeout=15)
    assert h.plugin.ready()[0]


async def test_kubelet_that_never_answers(start_plugin) -> None:  # type: ignore[no-untyped-def]
    import socket

    h = await start_plugin("trn1.2xlarge", "--register-timeout", "0.3", kubelet=False)
    h.plugin_dir.mkdir(parents=True, exist_ok=True)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(h.plugin_dir / "kubelet.sock"))  # bound, never listening: connects are refused
    try:
        # a second failed attempt: the first did not end the plugin
        await eventually(lambda: h.plugin.metrics.registration_failures.labels(NEURON)._value.get() >= 2)
        assert not h.task.done()
        assert h.plugin.metrics.registration_failures.labels(NEURON)._value.get() >= 1
        assert not h.plugin.ready()[0]
    finally:
        dead.close()


async def test_http_endpoints(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("trn1.2xlarge")
    port = h.plugin.http.bound_port
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/healthz") as r:
            assert r.status == 200
        async with session.get(f"http://127.0.0.1:{port}/readyz") as r:
            assert r.status == 200
            assert "aws.amazon.com/neuroncore" in await r.text()
        await h.kubelet.allocate(NEURON, 1)
        await eventually(lambda: not h.kubelet.healthy(NEURONCORE))
        async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
            text = await r.text()
    assert 'neuron_device_plugin_registrations_total{resource="aws.amazon.com/neuron"}' in text
    assert 'neuron_device_plugin_allocations_total{resource="aws.amazon.com/neuron"} 1.0' in text
    # the single device is held as a whole, so its two cores are not allocatable
    assert 'neuron_device_plugin_devices{health="Unhealthy",resource="aws.amazon.com/neuroncore"} 2.0' in text


async def test_podresources_up_follows_the_last_list(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("trn1.2xlarge")
    await next_list(h)

    def up() -> float | None:
        return h.plugin.metrics.registry.get_sample_value("neuron_device_plugin_podresources_up")  # type: ignore[no-any-return]

    assert up() == 1
    h.kubelet.bucket.qps = h.kubelet.bucket.tokens = 0.0  # every List refused from now on
    await eventually(lambda: h.plugin.poller.errors["RESOURCE_EXHAUSTED"] >= 1)
    assert up() == 0
    h.kubelet.bucket.qps = 100.0
    await next_list(h)
    assert up() == 1


async def test_64_concurrent_allocates_never_share(start_plugin) -> None:  # type: ignore[no-untyped-def]
    # The Allocates go straight to the plugin, so the kubelet's List never reports them: only the
    # plugin's own pending hand-outs hold the silicon. No List after the start, or one made a second
    # after the first hand-out would settle it as "did not stick" while the last are still coming
    # (under load, 64 calls take seconds), and the whole devices would be offered again.
    h = await start_plugin("trn2.48xlarge", "--holdings-interval", "1h", lnc=1)
    stub = h.kubelet.endpoints[NEURONCORE].stub
    ids = [f"neuroncore{2 * i}" for i in range(64)]

    async def one(core: str) -> dp.AllocateResponse:
        return await stub.Allocate(
            dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=[core])])
        )

    results = await asyncio.gather(*(one(c) for c in ids))
    assert sorted(r.container_responses[0].envs["NEURON_RT_VISIBLE_CORES"] for r in results) == sorted(
        str(2 * i) for i in range(64)
    )
    # every one of those is now held: the whole devices are not offered any more
    await eventually(lambda: not h.kubelet.healthy(NEURON))


async def test_neurondevice_alias_and_prefix(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("inf2.xlarge", "--neurondevice-alias", "--resource-prefix", "example.com", wait=False)
    await h.kubelet.wait_registered(["example.com/neuron", "example.com/neuroncore", "example.com/neurondevice"])
    await h.kubelet.allocate("example.com/neurondevice", 1)
    await eventually(lambda: not h.kubelet.healthy("example.com/neuron"))  # same silicon as the alias


async def test_cdi_mode(start_plugin, short_tmp) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("inf2.24xlarge", "--cdi", "--cdi-spec-dir", str(short_tmp / "cdi"))
    spec = json.loads((short_tmp / "cdi" / "aws.amazon.com-neuron.json").read_text())
    assert spec["kind"] == "aws.amazon.com/neuron"
    assert [d["name"] for d in spec["devices"]] == [f"neuron{i}" for i in range(6)]
    response = await h.kubelet.allocate(NEURON, 2)
    assert sorted(d.name for d in response.cdi_devices) == [
        "aws.amazon.com/neuron=neuron0",
        "aws.amazon.com/neuron=neuron1",
    ]
    assert not response.devices


async def test_cdi_spec_gone_is_written_again_and_one_it_cannot_write_refuses_the_allocate(  # type: ignore[no-untyped-def]
    start_plugin, short_tmp
) -> None:
    """The runtime resolves the names only from the spec on disk, when it creates the container: an
    Allocate must not answer with names no spec holds."""
    spec_dir = short_tmp / "cdi"
    h = await start_plugin("inf2.24xlarge", "--cdi", "--cdi-spec-dir", str(spec_dir))
    spec_file = spec_dir / "aws.amazon.com-neuron.json"
    written = spec_file.read_text()
    spec_file.unlink()  # the tmpfs emptied under the running plugin
    response = await h.kubelet.allocate(NEURON, 1)
    assert len(response.cdi_devices) == 1
    assert response.cdi_devices[0].name.startswith("aws.amazon.com/neuron=neuron")
    assert spec_file.read_text() == written
    assert [d["name"] for d in json.loads(written)["devices"]] == [f"neuron{i}" for i in range(6)]

    spec_file.unlink()
    spec_dir.rmdir()
    spec_dir.write_text("")  # a file where the directory was: the spec cannot be written
    with pytest.raises(AdmissionError, match=f"Allocate failed: INTERNAL: cannot write the CDI spec {spec_file}"):
        await h.kubelet.allocate(NEURON, 1, pod="second")
    assert h.plugin.metrics.errors.labels("cdi_spec")._value.get() == 1
    assert h.plugin.metrics.allocations.labels(NEURON)._value.get() == 1  # the refused call holds nothing


def test_the_cdi_spec_is_written_only_when_gone_or_the_devices_changed(tmp_path: Path) -> None:
    from neuron_device_plugin.cdi import SpecKeeper

    keeper = SpecKeeper(tmp_path, "aws.amazon.com", Path("/"))
    assert keeper.ensure([0, 1])
    before = keeper.path.stat().st_mtime_ns
    assert not keeper.ensure([1, 0])
    assert keeper.path.stat().st_mtime_ns == before
    assert keeper.ensure([0, 1, 2])  # a driver reload showed another device
    assert [d["name"] for d in json.loads(keeper.path.read_text())["devices"]] == ["neuron0", "neuron1", "neuron2"]
    keeper.path.unlink()
    assert keeper.ensure([0, 1, 2])
    assert keeper.path.exists()


async def test_shutdown_removes_sockets(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("trn1.2xlarge")
    assert await h.shutdown() == 0
    assert not list(h.plugin_dir.glob("neuron-*.sock"))
    await eventually(lambda: not h.kubelet.healthy(NEURON))  # the kubelet sees the stream end


async def test_after_sigterm_the_kubelet_is_answered_until_the_drain_settles(start_plugin) -> None:  # type: ignore[no-untyped-def]
    """The kubelet drops its connection, and the Allocate on it, the moment ListAndWatch ends: a pod
    bound just before the stop must still be admitted (drain.py)."""
    h = await start_plugin("trn1.2xlarge", "--shutdown-drain", "0.5")
    h.stop.set()
    await asyncio.sleep(0.05)  # the loops have seen the stop
    response = await h.kubelet.allocate(NEURON, 1, pod="bound-before-the-stop")
    assert len(response.devices) == 1
    assert h.kubelet.healthy(NEURON)  # the stream is still open: the kubelet has not disconnected
    assert not h.task.done()
    assert await asyncio.wait_for(h.task, 10) == 0
    assert not list(h.plugin_dir.glob("neuron-*.sock"))
    await eventually(lambda: not h.kubelet.healthy(NEURON))


async def test_a_dead_loop_fails_the_probes_and_the_process(start_plugin, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("trn1.2xlarge")

    def corrupt(*_: object) -> None:
        raise RuntimeError("holdings table corrupt")

    # the holdings loop has no per-tick guard: an error from its callback ends it
    code, probes = await break_loop_and_probe(
        h.plugin.http, h.task, lambda: monkeypatch.setattr(h.plugin.state, "set_kubelet_holdings", corrupt)
    )
    assert code == 1
    dead = "loop holdings failed: RuntimeError: holdings table corrupt\n"
    assert probes == {"/healthz": (503, dead), "/readyz": (503, dead)}
    assert not list(h.plugin_dir.glob("neuron-*.sock"))  # the other loops wound down cleanly


async def test_list_and_watch_sends_complete_lists(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin("inf2.24xlarge")
    async with aio.insecure_channel(f"unix://{h.kubelet.endpoints[NEURON].socket}") as ch:
        stub = dp_grpc.DevicePluginStub(ch)
        stream = stub.ListAndWatch(dp.Empty())
        first = await stream.read()
        assert [d.ID for d in first.devices] == [f"neuron{i}" for i in range(6)]
        sim.bump_counter(h.root, 1, "mem_ecc_uncorrected")
        second = await asyncio.wait_for(stream.read(), 3)
        assert len(second.devices) == 6
        assert {d.ID: d.health for d in second.devices}["neuron1"] == UNHEALTHY
        assert sum(d.health == HEALTHY for d in second.devices) == 5
        stream.cancel()


def test_socket_paths_fit_a_unix_socket_address(short_tmp) -> None:  # type: ignore[no-untyped-def]
    """sun_path holds 107 bytes: the longest resource's socket, with a process's random instance,
    fits under the kubelet's directory and under the tests' own."""
    for resource in (resources.neuron(), resources.neuroncore(), resources.neurondevice()):
        instance = ResourceServer(resource, Path(layout.DEVICE_PLUGIN_DIR), _OtherPlugin).socket.name
        assert len(layout.DEVICE_PLUGIN_DIR + instance) < 100
        assert len(str(short_tmp / "dp0" / instance)) < 100
