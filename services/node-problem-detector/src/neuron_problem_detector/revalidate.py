"""The validation after a reboot that a remediation workflow asked for (--validate-after-reboot;
docs/remediation.md): once at start, when the Node's workflow state says this boot awaits it
(`remediation.awaits_validation`), the detector watches the whole node for the validation window,
judges its health sources, runs the validation command, and writes its verdict as the condition
`remediation.VALIDATED_CONDITION` of its own Node, naming the boot. The remediation controller holds
the node cordoned until then, and ends the workflow on a pass or asks for a new instance on a failure.

The boot is the Node's (status.nodeInfo.bootID, the kubelet's), the one the controller compares: the
detector's own (the host root's) may differ on a simulated node.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp

from neuron_common.kube import Api, ApiError
from neuron_common.lifecycle import sleep_or_stop
from neuron_model import remediation
from neuron_problem_detector import reset
from neuron_problem_detector.detector import ConditionStatus

log = logging.getLogger(__name__)

VALIDATING_REASON = "NeuronValidating"  # the Event when it starts; the verdict's Event has the condition's reason


@dataclass(frozen=True)
class Start:
    """What the Node says at start: validate this boot, or why not."""

    boot_id: str
    validate: bool
    why: str
    given: ConditionStatus | None = None  # this boot's verdict, given before a restart: published again


def start(node: Mapping[str, Any]) -> Start:
    """Whether this boot is to be validated, from the Node: a workflow awaits it, and no verdict on this
    boot is there yet (a detector restarted on the same boot does not validate it twice)."""
    status = node.get("status") or {}
    boot = str((status.get("nodeInfo") or {}).get("bootID") or "")
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(remediation.STATE_ANNOTATION)
    state = None
    if text:
        try:
            state = remediation.load(text)
        except remediation.StateError as exc:
            return Start(boot, False, f"the workflow state does not read ({exc})")
    if not remediation.awaits_validation(state, boot):
        return Start(boot, False, "no workflow of this node awaits a validation of this boot")
    for c in status.get("conditions") or ():
        given = remediation.verdict(c.get("status"), c.get("reason"), c.get("message"), boot)
        if c.get("type") == remediation.VALIDATED_CONDITION and given is not None:
            condition = ConditionStatus(
                remediation.VALIDATED_CONDITION,
                "True" if given else "False",
                str(c.get("reason")),
                str(c.get("message")),
                _seconds(c.get("lastTransitionTime")),
                ready=True,
            )
            return Start(boot, False, f"this boot is validated already: {c.get('message')}", condition)
    assert state is not None
    return Start(boot, True, f"the workflow for {state.fault} asked for this boot ({state.why})")


def _seconds(stamp: object) -> float:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


def judge(
    problems: Sequence[str], unhealthy: Mapping[int, Sequence[str]], exit_status: int | None, error: str
) -> tuple[bool, str]:
    """The verdict: no problem on this boot (a new boot starts with none, so any is a new error of the
    window), every device's health sources healthy, and the command's exit status 0 (None: no command,
    or it did not run to its end, said by `error`)."""
    if problems:
        return False, f"problems on this boot after the validation window: {', '.join(sorted(problems))}"
    bad = {d: s for d, s in unhealthy.items() if s}
    if bad:
        return False, "health sources unhealthy after the window: " + "; ".join(
            f"neuron{d}: {', '.join(s)}" for d, s in sorted(bad.items())
        )
    if error:
        return False, f"validation command: {error}"
    if exit_status is not None and exit_status != 0:
        return False, f"validation command exited {exit_status}"
    return True, "passed" + (" (validation command exited 0)" if exit_status is not None else "")


class RebootValidator:
    def __init__(
        self,
        api: Api,
        node: str,
        *,
        window: float,
        command: str,
        command_timeout: float,
        devices: Sequence[int],
        problems: Callable[[], Sequence[str]],
        totals: Callable[[], Mapping[tuple[int, str], int] | None],
        verdict: Callable[[ConditionStatus], None],
        event: Callable[[str, str, bool], None],
        run_command: Callable[[list[str], float], Awaitable[tuple[int | None, str]]],
        retry: float = 5.0,
    ) -> None:
        """`problems`: the reasons of the detector's active problems; `totals`: the counters as last read;
        `verdict`: publishes the condition; `run_command`: runs a command under a time limit."""
        self.api, self.node, self.window = api, node, window
        self.command = shlex.split(command)
        self.command_timeout = command_timeout
        self.devices = tuple(devices)
        self._problems, self._totals, self._verdict, self._event = problems, totals, verdict, event
        self._run = run_command
        self.retry = retry
        self.done: tuple[bool, str] | None = None  # the verdict given (tests)

    async def _read_node(self, stop: asyncio.Event) -> Mapping[str, Any] | None:
        while not stop.is_set():
            try:
                return await self.api.get(f"/api/v1/nodes/{self.node}")
            # the API server away at start: asked again
            except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                log.warning("validation after a reboot: cannot read node %s: %s; trying again", self.node, exc)
            await sleep_or_stop(stop, self.retry)
        return None

    async def run(self, stop: asyncio.Event) -> None:
        node = await self._read_node(stop)
        if node is None:
            return
        begin = start(node)
        if not begin.validate:
            log.info("validation after a reboot: not run: %s", begin.why, extra={"boot_id": begin.boot_id})
            if begin.given is not None:  # kept on the Node and in AcceleratedHardwareReady (a failure)
                self._verdict(begin.given)
            await stop.wait()  # a loop of the supervisor: ends with the detector
            return
        message = (
            f"boot {begin.boot_id}: validating the node after its reboot ({begin.why}): a {self.window:g}s window, "
            + (f"then {shlex.join(self.command)}" if self.command else "no validation command")
        )
        log.info("%s", message)
        self._event(VALIDATING_REASON, message, False)
        if await sleep_or_stop(stop, self.window):
            return  # stopped: the next start on this boot validates it
        unhealthy = {d: reset.unhealthy_sources(self._totals(), d) for d in self.devices}
        problems = list(self._problems())
        status, error = None, ""
        if not problems and not any(unhealthy.values()) and self.command:
            status, error = await self._run(self.command, self.command_timeout)
        passed, text = judge(problems, unhealthy, status, error)
        reason = remediation.VALIDATION_PASSED_REASON if passed else remediation.VALIDATION_FAILED_REASON
        condition = ConditionStatus(
            remediation.VALIDATED_CONDITION,
            "True" if passed else "False",
            reason,
            remediation.verdict_message(begin.boot_id, text)[:1024],
            time.time(),
            ready=True,  # False is the unhealthy status, as AcceleratedHardwareReady's
        )
        self.done = (passed, text)
        log.log(logging.INFO if passed else logging.WARNING, "validation after a reboot: %s", condition.message)
        self._verdict(condition)
        self._event(reason, condition.message, not passed)
        await stop.wait()
