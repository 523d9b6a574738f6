"""`--node-report`: the NeuronNode built from the plugin's state, and the publisher's timing and
failure handling against a fake `apply` and a scripted clock (no real time passes).

The plugin writing through its API client to the API server stand-in is at the end;
the real API server is in tests/cluster/test_node_report.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import sim_nodes
from flag_errors import refusal
from hypothesis import given, settings
from hypothesis import strategies as st
from polling import until_async
from standins.apiserver import FakeApiServer

from kubelet_api.podresources_client import Holding
from neuron_common.kube import ApiError
from neuron_device_plugin import config as config_mod
from neuron_device_plugin.metrics import PluginMetrics
from neuron_device_plugin.node_report import (
    FIELD_MANAGER,
    NodeReportPublisher,
    ReportWriteError,
    ServerSideApply,
    build_report,
    describe_api_error,
)
from neuron_device_plugin.state import PluginState
from neuron_driver.inventory import NodeInventory, scan
from neuron_model import resources
from neuron_model.instance_types import INSTANCE_TYPES
from neuron_model.report import NodeReport
from neuron_model.ultraserver import Mode
from neuron_sim import node as sim

NEURON = resources.neuron()
CORE = resources.neuroncore()
ALIAS = resources.neurondevice()
NOW = dt.datetime(2026, 11, 24, 8, 0, 0, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def inventory() -> Callable[..., NodeInventory]:
    return sim_nodes.inventory  # written once a run, shared with other modules


def plugin_state(inventory: NodeInventory, clock: Callable[[], float] = lambda: 100.0) -> PluginState:
    return PluginState(inventory, [NEURON, CORE, ALIAS], PluginMetrics(), quiet_period=1, pending_ttl=60, clock=clock)


def held(resource: resources.Resource, index: int, pod: str, namespace: str = "ml") -> Holding:
    device_id = resources.device_id(index) if resource.kind is resources.Kind.DEVICE else resources.core_id(index)
    return Holding(namespace, pod, "main", resource.full_name, device_id)


def report_of(state: PluginState) -> NodeReport:
    report = build_report(state, "node-a", NOW)
    read = NodeReport.from_object(report.to_object())  # a valid object
    assert (read.free_cores, read.pending_cores) == (report.free_cores, report.pending_cores)
    return report


# --- the report, from the state --------------------------------------------------------------


@pytest.mark.parametrize("instance_type", sorted(INSTANCE_TYPES))
def test_an_idle_node_reports_everything_free_with_the_plugins_topology(
    inventory: Callable[..., NodeInventory], instance_type: str
) -> None:
    inv = inventory(instance_type)
    state = plugin_state(inv)
    report = report_of(state)
    it = INSTANCE_TYPES[instance_type]
    topology = state.topology
    assert (report.node, report.instance_type, report.heartbeat) == ("node-a", instance_type, NOW)
    assert (report.topology, report.device_count, report.torus_shape) == (it.topology, it.devices, it.torus_shape)
    assert (report.cores_per_device, report.logical_core_config) == (topology.cores_per_device, inv.lnc.value)
    assert report.adjacency == topology.adjacency
    assert report.free_cores == set(range(it.devices * topology.cores_per_device))
    assert report.free_devices == set(range(it.devices))
    assert report.unhealthy_devices == report.pods == frozenset()
    # the figures the kubelet sees: every advertised ID healthy
    assert len(report.free_cores) == sum(a.healthy for a in state.advertised(CORE))
    assert len(report.free_devices) == sum(a.healthy for a in state.advertised(NEURON))


def test_a_failing_link_is_reported_and_its_device_stays_free(inventory: Callable[..., NodeInventory]) -> None:
    state = plugin_state(inventory("trn2.48xlarge"))
    state.set_multi_node_unfit({6: ("UNHEALTHY_LINK_EFA",), 99: ("UNHEALTHY_LINK_EFA",)})  # 99: not a device
    report = report_of(state)
    assert report.multi_node_unfit == {6}
    assert 6 in report.free_devices
    assert report.unhealthy_devices == frozenset()
    assert NodeReport.from_object(report.to_object()).multi_node_unfit == {6}


def test_the_logical_core_setting_is_the_nodes(inventory: Callable[..., NodeInventory]) -> None:
    for lnc, cores_per_device in ((1, 8), (2, 4)):
        report = report_of(plugin_state(inventory("trn2.48xlarge", lnc)))
        assert (report.logical_core_config, report.cores_per_device) == (lnc, cores_per_device)
        assert len(report.free_cores) == 16 * cores_per_device


def test_a_device_held_whole_takes_its_cores_and_a_held_core_takes_its_device(
    inventory: Callable[..., NodeInventory],
) -> None:
    state = plugin_state(inventory("trn1.32xlarge"))  # 2 cores a device
    state.set_kubelet_holdings([held(NEURON, 3, "whole"), held(CORE, 9, "core"), held(ALIAS, 0, "old")], 0.0)
    report = report_of(state)
    assert not report.free_cores & {0, 1, 6, 7, 9}
    assert 8 in report.free_cores, "the other core of a partly held device stays free"
    assert report.free_devices == set(range(16)) - {0, 3, 4}
    assert report.pods == {"ml/whole", "ml/core", "ml/old"}


def test_a_core_held_through_its_own_resource_is_not_free(inventory: Callable[..., NodeInventory]) -> None:
    """Unlike the kubelet's lists, where a holding through the same resource is the kubelet's business,
    free means free for the next pod, whichever resource it asks for."""
    state = plugin_state(inventory("trn1.32xlarge"))
    state.set_kubelet_holdings([held(CORE, 4, "a"), held(CORE, 5, "b", "other")], 0.0)
    report = report_of(state)
    assert not report.free_cores & {4, 5}
    assert 2 not in report.free_devices
    assert report.pods == {"ml/a", "other/b"}


def test_own_hand_outs_not_yet_listed_are_not_free_and_name_no_pod(inventory: Callable[..., NodeInventory]) -> None:
    state = plugin_state(inventory("inf2.48xlarge"))
    state.set_kubelet_holdings([], 0.0)
    state.record_allocation(NEURON, [5, 6])
    state.record_allocation(CORE, [0])
    report = report_of(state)
    assert not report.free_cores & {0, 10, 11, 12, 13}
    assert report.free_devices == set(range(12)) - {0, 5, 6}
    assert report.pods == frozenset()


def test_unhealthy_and_absent_devices_are_reported_and_not_free(
    inventory: Callable[..., NodeInventory], tmp_path: Path
) -> None:
    state = plugin_state(inventory("trn1.32xlarge"))
    state.set_external_verdicts({5: "problem detector says so"})
    report = report_of(state)
    assert report.unhealthy_devices == {5}
    assert not report.free_cores & {10, 11}
    assert report.to_object()["status"]["health"] == "15/16 healthy"
    # a device missing from sysfs at start, on an instance DMI names, is reported, not ignored
    sim.create(tmp_path, "trn1.32xlarge")
    sim.vanish(tmp_path, 15)
    report = report_of(plugin_state(scan(tmp_path, env={})))
    assert report.unhealthy_devices == {15}
    assert report.device_count == 16
    assert not report.free_cores & {30, 31}


@settings(max_examples=60, deadline=None)
@given(
    held_devices=st.dictionaries(st.integers(0, 15), st.sampled_from([NEURON, ALIAS]), max_size=6),
    held_cores=st.sets(st.integers(0, 31), max_size=8),
    pending=st.sets(st.integers(0, 15), max_size=3),
    unhealthy=st.sets(st.integers(0, 15), max_size=3),
)
def test_free_is_what_no_resource_holds_on_healthy_devices_and_matches_the_kubelets_lists(
    inventory: Callable[..., NodeInventory],
    held_devices: dict[int, resources.Resource],
    held_cores: set[int],
    pending: set[int],
    unhealthy: set[int],
) -> None:
    state = plugin_state(inventory("trn1.32xlarge"))
    holdings = [held(r, d, f"d{d}") for d, r in held_devices.items()] + [held(CORE, c, f"c{c}") for c in held_cores]
    state.set_kubelet_holdings(holdings, 0.0)
    state.record_allocation(NEURON, pending)
    state.set_external_verdicts(dict.fromkeys(unhealthy, "test"))
    report = report_of(state)
    taken = set(held_devices) | pending | unhealthy
    assert report.free_cores == {c for c in range(32) if c // 2 not in taken and c not in held_cores}
    assert report.unhealthy_devices == unhealthy
    assert report.pods == {f"ml/d{d}" for d in held_devices} | {f"ml/c{c}" for c in held_cores}
    # The kubelet's view: an ID held through another resource is listed Unhealthy; one held through
    # its own resource is listed Healthy and counted by the kubelet. Free is what is left of both.
    healthy_cores = {int(a.id.removeprefix("neuroncore")) for a in state.advertised(CORE) if a.healthy}
    assert report.free_cores == healthy_cores - held_cores - {c for d in pending for c in (2 * d, 2 * d + 1)}
    healthy_devices = {int(a.id.removeprefix("neuron")) for a in state.advertised(NEURON) if a.healthy}
    own = {d for d, r in held_devices.items() if r is NEURON} | pending
    assert report.free_devices == healthy_devices - own
    # pending: held through own hand-outs alone, on healthy devices, so by no pod the report names
    listed = set(held_devices) | unhealthy
    assert report.pending_cores == {c for d in pending - listed for c in (2 * d, 2 * d + 1) if c not in held_cores}
    assert not report.pending_cores & report.free_cores
    # each named pod's silicon, as cores: what evicting it frees (the extender's preemption)
    assert report.pod_cores == {f"ml/d{d}": frozenset({2 * d, 2 * d + 1}) for d in held_devices} | {
        f"ml/c{c}": frozenset({c}) for c in held_cores
    }
    assert NodeReport.from_object(report.to_object()).pod_cores == report.pod_cores


def test_a_hand_out_is_pending_until_the_kubelets_list_names_its_pod(inventory: Callable[..., NodeInventory]) -> None:
    """Between Allocate and the next List the silicon is held but its pod unnamed: the report says
    which cores those are, so the extender can tell that pod's silicon from that of a pod not admitted yet."""
    state = plugin_state(inventory("trn1.32xlarge"))  # its clock: 100.0
    state.record_allocation(NEURON, [3])
    report = report_of(state)
    assert (report.pods, report.pending_cores) == (frozenset(), {6, 7})
    assert not report.free_cores & {6, 7}
    state.set_kubelet_holdings([held(NEURON, 3, "one-a")], started_at=101.0)
    report = report_of(state)
    assert (report.pods, report.pending_cores) == ({"ml/one-a"}, frozenset())
    assert not report.free_cores & {6, 7}


# --- the publisher: when it writes -------------------------------------------------------------


class Script:
    """A clock that moves only when the publisher waits; each wait runs the next scripted step, which
    may set events (a change, stop) and says how long the wait lasted."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.now = 0.0
        self.stop = stop
        self.waits: list[tuple[int, float]] = []  # (events waited on besides stop, timeout)
        self.steps: list[Callable[[tuple[asyncio.Event, ...], float], float]] = []

    def clock(self) -> float:
        return self.now

    async def wait(self, *events: asyncio.Event, timeout: float) -> None:
        self.waits.append((len(events) - 1, timeout))
        if not self.steps:
            self.stop.set()
            return
        self.now += self.steps.pop(0)(events, timeout)


class Writes:
    def __init__(self, failures: Iterable[bool] = ()) -> None:
        self.objects: list[dict[str, Any]] = []
        self.failures = list(failures)  # True: that attempt fails

    async def __call__(self, obj: dict[str, Any]) -> None:
        if self.failures and self.failures.pop(0):
            raise ReportWriteError("HTTP 503 Service Unavailable")
        self.objects.append(obj)


class FixedBackoff:
    def __init__(self) -> None:
        self.attempts = 0

    def next_delay(self) -> float:
        self.attempts += 1
        return float(self.attempts)

    def reset(self) -> None:
        self.attempts = 0


class Changes:
    """PluginState's contract: an event, replaced and set on every change."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.version = 0

    def change(self) -> None:
        self.version += 1
        event, self.event = self.event, asyncio.Event()
        event.set()


def publisher(script: Script, writes: Writes, changes: Changes, metrics: PluginMetrics) -> NodeReportPublisher:
    def build() -> dict[str, Any]:
        return {"metadata": {"name": "node-a"}, "status": {"version": changes.version, "devices": "", "cores": ""}}

    return NodeReportPublisher(
        build, writes, metrics, interval=30, min_gap=0.5, clock=script.clock, wait=script.wait, backoff=FixedBackoff()
    )  # type: ignore[arg-type]


def versions(writes: Writes) -> list[int]:
    return [o["status"]["version"] for o in writes.objects]


def elapsing(seconds: float, then: Callable[[], None] = lambda: None) -> Callable[..., float]:
    def step(events: tuple[asyncio.Event, ...], timeout: float) -> float:
        then()
        return min(seconds, timeout)

    return step


async def test_writes_at_once_then_on_each_change_at_most_once_per_gap_and_on_the_heartbeat() -> None:
    stop, changes, writes, metrics = asyncio.Event(), Changes(), Writes(), PluginMetrics()
    script = Script(stop)

    def burst() -> None:
        for _ in range(5):
            changes.change()

    script.steps = [
        elapsing(0.1, burst),  # a burst of changes 0.1 s after the first write ...
        elapsing(0.4),  # ... waits out the rest of the gap, then one write of the latest state
        elapsing(30),  # no change: the heartbeat writes again
        elapsing(10, changes.change),  # a change long after the last write is written without delay
    ]
    await publisher(script, writes, changes, metrics).run(stop, lambda: changes.event)
    assert versions(writes) == [0, 5, 5, 6]
    assert script.waits == [(1, 30), (0, pytest.approx(0.4)), (1, 30), (1, 30), (1, 30)]
    assert metrics.node_report_writes.labels("success")._value.get() == 4
    assert metrics.node_report_up._value.get() == 1


async def test_a_change_during_a_write_is_written_next() -> None:
    stop, changes, metrics = asyncio.Event(), Changes(), PluginMetrics()
    script = Script(stop)

    class ChangingWrites(Writes):
        async def __call__(self, obj: dict[str, Any]) -> None:
            await super().__call__(obj)
            if len(self.objects) == 1:
                changes.change()  # the state moved while the first write was on its way

    writes = ChangingWrites()
    script.steps = [elapsing(0), elapsing(0.5)]
    await publisher(script, writes, changes, metrics).run(stop, lambda: changes.event)
    assert versions(writes) == [0, 1]
    assert script.waits[:2] == [(1, 30), (0, 0.5)]


async def test_while_the_api_server_fails_it_backs_off_keeps_only_the_latest_state_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop, changes, metrics = asyncio.Event(), Changes(), PluginMetrics()
    writes = Writes([False, True, True, True, False, True])
    script = Script(stop)
    script.steps = [
        elapsing(0.2, changes.change),  # heartbeat wait, cut short by a change
        elapsing(0.3),  # the rest of the gap; then the write fails: an outage begins
        elapsing(1, changes.change),  # back-off 1, during which the state changes twice
        elapsing(2, changes.change),  # back-off 2
        elapsing(3),  # back-off 3, then the write goes through with the latest state
        elapsing(30),  # heartbeat: fails again, a second outage
        elapsing(1),  # back-off starts over at 1 after a success
    ]
    with caplog.at_level(logging.INFO, logger="neuron_device_plugin.node_report"):
        await publisher(script, writes, changes, metrics).run(stop, lambda: changes.event)
    assert versions(writes) == [0, 3, 3]
    assert [t for _, t in script.waits] == [30, pytest.approx(0.3), 1, 2, 3, 30, 1, 30]
    assert metrics.node_report_writes.labels("error")._value.get() == 4
    assert metrics.node_report_writes.labels("success")._value.get() == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, "one warning per outage"
    assert "HTTP 503 Service Unavailable; retrying with back-off" in warnings[0]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == [
        "NeuronNode node-a published",
        "NeuronNode node-a written again",
        "NeuronNode node-a written again",
    ]


async def test_up_is_zero_during_an_outage_and_stop_ends_the_back_off() -> None:
    stop, changes, metrics = asyncio.Event(), Changes(), PluginMetrics()
    script = Script(stop)  # no steps: the first wait sets stop
    await publisher(script, Writes([True]), changes, metrics).run(stop, lambda: changes.event)
    assert metrics.node_report_up._value.get() == 0
    assert script.waits == [(0, 1.0)]


async def test_an_unexpected_error_is_not_swallowed() -> None:
    """Only a failed write is retried; anything else is a bug, which ends the loop, and the
    supervisor the process (see neuron_common.supervisor)."""
    stop, changes = asyncio.Event(), Changes()

    async def broken(obj: dict[str, Any]) -> None:
        raise KeyError("status")

    p = publisher(Script(stop), Writes(), changes, PluginMetrics())
    p.apply = broken
    with pytest.raises(KeyError):
        await p.run(stop, lambda: changes.event)


def test_api_errors_carry_the_servers_message_and_what_a_404_means() -> None:
    refusal = '{"kind":"Status","message":"neuronnodes \\"b\\" is forbidden: only its own node","code":403}'
    assert describe_api_error(403, "Forbidden", refusal) == (
        'HTTP 403 Forbidden: neuronnodes "b" is forbidden: only its own node'
    )
    assert "is the neuronnodes.neuron.aws.com CRD installed?" in describe_api_error(404, "Not Found", "")
    assert describe_api_error(500, None, "plain text") == "HTTP 500: plain text"


async def test_the_writer_keeps_an_admission_policys_whole_refusal() -> None:
    """A policy's refusal names the policy first and says why at the end, past 300 characters."""
    why = "the Neuron device plugin on node a may write only NeuronNode a, not b"
    long = f"neuronnodes.neuron.aws.com \"b\" is forbidden: ValidatingAdmissionPolicy '{'p' * 120}' with binding '{'p' * 120}' denied request: {why}"

    class Refusing:
        async def apply(self, path: str, body: Any, field_manager: str) -> dict[str, Any]:
            raise ApiError(403, long)

    with pytest.raises(ReportWriteError) as refused:
        await ServerSideApply(Refusing())({"metadata": {"name": "b"}})  # type: ignore[arg-type]
    assert str(refused.value) == f"HTTP 403: {long}"
    assert str(refused.value).endswith(why)


# --- flags -----------------------------------------------------------------------------------


def test_flags_and_their_environment_twins() -> None:
    off = config_mod.parse([], env={})
    assert (off.node_report, off.node_report_interval, off.kubeconfig) == (False, 30.0, None)
    on = config_mod.parse(["--node-report", "--node-report-interval", "1m"], env={"NODE_NAME": "ip-10-0-0-1.ec2"})
    assert (on.node_report, on.node_name, on.node_report_interval) == (True, "ip-10-0-0-1.ec2", 60.0)
    env = {"NEURON_DP_NODE_REPORT": "true", "NEURON_DP_NODE_NAME": "n1", "NEURON_DP_KUBECONFIG": "/k", "NODE_NAME": "x"}
    twin = config_mod.parse([], env=env)
    assert (twin.node_report, twin.node_name, twin.kubeconfig) == (True, "n1", "/k")


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--node-report"], {}, "--node-report needs the node's name: pass --node-name or set NODE_NAME"),
        (["--node-report", "--node-name", "Node_A"], {}, "--node-name 'Node_A' is not a node name"),
        (["--node-report-interval", "0"], {"NODE_NAME": "a"}, "must be greater than 0"),
    ],
)
def test_bad_report_flags_are_clear_errors(
    args: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refusal(lambda: config_mod.parse(args, env=env), capsys)


@pytest.mark.integration
@pytest.mark.parametrize("kubeconfig", [True, False], ids=["missing-kubeconfig", "not-in-a-pod"])
def test_no_credentials_is_a_clear_error_at_start(tmp_path: Path, kubeconfig: bool) -> None:
    args = ["--kubeconfig", str(tmp_path / "absent")] if kubeconfig else []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "NEURON_DP_"))}
    result = subprocess.run(
        [sys.executable, "-m", "neuron_device_plugin", "--node-report", "--node-name", "a", *args],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    where = f"--kubeconfig {tmp_path / 'absent'}" if kubeconfig else "the in-cluster service account"
    assert f"neuron-device-plugin: error: --node-report cannot reach the API server through {where}" in result.stderr
    assert ("outside a pod, pass --kubeconfig" in result.stderr) is not kubeconfig


# --- the plugin, through its API client, to the API server stand-in ------------------


@pytest.fixture
async def api() -> Any:
    server = FakeApiServer("node-a")
    await server.up()
    yield server
    await server.down()


async def eventually(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    await until_async(predicate, timeout=timeout)


async def test_the_plugin_applies_its_report_and_follows_allocations_and_outages(
    start_plugin: Any, api: FakeApiServer, tmp_path: Path
) -> None:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    args = ["--node-report", "--node-name", "node-a", "--kubeconfig", str(kubeconfig), "--node-report-interval", "1h"]
    h = await start_plugin("trn1.32xlarge", *args)
    nodes = api.custom.setdefault("neuronnodes.neuron.aws.com", {})

    def status() -> dict[str, Any]:
        return nodes.get("node-a", {}).get("status", {})  # type: ignore[no-any-return]

    await eventually(lambda: status().get("devices") == "16/16")
    method, path, content_type = api.requests[-1]
    assert (method, path, content_type) == (
        "PATCH",
        "/apis/neuron.aws.com/v1alpha1/neuronnodes/node-a",
        "application/apply-patch+yaml",
    )
    assert api.managers[("neuronnodes.neuron.aws.com", "node-a")] == FIELD_MANAGER
    report = NodeReport.from_object(nodes["node-a"])
    assert (report.instance_type, report.cores_per_device, report.torus_shape) == ("trn1.32xlarge", 2, (4, 4))

    await h.kubelet.allocate("aws.amazon.com/neuron", 4, pod="train", namespace="ml")
    await eventually(lambda: status().get("devices") == "12/16" and status().get("pods") == ["ml/train"])
    assert status()["cores"] == "24/32"

    await api.down()
    h.kubelet.release("train", "ml")
    await eventually(lambda: h.plugin.metrics.node_report_up._value.get() == 0)
    assert status()["devices"] == "12/16", "nothing written while the API server is down"
    await api.up()
    await eventually(lambda: status().get("devices") == "16/16", timeout=40)  # within the back-off's 30 s ceiling
    assert status()["pods"] == []


async def test_the_report_carries_the_nodes_ultraserver_as_the_driver_tells_it_now(
    start_plugin: Any, api: FakeApiServer, tmp_path: Path
) -> None:
    """Issue 26 item 2: no UltraServer attributes, no ultraServer in the report; the election running,
    pending; once it is over, the groups and the node's ids (read again for each report)."""
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    args = ["--node-report", "--node-name", "node-u", "--kubeconfig", str(kubeconfig), "--node-report-interval", "0.2"]
    h = await start_plugin("trn2u.48xlarge", *args)
    nodes = api.custom.setdefault("neuronnodes.neuron.aws.com", {})

    def ultraserver() -> Any:
        return nodes.get("node-u", {}).get("status", {}).get("ultraServer")

    await eventually(lambda: nodes.get("node-u", {}).get("status", {}).get("devices") == "16/16")
    assert ultraserver() is None
    sim.write_ultraserver(h.root, None, busy=True)
    await eventually(lambda: (ultraserver() or {}).get("state") == "pending")
    assert "busy" in ultraserver()["reason"]
    sim.write_ultraserver(h.root, sim.UltraServerSpec(2, "00c0ffee12345678"))
    await eventually(lambda: (ultraserver() or {}).get("state") == "identified")
    assert ultraserver()["summary"] == "00c0ffee12345678/2 of 4"
    assert ultraserver()["modes"] == [1, 2, 3, 4]
    report = NodeReport.from_object(nodes["node-u"])
    assert report.ultraserver is not None
    assert report.ultraserver.identity is not None
    assert report.ultraserver.identity.group(2) == (sim.pair_server_id("00c0ffee12345678", Mode.X2H, 0), 1)
