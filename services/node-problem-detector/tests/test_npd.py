"""The detector end to end on a simulated node against the API-server stand-in.

STAND-IN: tests/standins/apiserver.py implements the Node and Event endpoints the detector
uses, with the real server's strategic-merge semantics; the real kube-apiserver is used by
the cluster tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from broken_loop import break_loop_and_probe
from flag_errors import refusal
from polling import until_async
from standins.apiserver import FakeApiServer, serving

from neuron_driver.kmsg import KERN_ERR, format_hw_error, format_record
from neuron_health import pipeline, verdicts
from neuron_health.kernel_log import KmsgFollower
from neuron_model import node_health
from neuron_problem_detector import app
from neuron_problem_detector import config as config_mod
from neuron_problem_detector import rules as rules_mod
from neuron_problem_detector.app import Detector
from neuron_problem_detector.detector import load_state, save_state
from neuron_sim import node as sim

NODE = "sim-node-1"


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with serving(NODE) as server:
        yield server


@pytest.fixture
def node(tmp_path: Path) -> Path:
    sim.create(tmp_path / "node", "trn1.32xlarge")
    return tmp_path / "node"


# The driver generations the simulator writes (driver_layout.SIMULATED), by sim.GENERATION_VERSIONS' version of
# each: the counter tests below run on every one, the rest on the default tree (before 2.28).
@pytest.fixture(params=list(sim.GENERATION_VERSIONS.values()), ids=list(sim.GENERATION_VERSIONS))
def generation_node(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    sim.create(tmp_path / "node", "trn1.32xlarge", driver_version=request.param)
    return tmp_path / "node"


def start(
    tmp_path: Path, node: Path, api: FakeApiServer, *args: str
) -> tuple[Detector, asyncio.Event, asyncio.Task[int]]:
    cfg = config_mod.parse(
        ["--host-root", str(node), "--node-name", NODE, "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")),
         "--listen", "127.0.0.1:0", "--counter-interval", "0.1", "--heartbeat", "3600",
         "--state-file", str(tmp_path / "state.json"), "--verdict-dir", str(tmp_path / "verdicts"), *args],
        env={},
    )  # fmt: skip
    stop = asyncio.Event()
    detector = Detector(cfg, stop)  # its client from --kubeconfig, as the process makes it
    return detector, stop, asyncio.create_task(detector.run())


@contextlib.asynccontextmanager
async def running(tmp_path: Path, node: Path, api: FakeApiServer, *args: str) -> AsyncIterator[Detector]:
    detector, stop, task = start(tmp_path, node, api, *args)
    try:
        yield detector
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def eventually(predicate: Callable[[], object], timeout: float = 8.0) -> None:
    await until_async(predicate, timeout=timeout)


def status(api: FakeApiServer) -> tuple[str, str] | None:
    c = api.condition(NODE, "NeuronHealth")
    return None if c is None else (c["status"], c["reason"])


@pytest.mark.parametrize(
    "kind", ["SRAM_UNCORRECTABLE_ERROR", "NC_UNCORRECTABLE_ERROR", "HBM_UNCORRECTABLE_ERROR", "DMA_ERROR",
             "HBM_REPAIRABLE_UNCORRECTABLE_ERROR"],
)  # fmt: skip
async def test_each_error_kind(tmp_path: Path, node: Path, api: FakeApiServer, kind: str) -> None:
    async with running(tmp_path, node, api) as det:
        await eventually(lambda: status(api) == ("False", "NeuronHasNoError"))
        sim.inject_hw_error(node, kind, 5, 1)
        await eventually(lambda: status(api) == ("True", f"NeuronHasError_{kind}"))
        await eventually(api.event_list)
        metrics = await scrape(det)
    [event] = api.event_list()
    assert event["involvedObject"]["kind"] == "Node"
    assert event["involvedObject"]["name"] == NODE
    assert event["reason"] == f"NeuronHasError_{kind}"
    assert f"neuron5 nc-id=1 serial={sim.serial_for('trn1.32xlarge', 5)}" in event["message"]
    assert event["type"] == "Warning"
    assert api.condition(NODE, "Ready") is not None  # the kubelet's condition survived the patch
    assert all(ct == "application/strategic-merge-patch+json" for m, p, ct in api.requests if p.endswith("/status"))
    assert (tmp_path / "verdicts" / "neuron5.json").exists()
    assert f'problem_gauge{{reason="NeuronHasError_{kind}",type="NeuronHealth"}} 1.0' in metrics
    assert f'problem_counter_total{{reason="NeuronHasError_{kind}"}} 1.0' in metrics


async def scrape(det: Detector) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{det.http.bound_port}/metrics") as r:
        return await r.text()


def test_the_heartbeat_threshold_is_its_flags_env_twin(tmp_path: Path, node: Path, api: FakeApiServer) -> None:
    """NEURON_NPD_HEARTBEAT_STALE_AFTER (--heartbeat-stale-after, the chart's firmwareHeartbeat.staleAfter) is
    the counter watch's; the default is the pipeline's."""
    args = ["--host-root", str(node), "--node-name", NODE, "--kubeconfig", str(api.kubeconfig(tmp_path / "kc")),
            "--state-file", str(tmp_path / "state.json"), "--verdict-dir", str(tmp_path / "verdicts")]  # fmt: skip
    set_by_env = config_mod.parse(args, env={"NEURON_NPD_HEARTBEAT_STALE_AFTER": "45s"})
    assert Detector(set_by_env, asyncio.Event()).counters.heartbeats.stale_after == 45
    assert Detector(config_mod.parse(args, env={}), asyncio.Event()).counters.heartbeats.stale_after == (
        pipeline.HEARTBEAT_STALE_AFTER
    )


async def test_counters_growing(tmp_path: Path, generation_node: Path, api: FakeApiServer) -> None:
    node = generation_node
    async with running(tmp_path, node, api) as det:
        assert det.layout.ok, det.layout.lines()
        await eventually(lambda: status(api) == ("False", "NeuronHasNoError"))
        sim.bump_counter(node, 9, "mem_ecc_repairable_uncorrected", by=2)
        await eventually(lambda: status(api) == ("True", "NeuronHasError_HBM_REPAIRABLE_UNCORRECTABLE_ERROR"))
        # the Event is sent after the condition: wait for it rather than race the reporter
        await eventually(lambda: any("rose from 0 to 2" in e["message"] for e in api.event_list()))
        # the driver is reloaded: its counters start again from zero, and a reload mends this kind
        sim.reload_driver(node)
        await eventually(lambda: status(api) == ("False", "NeuronHasNoError"))
        await eventually(lambda: any(e["reason"].endswith("Cleared") for e in api.event_list()))
    assert not (tmp_path / "verdicts" / "neuron9.json").exists()


async def test_a_reload_does_not_clear_what_needs_a_new_instance(
    tmp_path: Path, generation_node: Path, api: FakeApiServer
) -> None:
    node = generation_node
    async with running(tmp_path, node, api) as det:
        sim.bump_counter(node, 9, "mem_ecc_uncorrected")
        sim.inject_fault(node, "NC_UNCORRECTABLE_ERROR", 2, via="core-counter", core=1)
        await eventually(lambda: len(verdicts.read_verdicts(tmp_path / "verdicts", node)) == 2)
        sim.reload_driver(node)
        for _ in range(5):  # five counter reads, without waiting out their interval
            det.check_counters()
        await eventually(lambda: det.reporter.up_to_date)
        assert status(api)[0] == "True"
        assert set(verdicts.read_verdicts(tmp_path / "verdicts", node)) == {2, 9}


def sources(api: FakeApiServer) -> dict[str, Any] | None:
    return api.condition(NODE, node_health.SOURCES_MISSING_CONDITION)


async def test_a_moved_counter_directory_is_said_on_the_node_not_read_as_healthy(
    tmp_path: Path, api: FakeApiServer
) -> None:
    """Said as an Event and as the condition NeuronHealthSourcesMissing, which stays True for as long as the
    counters are missing (past any Event's expiry) and goes back to False when they are read again. It is
    about the detector's sources, not the hardware: NeuronHealth keeps its word, and with --taint and
    --cordon the node is neither tainted nor cordoned for it."""
    node = tmp_path / "node"
    sim.create(node, "trn2.3xlarge", driver_version="2.30.2.0")
    sim.move_node(node, 0, "stats/hardware", "stats/hardware_v2")  # as a driver that moved the node shows it
    async with running(tmp_path, node, api, "--taint", "--cordon") as det:
        await eventually(lambda: any(e["reason"] == "NeuronHealthCountersUnreadable" for e in api.event_list()))
        await eventually(lambda: det.reporter.up_to_date)
        condition = dict(sources(api) or {})  # a copy: the stand-in's object changes with the next patch
        health = status(api)
        spec = dict(api.nodes[NODE]["spec"])
        metrics = await scrape(det)
        ready = det.ready()[1]
        sim.move_node(node, 0, "stats/hardware_v2", "stats/hardware")  # the driver's layout is known again
        await eventually(lambda: (sources(api) or {}).get("status") == "False")
        await eventually(lambda: det.reporter.up_to_date)
        recovered = sources(api)
        metrics_after = await scrape(det)
    [event] = [e for e in api.event_list() if e["reason"] == "NeuronHealthCountersUnreadable"]
    assert event["type"] == "Warning"
    assert event["message"].startswith("health counters unreadable on driver 2.30.2.0: ")
    assert "stats/hardware/mem_ecc_uncorrected on neuron0 (directory stats/hardware gone" in event["message"]
    assert (condition["status"], condition["reason"]) == ("True", "NeuronHealthCountersUnreadable")
    # what could not be read, on the node for as long as it lasts (both cut at 1,024 characters)
    assert condition["message"][:1000] == event["message"][:1000]
    assert health == (
        "False",
        "NeuronHasNoError",
    )  # no hardware error is known; the other condition says what is not read
    assert "taints" not in spec
    assert not spec.get("unschedulable")
    assert f"neuron_npd_health_sources_missing {float(11)}" in metrics  # 3 + 2 + 4 + 2 paths of device 0
    gauge = 'problem_gauge{reason="NeuronHealthCountersUnreadable",type="NeuronHealthSourcesMissing"}'
    assert f"{gauge} 1.0" in metrics
    assert "health counters unreadable: " in ready
    assert recovered is not None
    assert (recovered["status"], recovered["reason"]) == ("False", "NeuronHealthSourcesFound")
    assert "neuron_npd_health_sources_missing 0.0" in metrics_after
    assert f"{gauge} 0.0" in metrics_after
    [cleared] = [e for e in api.event_list() if e["reason"] == "NeuronHealthCountersUnreadableCleared"]
    assert cleared["type"] == "Normal"
    assert "stats/hardware/mem_ecc_uncorrected on neuron0" in cleared["message"]


async def test_a_driver_reloaded_into_a_layout_with_a_moved_node_sets_the_condition(
    tmp_path: Path, api: FakeApiServer
) -> None:
    """Checked again on a new inventory: a node healthy at start whose driver comes back with a moved node."""
    node = tmp_path / "node"
    sim.create(node, "trn2.3xlarge", driver_version="2.30.2.0")
    async with running(tmp_path, node, api) as det:
        await eventually(lambda: (sources(api) or {}).get("reason") == "NeuronHealthSourcesFound")
        sim.vanish(node, 0)  # the driver unloads the device ...
        await eventually(lambda: not det.inventory.devices)  # seen gone: a new inventory
        stashed = node / sim.VANISHED_DIR / "neuron0"
        (stashed / "stats/hardware").rename(stashed / "stats/hardware_v2")
        sim.restore(node, 0)  # ... and comes back with stats/hardware moved
        await eventually(lambda: (sources(api) or {}).get("status") == "True")
        condition = sources(api)
    assert condition is not None
    assert condition["reason"] == "NeuronHealthCountersUnreadable"
    assert "stats/hardware/mem_ecc_uncorrected on neuron0 (directory stats/hardware gone" in condition["message"]


async def test_the_firmwares_verdict_sets_the_condition_and_a_link_fault_only_an_event(
    tmp_path: Path, api: FakeApiServer
) -> None:
    node = tmp_path / "node"
    sim.create(node, "trn2.48xlarge", driver_version="2.30.2.0")
    async with running(tmp_path, node, api):
        await eventually(lambda: status(api) == ("False", "NeuronHasNoError"))
        sim.set_unhealthy_components(node, 6, ["link_efa"])
        await eventually(lambda: any(e["reason"] == "NeuronUnhealthy_LINK_EFA" for e in api.event_list()))
        assert status(api) == ("False", "NeuronHasNoError")  # the device serves work on this node
        sim.set_unhealthy_components(node, 5, ["hbm"])
        await eventually(lambda: status(api) == ("True", "NeuronHasError_UNHEALTHY_HBM"))
    [link] = [e for e in api.event_list() if e["reason"] == "NeuronUnhealthy_LINK_EFA"]
    assert "neuron6" in link["message"]
    assert set(verdicts.read_verdicts(tmp_path / "verdicts", node)) == {5}


async def test_flood_of_unrelated_lines_and_garbage(tmp_path: Path, node: Path, api: FakeApiServer) -> None:
    async with running(tmp_path, node, api) as det:
        await eventually(lambda: status(api) == ("False", "NeuronHasNoError"))
        sim.append_kmsg_many(node, [f"eth0: unrelated message {i}" for i in range(100_000)])
        sim.append_raw_kmsg(node, "complete garbage without a header\n\x00\x01;;\n")
        sim.inject_hw_error(node, "NC_UNCORRECTABLE_ERROR", 2, 0)
        await eventually(lambda: status(api) == ("True", "NeuronHasError_NC_UNCORRECTABLE_ERROR"), timeout=30)
        metrics = await scrape(det)
    assert len(api.event_list()) == 1  # the unrelated lines made no Event
    assert "neuron_npd_kmsg_malformed_total 2.0" in metrics
    assert det.metrics.kmsg_records._value.get() >= 100_001


async def test_temporary_rule_is_an_event_only(tmp_path: Path, node: Path, api: FakeApiServer) -> None:
    async with running(tmp_path, node, api) as det:
        await eventually(lambda: status(api) == ("False", "NeuronHasNoError"))
        for _ in range(3):
            sim.append_kmsg(node, "neuron:ndma: DMA completion timeout on nd04 queue 1", KERN_ERR)
        await eventually(lambda: api.event_list() and api.event_list()[0].get("count", 1) >= 2)
        # all three lines are in, and whatever they made has reached the API server
        await eventually(lambda: sum(e.get("count", 1) for e in api.event_list()) >= 3 and det.reporter.up_to_date)
    events = api.event_list()
    assert [e["reason"] for e in events] == ["NeuronDMACompletionTimeout"]  # de-duplicated into one
    assert status(api) == ("False", "NeuronHasNoError")


async def test_api_server_down_for_a_while(tmp_path: Path, node: Path, api: FakeApiServer) -> None:
    async with running(tmp_path, node, api) as det:
        await eventually(lambda: status(api) == ("False", "NeuronHasNoError"))
        await api.down()
        sim.inject_hw_error(node, "SRAM_UNCORRECTABLE_ERROR", 0, 0)
        sim.append_kmsg(node, "neuron: nd01: reset request 3 failed", KERN_ERR)
        await eventually(lambda: not det.reporter.api_up)
        await eventually(lambda: len(det.reporter.pending) == 2)
        failures = sum(det.reporter.api_errors.values())
        await eventually(lambda: sum(det.reporter.api_errors.values()) > failures)  # another try failed
        assert len(det.reporter.pending) == 2  # kept, bounded, waiting
        await api.up()
        await eventually(lambda: status(api) == ("True", "NeuronHasError_SRAM_UNCORRECTABLE_ERROR"), timeout=40)
        await eventually(lambda: len(api.event_list()) == 2, timeout=40)
    assert {e["reason"] for e in api.event_list()} == {"NeuronHasError_SRAM_UNCORRECTABLE_ERROR", "NeuronResetFailed"}


def count_kmsg_waits(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """How many times a kernel-log follower found nothing new and waited: once it has, every record
    it was going to replay has been read and handed on."""
    waits = 0
    wait = KmsgFollower._sleep

    async def counted(self: KmsgFollower, stop: asyncio.Event) -> None:
        nonlocal waits
        waits += 1
        await wait(self, stop)

    monkeypatch.setattr(KmsgFollower, "_sleep", counted)
    return lambda: waits


async def test_restart_on_the_same_boot_and_after_a_reboot(
    tmp_path: Path, node: Path, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(tmp_path, node, api):
        sim.inject_hw_error(node, "HBM_UNCORRECTABLE_ERROR", 3, 0)
        await eventually(lambda: status(api) == ("True", "NeuronHasError_HBM_UNCORRECTABLE_ERROR"))
    transition = api.condition(NODE, "NeuronHealth")["lastTransitionTime"]  # type: ignore[index]
    # restart on the same boot, with no look-back: the True is kept from the state file
    kmsg_waits = count_kmsg_waits(monkeypatch)
    async with running(tmp_path, node, api, "--lookback", "0") as det:
        await eventually(lambda: kmsg_waits() >= 1 and det.reporter.up_to_date)
        assert status(api) == ("True", "NeuronHasError_HBM_UNCORRECTABLE_ERROR")
        assert api.condition(NODE, "NeuronHealth")["lastTransitionTime"] == transition  # type: ignore[index]
    assert len(api.event_list()) == 1  # the replayed line was not reported twice
    # the node reboots: a new boot id, a fresh kernel log; the stale True is cleared at start
    sim.reboot(node)
    async with running(tmp_path, node, api):
        await eventually(lambda: status(api) == ("False", "NeuronHasNoError"))
    assert not (tmp_path / "verdicts" / "neuron3.json").exists()


async def test_a_line_that_made_only_an_event_is_not_reported_again_after_a_crash(
    tmp_path: Path, node: Path, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state.json"
    async with running(tmp_path, node, api) as det:
        await eventually(lambda: status(api) == ("False", "NeuronHasNoError"))
        sim.append_kmsg(node, "neuron: nd01: reset request 3 failed", KERN_ERR)
        await eventually(lambda: len(api.event_list()) == 1 and det.reporter.up_to_date)
        on_disk = state.read_bytes()  # what a crash now leaves: no clean shutdown's save
    state.write_bytes(on_disk)
    kmsg_waits = count_kmsg_waits(monkeypatch)
    async with running(tmp_path, node, api) as det:  # the default look-back replays the line
        await eventually(lambda: kmsg_waits() >= 1 and det.reporter.up_to_date)
    assert [e.get("count", 1) for e in api.event_list()] == [1]


async def test_a_restart_on_the_same_boot_measures_the_counters_from_where_it_left_them(
    tmp_path: Path, node: Path, api: FakeApiServer
) -> None:
    async with running(tmp_path, node, api):
        sim.bump_counter(node, 3, "mem_ecc_uncorrected")
        sim.bump_counter(node, 9, "mem_ecc_repairable_uncorrected", by=2)
        await eventually(lambda: len(verdicts.read_verdicts(tmp_path / "verdicts", node)) == 2)
        await eventually(lambda: len(api.event_list()) == 2)
    # restarted: the counters it saw before are not news again
    async with running(tmp_path, node, api) as det:
        for _ in range(3):
            det.check_counters()
        await eventually(lambda: det.reporter.up_to_date)
    assert len(api.event_list()) == 2
    # the driver is reloaded while the detector is away: what a reload mends is cleared when it is back
    sim.reload_driver(node)
    async with running(tmp_path, node, api):
        await eventually(lambda: set(verdicts.read_verdicts(tmp_path / "verdicts", node)) == {3})
    assert status(api) == ("True", "NeuronHasError_HBM_UNCORRECTABLE_ERROR")


async def test_a_counter_read_writes_the_state_file_once(
    tmp_path: Path, node: Path, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read whose counters grew and made a problem, or only an Event, saves the state once with the
    counters in it, not again for them; an unchanged read saves nothing."""
    det, stop, task = start(tmp_path, node, api)
    stop.set()
    await asyncio.wait_for(task, 15)
    writes: list[Path] = []
    monkeypatch.setattr(app, "save_state", lambda path, state: (writes.append(path), save_state(path, state)))
    det.check_counters()
    before = len(writes)
    sim.bump_counter(node, 4, "mem_ecc_uncorrected")
    det.check_counters()
    assert det.state.unhealthy_devices().keys() == {4}
    assert len(writes) == before + 1
    det.check_counters()
    assert len(writes) == before + 1
    sim.inject_fault(node, "HANG_ON_COLLECTIVES", 6, via="core-counter", core=0)  # an Event, no problem
    det.check_counters()
    assert det.reporter.pending
    assert len(writes) == before + 2
    assert load_state(tmp_path / "state.json")[0].counters == det.state.counters


@pytest.mark.parametrize("remediation", [["--taint", "--cordon"], []])
async def test_remediation_on_and_off(tmp_path: Path, node: Path, api: FakeApiServer, remediation: list[str]) -> None:
    async with running(tmp_path, node, api, *remediation) as det:
        sim.bump_counter(node, 1, "mem_ecc_repairable_uncorrected")
        await eventually(lambda: status(api) == ("True", "NeuronHasError_HBM_REPAIRABLE_UNCORRECTABLE_ERROR"))
        await eventually(lambda: det.reporter.up_to_date)
        spec = api.nodes[NODE]["spec"]
        if remediation:
            assert spec["taints"] == [
                {"key": "aws.amazon.com/neuron-unhealthy", "value": "true", "effect": "NoSchedule"}
            ]
            assert spec["unschedulable"] is True
        else:
            assert "taints" not in spec
            assert "unschedulable" not in spec
        sim.reload_driver(node)
        await eventually(lambda: status(api) == ("False", "NeuronHasNoError"))
        await eventually(lambda: det.reporter.up_to_date)
    spec = api.nodes[NODE]["spec"]
    assert spec.get("taints", []) == []
    assert not spec.get("unschedulable", False)


async def test_an_admins_cordon_is_left_alone(tmp_path: Path, node: Path, api: FakeApiServer) -> None:
    api.nodes[NODE]["spec"]["unschedulable"] = True  # cordoned by someone else
    async with running(tmp_path, node, api, "--cordon") as det:
        sim.bump_counter(node, 1, "mem_ecc_repairable_uncorrected")
        await eventually(lambda: status(api) == ("True", "NeuronHasError_HBM_REPAIRABLE_UNCORRECTABLE_ERROR"))
        sim.reload_driver(node)
        await eventually(lambda: status(api) == ("False", "NeuronHasNoError"))
        await eventually(lambda: det.reporter.up_to_date)
    assert api.nodes[NODE]["spec"]["unschedulable"] is True


async def test_verdicts_reach_the_device_plugin_format(tmp_path: Path, node: Path, api: FakeApiServer) -> None:
    async with running(tmp_path, node, api):
        sim.inject_hw_error(node, "DMA_ERROR", 11, 0)
        await eventually((tmp_path / "verdicts" / "neuron11.json").exists)
    assert verdicts.read_verdicts(tmp_path / "verdicts", node) == {11: "NeuronHasError_DMA_ERROR"}


async def test_a_verdict_says_since_when_its_device_is_unhealthy(
    tmp_path: Path, node: Path, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from neuron_problem_detector import app

    clock = [time.time() - 3600]
    monkeypatch.setattr(app, "wall_now", lambda: clock[0])
    async with running(tmp_path, node, api):
        sim.inject_hw_error(node, "DMA_ERROR", 11, 0)
        await eventually((tmp_path / "verdicts" / "neuron11.json").exists)
        clock[0] += 600
        sim.inject_hw_error(node, "DMA_ERROR", 5, 0)  # another device's problem: verdicts written again
        await eventually((tmp_path / "verdicts" / "neuron5.json").exists)

    def since(device: int) -> float:
        stamp = json.loads((tmp_path / "verdicts" / f"neuron{device}.json").read_text())["since"]
        return dt.datetime.fromisoformat(stamp).timestamp()

    assert (since(11), since(5)) == (int(clock[0] - 600), int(clock[0]))


async def test_a_dead_loop_fails_the_probes_and_the_process(
    tmp_path: Path, node: Path, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    detector, _, task = start(tmp_path, node, api)
    await eventually(lambda: status(api) == ("False", "NeuronHasNoError"))

    def corrupt(*_: object) -> None:
        raise RuntimeError("counter table corrupt")

    # the counter loop has no per-tick guard: an error while matching ends it
    code, probes = await break_loop_and_probe(
        detector.http, task, lambda: monkeypatch.setattr(rules_mod, "match_counters", corrupt)
    )
    assert code == 1
    dead = "loop counters failed: RuntimeError: counter table corrupt\n"
    assert probes == {"/healthz": (503, dead), "/readyz": (503, dead)}


async def test_a_failed_counter_read_is_counted_and_retried(
    tmp_path: Path, node: Path, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the health pipeline's error policy, the device plugin's and the DRA driver's too: a read that
    # fails does not end the counter watch
    async with running(tmp_path, node, api) as det:
        await eventually(lambda: status(api) == ("False", "NeuronHasNoError"))
        real_read, failures = det.counters.read, 3

        def failing_read() -> pipeline.CounterRead:
            nonlocal failures
            if failures:
                failures -= 1
                raise OSError(5, "Input/output error")
            return real_read()

        monkeypatch.setattr(det.counters, "read", failing_read)
        await eventually(lambda: failures == 0)
        sim.bump_counter(node, 9, "mem_ecc_repairable_uncorrected")
        await eventually(lambda: status(api) == ("True", "NeuronHasError_HBM_REPAIRABLE_UNCORRECTABLE_ERROR"))
        metrics = await scrape(det)
    assert 'neuron_npd_read_errors_total{source="counters"} 3.0' in metrics


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "neuron_problem_detector", *args],
        capture_output=True, text=True, timeout=30, check=False,
        env={k: v for k, v in {**os.environ, **(env or {})}.items() if k != "NODE_NAME" or env},
    )  # fmt: skip


@pytest.mark.integration
def test_cli_errors(tmp_path: Path) -> None:
    out = run_cli("--help")
    assert out.returncode == 0
    assert "NEURON_NPD_KMSG_PATH" in out.stdout
    out = run_cli()
    assert out.returncode == 2
    assert "pass --node-name or set NODE_NAME" in out.stderr
    bad = tmp_path / "rules.yaml"
    bad.write_text("conditions: []\nrules: []\n")
    out = run_cli("--node-name", "n", "--rules", str(bad))
    assert out.returncode == 2
    assert "conditions: must be a non-empty list" in out.stderr


@pytest.mark.integration
def test_no_credentials_is_a_clear_error_at_start(tmp_path: Path) -> None:
    out = run_cli("--node-name", NODE, env={"KUBERNETES_SERVICE_HOST": "", "KUBERNETES_SERVICE_PORT": ""})
    assert out.returncode == 2
    assert "cannot reach the API server through the in-cluster service account" in out.stderr
    assert "outside a pod, pass --kubeconfig" in out.stderr
    out = run_cli("--node-name", NODE, "--kubeconfig", str(tmp_path / "missing"))
    assert out.returncode == 2
    assert f"cannot reach the API server through --kubeconfig {tmp_path / 'missing'}" in out.stderr


DURATIONS = {
    "--lookback": "lookback",
    "--counter-interval": "counter_interval",
    "--heartbeat": "heartbeat",
    "--heartbeat-stale-after": "heartbeat_stale_after",
    "--reset-timeout": "reset_timeout",
    "--validation-window": "validation_window",
    "--validation-timeout": "validation_timeout",
}


def test_every_duration_flag_is_listed_here() -> None:
    assert set(re.findall(r"(--[\w-]+) DURATION", config_mod.parser({}).format_help())) == set(DURATIONS)


@pytest.mark.parametrize("flag", sorted(DURATIONS))
def test_durations_are_written_the_kubernetes_way(flag: str) -> None:
    variable = config_mod.parser({}).env_name(flag)
    assert getattr(config_mod.parse(["--node-name", NODE, flag, "500ms"], env={}), DURATIONS[flag]) == 0.5
    assert getattr(config_mod.parse(["--node-name", NODE], env={variable: "500ms"}), DURATIONS[flag]) == 0.5


@pytest.mark.integration
def test_duration_defaults_and_zero_lookback() -> None:
    cfg = config_mod.parse(["--node-name", NODE], env={})
    assert (cfg.lookback, cfg.counter_interval, cfg.heartbeat) == (300.0, 5.0, 60.0)
    assert config_mod.parse(["--node-name", NODE, "--lookback", "0s"], env={}).lookback == 0.0
    out = run_cli("--node-name", NODE, "--counter-interval", "0s")
    assert out.returncode == 2
    assert "--counter-interval: must be greater than 0, got '0s'" in out.stderr


def test_kmsg_records_format_used_by_the_flood() -> None:
    assert format_record(KERN_ERR, 1, 2, "x") == "3,1,2,-;x\n"


# -- a syslog text file instead of /dev/kmsg (--kernel-log-format=syslog) ---------------------------------


def iso_line(text: str, printk: float = 123.456789) -> str:
    """A line as rsyslog's high-precision FileFormat writes it (Debian 12)."""
    return f"{dt.datetime.now(dt.UTC).isoformat()} ip-10-0-0-1 kernel: [{printk:12.6f}] {text}\n"


def traditional_line(text: str) -> str:
    """A line as rsyslog's traditional format writes it (Ubuntu's kern.log, Amazon Linux 2's messages):
    local time, no year, no zone (the simulated node has no etc/localtime: this process's zone)."""
    return f"{time.strftime('%b %e %H:%M:%S')} ip-10-0-0-1 kernel: {text}\n"


def append_text(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


async def test_a_fault_line_in_a_syslog_file_through_rotation(tmp_path: Path, node: Path, api: FakeApiServer) -> None:
    log = tmp_path / "var" / "log" / "kern.log"
    log.parent.mkdir(parents=True)
    log.write_text(f"{time.strftime('%b %e %H:%M:%S')} ip-10-0-0-1 systemd[1]: Started kubelet.\n")
    args = ("--kernel-log-format", "syslog", "--kmsg-path", str(log))
    serial = sim.serial_for("trn1.32xlarge", 5)
    async with running(tmp_path, node, api, *args) as det:
        await eventually(lambda: status(api) == ("False", "NeuronHasNoError"))
        append_text(log, "a line no syslog daemon wrote\n")
        append_text(log, iso_line(format_hw_error("SRAM_UNCORRECTABLE_ERROR", 5, 1, serial)))
        await eventually(lambda: status(api) == ("True", "NeuronHasError_SRAM_UNCORRECTABLE_ERROR"))
        await eventually(api.event_list)
        # logrotate renames the file and the daemon starts a new one
        os.rename(log, log.with_suffix(".log.1"))
        log.write_text(traditional_line(format_hw_error("DMA_ERROR", 7, 0, sim.serial_for("trn1.32xlarge", 7))))
        await eventually(lambda: len(api.event_list()) == 2)
        metrics = await scrape(det)
    first, second = api.event_list()
    assert first["reason"] == "NeuronHasError_SRAM_UNCORRECTABLE_ERROR"
    assert f"neuron5 nc-id=1 serial={serial}" in first["message"]
    assert second["reason"] == "NeuronHasError_DMA_ERROR"
    assert "neuron7 nc-id=0" in second["message"]
    assert (tmp_path / "verdicts" / "neuron5.json").exists()
    assert "neuron_npd_kmsg_malformed_total 1.0" in metrics
    # a restart on the same boot replays the look-back but reports nothing twice: a new fault written
    # after the replayed lines, once reported, proves they were read and handled before it
    async with running(tmp_path, node, api, *args) as det:
        await eventually(lambda: det._kmsg_ok and det.reporter.up_to_date)
        append_text(
            log, traditional_line(format_hw_error("NC_UNCORRECTABLE_ERROR", 9, 0, sim.serial_for("trn1.32xlarge", 9)))
        )
        await eventually(lambda: any("neuron9 " in e["message"] for e in api.event_list()))
    assert [e["reason"] for e in api.event_list()] == [
        "NeuronHasError_SRAM_UNCORRECTABLE_ERROR",
        "NeuronHasError_DMA_ERROR",
        "NeuronHasError_NC_UNCORRECTABLE_ERROR",
    ]
    # back to /dev/kmsg on the same boot: its small sequence numbers are not taken for handled ones
    async with running(tmp_path, node, api):
        sim.inject_hw_error(node, "HBM_UNCORRECTABLE_ERROR", 3, 0)
        await eventually(lambda: len(api.event_list()) == 4)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--kernel-log-format", "syslog"], {}, "--kernel-log-format=syslog needs --kmsg-path"),
        (["--kernel-log-format", "syslog", "--kmsg-path", "/dev/null"], {}, "is a character device (/dev/kmsg)"),
        (["--kernel-log-format", "syslog", "--kmsg-path", "/"], {}, "is a directory"),
        (["--kernel-log-format", "journal"], {}, "invalid choice: 'journal' (choose from 'kmsg', 'syslog')"),
        ([], {"NEURON_NPD_KERNEL_LOG_FORMAT": "journal"}, "NEURON_NPD_KERNEL_LOG_FORMAT='journal' must be one of kmsg, syslog"),
    ],
)  # fmt: skip
def test_kernel_log_format_is_checked_at_start(
    args: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refusal(lambda: config_mod.parse(["--node-name", NODE, *args], env=env), capsys)


def test_kernel_log_format_from_its_environment_twin(tmp_path: Path) -> None:
    env = {"NEURON_NPD_KERNEL_LOG_FORMAT": "syslog", "NEURON_NPD_KMSG_PATH": str(tmp_path / "kern.log")}
    cfg = config_mod.parse(["--node-name", NODE], env=env)
    assert (cfg.kernel_log_format, cfg.kmsg_path) == ("syslog", tmp_path / "kern.log")
    assert config_mod.parse(["--node-name", NODE], env={}).kernel_log_format == "kmsg"


# --- AcceleratedHardwareReady (issue 56): written beside NeuronHealth unless EKS's agent owns it ---------


def ready_condition(api: FakeApiServer) -> tuple[str, str] | None:
    c = api.condition(NODE, "AcceleratedHardwareReady")
    return None if c is None else (c["status"], c["reason"])


async def test_accelerated_hardware_ready_is_written_beside_neuron_health(
    tmp_path: Path, node: Path, api: FakeApiServer
) -> None:
    async with running(tmp_path, node, api, "--cordon") as det:
        await eventually(lambda: ready_condition(api) == ("True", "NeuronAcceleratedHardwareIsReady"))
        sim.inject_hw_error(node, "HBM_UNCORRECTABLE_ERROR", 2, 0)
        await eventually(lambda: ready_condition(api) == ("False", "NeuronHBMUncorrectableError"))
        await eventually(lambda: det.reporter.up_to_date)
        assert status(api) == ("True", "NeuronHasError_HBM_UNCORRECTABLE_ERROR")
        # the readiness polarity does not confuse remediation: the node is cordoned once, for the fault
        assert api.nodes[NODE]["spec"]["unschedulable"] is True
        assert "neuron2" in (api.condition(NODE, "AcceleratedHardwareReady") or {})["message"]


async def test_where_eks_node_monitoring_agent_runs_it_owns_accelerated_hardware_ready(
    tmp_path: Path, node: Path, api: FakeApiServer
) -> None:
    conditions = api.nodes[NODE]["status"]["conditions"]
    conditions.append({"type": "KernelReady", "status": "True", "reason": "KernelIsReady", "message": ""})
    async with running(tmp_path, node, api) as det:
        sim.inject_hw_error(node, "HBM_UNCORRECTABLE_ERROR", 2, 0)
        # the positive marker: the detector's own condition and Event have reached the API server
        await eventually(lambda: status(api) == ("True", "NeuronHasError_HBM_UNCORRECTABLE_ERROR"))
        await eventually(lambda: det.reporter.up_to_date)
        assert det.reporter.agent_owns_accelerated_hardware is True
        assert ready_condition(api) is None


async def test_accelerated_hardware_ready_off_is_never_written(tmp_path: Path, node: Path, api: FakeApiServer) -> None:
    async with running(tmp_path, node, api, "--accelerated-hardware-condition", "off") as det:
        sim.inject_hw_error(node, "DMA_ERROR", 1, 0)
        await eventually(lambda: status(api) == ("True", "NeuronHasError_DMA_ERROR"))
        await eventually(lambda: det.reporter.up_to_date)
        assert ready_condition(api) is None


async def test_a_restarted_detector_does_not_cordon_again_for_a_workflow_an_admin_cancelled(
    tmp_path: Path, node: Path, api: FakeApiServer
) -> None:
    from neuron_model import remediation

    boot = (node / "proc/sys/kernel/random/boot_id").read_text().strip()
    api.nodes[NODE]["status"]["nodeInfo"] = {"bootID": boot}
    sim.inject_hw_error(node, "HBM_UNCORRECTABLE_ERROR", 2, 0)
    cancelled = remediation.WorkflowState(
        fault="HBM_UNCORRECTABLE_ERROR", reason="NeuronHasError_HBM_UNCORRECTABLE_ERROR", rung="replace",
        boot_id=boot, phase=remediation.Phase.CANCELLED, started=1.0, since=2.0, why="uncordoned by an admin",
    )  # fmt: skip
    api.nodes[NODE]["metadata"]["annotations"][remediation.STATE_ANNOTATION] = cancelled.dump()
    async with running(tmp_path, node, api, "--cordon", "--taint") as det:
        await eventually(lambda: status(api) == ("True", "NeuronHasError_HBM_UNCORRECTABLE_ERROR"))
        await eventually(lambda: det.reporter.up_to_date)  # the remediation step has run
    spec = api.nodes[NODE]["spec"]
    assert not spec.get("unschedulable", False), "cordoned again after an admin's uncordon cancelled it"
    assert [t["key"] for t in spec["taints"]] == ["aws.amazon.com/neuron-unhealthy"]  # the taint is not the cordon
    # another boot's cancellation says nothing about this one: the cordon comes back
    api.nodes[NODE]["metadata"]["annotations"][remediation.STATE_ANNOTATION] = dataclasses.replace(
        cancelled, boot_id="an-earlier-boot"
    ).dump()
    (tmp_path / "again").mkdir()
    async with running(tmp_path / "again", node, api, "--cordon") as det:
        await eventually(lambda: det.reporter.up_to_date)
    assert api.nodes[NODE]["spec"]["unschedulable"] is True
