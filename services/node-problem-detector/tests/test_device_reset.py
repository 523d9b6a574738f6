"""The validation in place and the device reset, end to end: the detector on a simulated trn2 node whose driver
side (`neuron-sim driver`, a process of its own) carries out each write of a reset node, the kubelet's
PodResources stand-in saying which pod holds which device, and validation commands that pass (`true`)
and fail (`false`).

STAND-INS: tests/standins/apiserver.py (the Node and Event endpoints) and tests/standins/kubelet.py
(PodResources over its real gRPC); the simulator stands in for the Neuron driver, as everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from polling import until_async
from standins.apiserver import FakeApiServer, serving
from standins.kubelet import Allocation, FakeKubelet

from kubelet_api.deviceplugin.v1beta1 import api_pb2 as dp
from neuron_driver import layout
from neuron_problem_detector import config as config_mod
from neuron_problem_detector import reset
from neuron_problem_detector.app import Detector
from neuron_sim import node as sim

pytestmark = pytest.mark.integration  # the simulator's driver side and the commands are processes of their own

NODE = "sim-node-1"
HB = "NeuronHasError_HEALTHCHECK_HEARTBEAT_STALE"
STALE_AFTER = 0.6  # the heartbeat's stale-after, shortened from 5 minutes
DEVICE = 3


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with serving(NODE) as server:
        yield server


@pytest.fixture
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="npd-reset-"))  # short: unix socket paths are
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(work: Path) -> AsyncIterator[FakeKubelet]:
    k = FakeKubelet(work / "dp", work / "pr")
    await k.start()
    yield k
    await k.stop()


@pytest.fixture
def node(work: Path) -> Iterator[Path]:
    """A trn2 with the firmware's verdict (driver 2.30.2) and the driver's side running: resets carried
    out, every heartbeat but a stalled one beating."""
    root = work / "node"
    sim.create(root, "trn2.48xlarge", driver_version="2.30.2.0")
    driver = subprocess.Popen(
        [sys.executable, "-m", "neuron_sim.cli", "driver", "--root", str(root), "--interval", "0.05",
         "--heartbeat-every", "0.1"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield root
    finally:
        driver.terminate()
        driver.wait(10)


@contextlib.asynccontextmanager
async def running(
    work: Path, node: Path, api: FakeApiServer, kubelet: FakeKubelet, *args: str, reset_on: bool = True
) -> AsyncIterator[Detector]:
    cfg = config_mod.parse(
        ["--host-root", str(node), "--node-name", NODE, "--kubeconfig", str(api.kubeconfig(work / "kubeconfig")),
         "--listen", "127.0.0.1:0", "--counter-interval", "0.1", "--heartbeat", "3600",
         "--state-file", str(work / "state.json"), "--verdict-dir", str(work / "verdicts"),
         *(["--device-reset"] if reset_on else []), "--pod-resources-socket", str(kubelet.pod_resources_socket),
         "--reset-timeout", "10s", *args],
        env={},
    )  # fmt: skip
    stop = asyncio.Event()
    detector = Detector(cfg, stop)
    detector.counters.heartbeats.stale_after = STALE_AFTER
    task = asyncio.create_task(detector.run())
    try:
        yield detector
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


def status(api: FakeApiServer) -> tuple[str, str] | None:
    c = api.condition(NODE, "NeuronHealth")
    return None if c is None else (c["status"], c["reason"])


def reasons(api: FakeApiServer) -> list[str]:
    return [e["reason"] for e in api.event_list()]


def hold(kubelet: FakeKubelet, device: int, pod: str = "train-0") -> None:
    kubelet.allocations.append(
        Allocation("ml", pod, "main", "aws.amazon.com/neuron", [f"neuron{device}"], dp.ContainerAllocateResponse())
    )


async def stall_the_heartbeat(node: Path, api: FakeApiServer, *, persistent: bool = False) -> None:
    await until_async(lambda: status(api) == ("False", "NeuronHasNoError"), timeout=8)
    # a heartbeat is judged once seen to move: let the driver's side beat it a few times first
    beats = layout.health_status_file(layout.HostLayout(node).device_dir(DEVICE), layout.HEARTBEAT_FILE)
    await until_async(lambda: int(beats.read_text()) >= 3, timeout=8)
    sim.stall_heartbeat(node, DEVICE, persistent=persistent)
    await until_async(lambda: status(api) == ("True", HB), timeout=8)


def steps(det: Detector) -> dict[str, float]:
    return {s: det.metrics.device_reset_steps.labels(s)._value.get() for s in reset.STEPS}


def ahr(api: FakeApiServer) -> tuple[str, str] | None:
    c = api.condition(NODE, "AcceleratedHardwareReady")
    return None if c is None else (c["status"], c["reason"])


async def test_a_held_device_is_validated_in_place_and_passes_when_its_heartbeat_resumes(
    work: Path, node: Path, api: FakeApiServer, kubelet: FakeKubelet
) -> None:
    hold(kubelet, DEVICE)
    hold(kubelet, 5, "other")  # another device's pod does not hold this one
    async with running(
        work, node, api, kubelet, "--validation-window", "2s", "--validation-command", "false",
        "--accelerated-hardware-condition", "on",
    ) as det:  # fmt: skip
        await stall_the_heartbeat(node, api)
        await until_async(lambda: reset.VALIDATING_REASON in reasons(api), timeout=8)
        [validating] = [e for e in api.event_list() if e["reason"] == reset.VALIDATING_REASON]
        assert "validating in place" in validating["message"]
        assert "held by ml/train-0" in validating["message"]
        await until_async(lambda: det.reporter.up_to_date, timeout=8)
        assert "(validation in place: validating)" in (api.condition(NODE, "NeuronHealth") or {})["message"]
        assert ahr(api) == ("True", "NeuronAcceleratedHardwareIsReady")  # no drain, no new instance asked
        sim.resume_heartbeat(node, DEVICE)  # the firmware's checks start again by themselves, within the window
        await until_async(lambda: status(api) == ("False", "NeuronHasNoError"), timeout=15)
        log = layout.HostLayout(node).kmsg.read_text()
        assert "initiating device reset" not in log  # never a reset of a held device
        [job] = det.state.resets.values()
        assert (job.phase, job.in_place) == (reset.Phase.PASSED, True)
        # the failing command never ran: a test tool is not run on a device a pod holds
        assert steps(det) == {"wait": 0, "reset": 0, "validate": 1, "check": 0, "pass": 1, "escalate": 0}
    got = reasons(api)
    for reason in (reset.VALIDATING_REASON, reset.PASSED_REASON, HB + "Cleared"):
        assert reason in got
    assert reset.ESCALATED_REASON not in got
    assert reset.RESET_REASON not in got


async def test_a_held_device_whose_heartbeat_stays_stale_escalates_to_the_reboot_rung(
    work: Path, node: Path, api: FakeApiServer, kubelet: FakeKubelet
) -> None:
    hold(kubelet, DEVICE)
    async with running(
        work, node, api, kubelet, "--validation-window", "1s", "--accelerated-hardware-condition", "on"
    ) as det:
        await stall_the_heartbeat(node, api)
        await until_async(lambda: reset.ESCALATED_REASON in reasons(api), timeout=15)
        await until_async(lambda: ahr(api) == ("False", "NeuronHealthcheckHeartbeatStale"), timeout=8)
        condition = api.condition(NODE, "NeuronHealth") or {}
        assert (condition["status"], condition["reason"]) == ("True", HB)
        assert "(validation in place: escalated)" in condition["message"]
        assert steps(det)["escalate"] == 1
        assert steps(det)["reset"] == 0
    [escalated] = [e for e in api.event_list() if e["reason"] == reset.ESCALATED_REASON]
    assert "validation in place escalated to the reboot rung" in escalated["message"]
    assert "healthcheck_heartbeat:stale" in escalated["message"]
    assert "initiating device reset" not in layout.HostLayout(node).kmsg.read_text()


async def test_an_idle_device_is_reset_before_its_validation(
    work: Path, node: Path, api: FakeApiServer, kubelet: FakeKubelet
) -> None:
    async with running(work, node, api, kubelet, "--validation-window", "1s", "--validation-command", "true") as det:
        await stall_the_heartbeat(node, api)
        await until_async(lambda: status(api) == ("False", "NeuronHasNoError"), timeout=15)
        assert f"nd{DEVICE}: reset request 4294967295 completed" in layout.HostLayout(node).kmsg.read_text()
        [job] = det.state.resets.values()
        assert (job.phase, job.in_place) == (reset.Phase.PASSED, False)
        assert steps(det) == {"wait": 0, "reset": 1, "validate": 1, "check": 1, "pass": 1, "escalate": 0}
    got = reasons(api)
    for reason in (reset.RESET_REASON, reset.VALIDATING_REASON, reset.PASSED_REASON, HB + "Cleared"):
        assert reason in got


async def test_a_failing_validation_command_escalates_and_the_fault_stays(
    work: Path, node: Path, api: FakeApiServer, kubelet: FakeKubelet
) -> None:
    async with running(work, node, api, kubelet, "--validation-window", "0.5s", "--validation-command", "false") as det:
        await stall_the_heartbeat(node, api)
        await until_async(lambda: reset.ESCALATED_REASON in reasons(api), timeout=15)
        await until_async(lambda: det.reporter.up_to_date, timeout=8)
        condition = api.condition(NODE, "NeuronHealth") or {}
        assert (condition["status"], condition["reason"]) == ("True", HB)
        assert "(device reset: escalated)" in condition["message"]
        assert steps(det)["escalate"] == 1
        assert steps(det)["pass"] == 0
    [escalated] = [e for e in api.event_list() if e["reason"] == reset.ESCALATED_REASON]
    assert "the validation command failed: exit status 1" in escalated["message"]
    assert reset.PASSED_REASON not in reasons(api)
    # the reset itself happened: the verdict was the command's
    assert f"nd{DEVICE}: reset request 4294967295 completed" in layout.HostLayout(node).kmsg.read_text()


async def test_a_heartbeat_a_reset_does_not_restart_escalates_even_with_a_passing_command(
    work: Path, node: Path, api: FakeApiServer, kubelet: FakeKubelet
) -> None:
    async with running(work, node, api, kubelet, "--validation-window", "1s", "--validation-command", "true") as det:
        await stall_the_heartbeat(node, api, persistent=True)
        await until_async(lambda: reset.ESCALATED_REASON in reasons(api), timeout=15)
        assert status(api) == ("True", HB)
        assert steps(det)["check"] == 0  # the sources decided before the command could
    [escalated] = [e for e in api.event_list() if e["reason"] == reset.ESCALATED_REASON]
    assert "health sources unhealthy after the window: healthcheck_heartbeat:stale" in escalated["message"]


async def test_with_the_reset_off_an_idle_device_is_validated_in_place_all_the_same(
    work: Path, node: Path, api: FakeApiServer, kubelet: FakeKubelet
) -> None:
    async with running(
        work, node, api, kubelet, "--validation-window", "1s", "--validation-command", "false", reset_on=False
    ) as det:
        await stall_the_heartbeat(node, api)
        await until_async(lambda: reset.VALIDATING_REASON in reasons(api), timeout=8)
        [validating] = [e for e in api.event_list() if e["reason"] == reset.VALIDATING_REASON]
        assert "the device reset is off" in validating["message"]
        sim.resume_heartbeat(node, DEVICE)
        await until_async(lambda: status(api) == ("False", "NeuronHasNoError"), timeout=15)
        assert steps(det)["reset"] == 0
        assert steps(det)["check"] == 0
    assert "initiating device reset" not in layout.HostLayout(node).kmsg.read_text()


async def test_off_by_default_and_a_missing_command_escalates(
    work: Path, node: Path, api: FakeApiServer, kubelet: FakeKubelet
) -> None:
    assert config_mod.parse(["--node-name", NODE], env={}).device_reset is False
    command = str(work / "no-such-tool")
    async with running(work, node, api, kubelet, "--validation-window", "0s", "--validation-command", command):
        await stall_the_heartbeat(node, api)
        await until_async(lambda: reset.ESCALATED_REASON in reasons(api), timeout=15)
    [escalated] = [e for e in api.event_list() if e["reason"] == reset.ESCALATED_REASON]
    assert f"cannot run {command!r}" in escalated["message"]


async def test_a_restarted_detector_resumes_the_job_and_never_validates_twice(
    work: Path, node: Path, api: FakeApiServer, kubelet: FakeKubelet
) -> None:
    hold(kubelet, DEVICE)
    async with running(work, node, api, kubelet, "--validation-window", "3s") as det:
        await stall_the_heartbeat(node, api)
        await until_async(lambda: reset.VALIDATING_REASON in reasons(api), timeout=8)
        assert [(j.phase, j.in_place) for j in det.state.resets.values()] == [(reset.Phase.VALIDATING, True)]
    sim.resume_heartbeat(node, DEVICE)
    async with running(work, node, api, kubelet, "--validation-window", "3s") as det:
        await until_async(lambda: reset.PASSED_REASON in reasons(api), timeout=15)
        assert steps(det)["validate"] == 0  # the job came back from the state file, mid-window
    assert reasons(api).count(reset.VALIDATING_REASON) == 1
    async with running(work, node, api, kubelet, "--validation-window", "0.5s") as det:
        await asyncio.sleep(1)
        assert [j.phase for j in det.state.resets.values()] == [reset.Phase.PASSED]
    assert reasons(api).count(reset.PASSED_REASON) == 1
    assert "initiating device reset" not in layout.HostLayout(node).kmsg.read_text()
