"""The validation after a reboot a remediation workflow asked for (--validate-after-reboot), end to end:
the detector on a simulated trn2 that the simulator rebooted (what a reset or reboot ends has ended, a
defect stays), the Node carrying the controller's workflow state from the boot before, and validation
commands that pass and fail (the image's Python, which has no `true`). The verdict is the Node's
NeuronValidated condition, naming the boot.

STAND-INS: tests/standins/apiserver.py (the Node and Event endpoints); the simulator stands in for the
Neuron driver, as everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from polling import until_async
from standins.apiserver import FakeApiServer, serving

from neuron_model import remediation
from neuron_model.remediation import Phase, WorkflowState
from neuron_problem_detector import config as config_mod
from neuron_problem_detector import revalidate
from neuron_problem_detector.app import Detector
from neuron_sim import node as sim

NODE = "sim-node-1"
PASS = [sys.executable, "-c", "pass"]
FAIL = [sys.executable, "-c", "raise SystemExit(3)"]
OLD_BOOT = "boot-before-the-reboot"


def requested(boot: str = OLD_BOOT, phase: Phase = Phase.REQUESTED) -> WorkflowState:
    return WorkflowState(
        "HBM_REPAIRABLE_UNCORRECTABLE_ERROR", "NeuronHasError_HBM_REPAIRABLE_UNCORRECTABLE_ERROR", "reboot", boot,
        phase, 1.0, 2.0, cordoned_by_us=True, why="reboot requested",
    )  # fmt: skip


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with serving(NODE) as server:
        yield server


@pytest.fixture
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="npd-revalidate-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node(work: Path) -> Path:
    root = work / "node"
    sim.create(root, "trn2.48xlarge", driver_version="2.30.2.0")
    return root


def on_the_node(api: FakeApiServer, boot: str, state: WorkflowState | None) -> None:
    """The Node as the kubelet and the controller left it: the new boot, the workflow of the old one."""
    obj = api.nodes[NODE]
    obj["status"]["nodeInfo"] = {"bootID": boot}
    if state is not None:
        obj["metadata"]["annotations"][remediation.STATE_ANNOTATION] = state.dump()


@contextlib.asynccontextmanager
async def running(work: Path, node: Path, api: FakeApiServer, command: list[str] | None) -> AsyncIterator[Detector]:
    args = ["--validation-command", shlex.join(command)] if command else []
    cfg = config_mod.parse(
        ["--host-root", str(node), "--node-name", NODE, "--kubeconfig", str(api.kubeconfig(work / "kubeconfig")),
         "--listen", "127.0.0.1:0", "--counter-interval", "0.1", "--heartbeat", "3600",
         "--state-file", str(work / "state.json"), "--verdict-dir", str(work / "verdicts"),
         "--validate-after-reboot", "--validation-window", "0.6s", *args],
        env={},
    )  # fmt: skip
    stop = asyncio.Event()
    detector = Detector(cfg, stop)
    task = asyncio.create_task(detector.run())
    try:
        yield detector
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


def validated(api: FakeApiServer) -> dict[str, Any] | None:
    return api.condition(NODE, remediation.VALIDATED_CONDITION)


def reasons(api: FakeApiServer) -> list[str]:
    return [e["reason"] for e in api.event_list()]


async def verdict_of(api: FakeApiServer, boot: str) -> bool | None:
    await until_async(lambda: validated(api) is not None, timeout=15)
    c = validated(api) or {}
    return remediation.verdict(c["status"], c["reason"], c["message"], boot)


@pytest.mark.integration  # runs the validation command: a process of its own
async def test_a_passing_command_after_the_reboot_writes_a_passed_verdict_for_this_boot(
    work: Path, node: Path, api: FakeApiServer
) -> None:
    # a transient firmware state from before the reboot: the reboot ends it, so the node is healthy
    sim.set_unhealthy_components(node, 4, ["hbm"], transient=["hbm"])
    boot = sim.reboot(node)
    on_the_node(api, boot, requested())
    async with running(work, node, api, PASS) as det:
        assert await verdict_of(api, boot) is True
        await until_async(lambda: det.reporter.up_to_date, timeout=8)
        assert (api.condition(NODE, "NeuronHealth") or {})["status"] == "False"
        assert ready(api) == ("True", "NeuronAcceleratedHardwareIsReady")
    c = validated(api) or {}
    assert (c["status"], c["reason"]) == ("True", remediation.VALIDATION_PASSED_REASON)
    assert c["message"] == f"boot {boot}: passed (validation command exited 0)"
    got = reasons(api)
    assert revalidate.VALIDATING_REASON in got
    assert remediation.VALIDATION_PASSED_REASON in got


@pytest.mark.integration  # runs the validation command: a process of its own
async def test_a_failing_command_writes_a_failed_verdict(work: Path, node: Path, api: FakeApiServer) -> None:
    boot = sim.reboot(node)
    on_the_node(api, boot, requested(phase=Phase.VALIDATING))  # the controller saw the new boot first
    async with running(work, node, api, FAIL) as det:
        assert await verdict_of(api, boot) is False
        await until_async(lambda: det.reporter.up_to_date, timeout=8)
        # no fault on this boot, yet the node asks for a new instance where EKS and Karpenter read it
        # (with --replacement=condition, the only request there is)
        assert ready(api) == ("False", remediation.VALIDATION_FAILED_REASON)
        assert (api.condition(NODE, "NeuronHealth") or {})["status"] == "False"
    c = validated(api) or {}
    assert (c["status"], c["reason"]) == ("False", remediation.VALIDATION_FAILED_REASON)
    assert c["message"] == f"boot {boot}: validation command exited 3"
    [event] = [e for e in api.event_list() if e["reason"] == remediation.VALIDATION_FAILED_REASON]
    assert event["type"] == "Warning"
    assert "validation command exited 3" in (api.condition(NODE, "AcceleratedHardwareReady") or {})["message"]
    # a detector restarted on this boot validates nothing again, and keeps the failure where it shows
    async with running(work, node, api, PASS) as det:
        await until_async(lambda: det.reporter.up_to_date, timeout=8)
        assert det.validator is not None
        assert det.validator.done is None
        assert ready(api) == ("False", remediation.VALIDATION_FAILED_REASON)
    assert await verdict_of(api, boot) is False


def ready(api: FakeApiServer) -> tuple[str, str] | None:
    c = api.condition(NODE, "AcceleratedHardwareReady")
    return None if c is None else (c["status"], c["reason"])


async def test_a_defect_the_reboot_left_fails_before_the_command_runs(
    work: Path, node: Path, api: FakeApiServer
) -> None:
    sim.set_unhealthy_components(node, 2, ["hbm"])  # persistent: a reboot leaves it listed
    boot = sim.reboot(node)
    on_the_node(api, boot, requested())
    marker = work / "ran"
    async with running(work, node, api, [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]):
        assert await verdict_of(api, boot) is False
    message = (validated(api) or {})["message"]
    assert message.startswith(f"boot {boot}: problems on this boot after the validation window: ")
    assert not marker.exists()  # the health sources decided: the command never ran


async def test_a_fault_during_the_window_fails_a_node_without_a_command(
    work: Path, node: Path, api: FakeApiServer
) -> None:
    boot = sim.reboot(node)
    on_the_node(api, boot, requested())
    async with running(work, node, api, None) as det:
        await until_async(lambda: revalidate.VALIDATING_REASON in reasons(api), timeout=8)
        sim.inject_fault(node, "HBM_UNCORRECTABLE_ERROR", 5)
        assert await verdict_of(api, boot) is False
        assert det.validator is not None
        assert det.validator.done is not None
    assert "NeuronHasError_HBM_UNCORRECTABLE_ERROR" in (validated(api) or {})["message"]


@pytest.mark.parametrize(
    ("state", "why"),
    [
        (None, "no workflow"),
        (requested(boot="same"), "the workflow is of this boot"),
        (requested(phase=Phase.DRAINING), "a reboot before the drain ended"),
        (requested(phase=Phase.CANCELLED), "a cancelled workflow"),
    ],
)
async def test_nothing_is_validated_when_no_workflow_awaits_this_boot(
    work: Path, node: Path, api: FakeApiServer, state: WorkflowState | None, why: str
) -> None:
    on_the_node(api, "same", state)
    async with running(work, node, api, PASS) as det:
        await until_async(lambda: det.reporter.up_to_date, timeout=8)
        await asyncio.sleep(1.2)  # twice the window
        assert validated(api) is None, why
        assert det.validator is not None
        assert det.validator.done is None
    assert revalidate.VALIDATING_REASON not in reasons(api)


@pytest.mark.integration  # runs the validation command: a process of its own
async def test_a_detector_restarted_on_a_validated_boot_does_not_validate_it_again(
    work: Path, node: Path, api: FakeApiServer
) -> None:
    boot = sim.reboot(node)
    on_the_node(api, boot, requested())
    async with running(work, node, api, PASS):
        assert await verdict_of(api, boot) is True
    events = len([r for r in reasons(api) if r == revalidate.VALIDATING_REASON])
    async with running(work, node, api, FAIL) as det:  # a failing command would say False, if it ran
        await until_async(lambda: det.reporter.up_to_date, timeout=8)
        await asyncio.sleep(1.2)
        assert det.validator is not None
        assert det.validator.done is None
    assert await verdict_of(api, boot) is True
    assert len([r for r in reasons(api) if r == revalidate.VALIDATING_REASON]) == events


def test_off_by_default() -> None:
    assert config_mod.parse(["--node-name", NODE], env={}).validate_after_reboot is False


def node_object(boot: str, state: str | None, *conditions: dict[str, str]) -> dict[str, Any]:
    annotations = {} if state is None else {remediation.STATE_ANNOTATION: state}
    return {
        "metadata": {"annotations": annotations},
        "status": {"nodeInfo": {"bootID": boot}, "conditions": list(conditions)},
    }


def test_the_start_rule_reads_the_workflow_and_an_earlier_verdict() -> None:
    state = requested().dump()
    assert revalidate.start(node_object("b2", state)).validate
    assert not revalidate.start(node_object("b2", "{not json")).validate
    assert "does not read" in revalidate.start(node_object("b2", "{not json")).why
    old = {"type": remediation.VALIDATED_CONDITION, "status": "True", "reason": remediation.VALIDATION_PASSED_REASON,
           "message": remediation.verdict_message("b1", "passed")}  # fmt: skip
    assert revalidate.start(node_object("b2", state, old)).validate  # an earlier boot's verdict: validated again
    now = {**old, "message": remediation.verdict_message("b2", "passed")}
    assert not revalidate.start(node_object("b2", state, now)).validate
    assert revalidate.start(node_object("b2", state, now)).boot_id == "b2"


@pytest.mark.parametrize(
    ("problems", "unhealthy", "status", "error", "passed", "text"),
    [
        ([], {0: ()}, None, "", True, "passed"),
        ([], {0: ()}, 0, "", True, "passed (validation command exited 0)"),
        ([], {0: ()}, 2, "", False, "validation command exited 2"),
        ([], {0: ()}, None, "no exit within 5s", False, "validation command: no exit within 5s"),
        ([], {0: (), 3: ("hbm",)}, 0, "", False, "health sources unhealthy after the window: neuron3: hbm"),
        (["B", "A"], {3: ("hbm",)}, 0, "", False, "problems on this boot after the validation window: A, B"),
    ],
)
def test_the_judgement_takes_problems_then_sources_then_the_command(
    problems: list[str], unhealthy: dict[int, tuple[str, ...]], status: int | None, error: str, passed: bool, text: str
) -> None:
    assert revalidate.judge(problems, unhealthy, status, error) == (passed, text)
