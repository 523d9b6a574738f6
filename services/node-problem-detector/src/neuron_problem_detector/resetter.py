"""The node agent's rungs' I/O: the kubelet's PodResources, the driver's reset node, the validation command.

The decisions are `reset.decide`'s; this gathers what it needs for each job's phase, carries out its
action, and tells its Event and metric. It always runs, for the `validate` rung (a validation in place
reads and writes nothing on the host); the reset, and the PodResources it needs, only with --device-reset.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_common.lifecycle import sleep_or_stop
from neuron_driver import layout
from neuron_driver.inventory import NodeInventory
from neuron_health import faults
from neuron_problem_detector import reset
from neuron_problem_detector.detector import DetectorState, Problem, wall_now

if TYPE_CHECKING:
    from neuron_problem_detector.config import Config

log = logging.getLogger(__name__)

OUTPUT_LIMIT = 2000  # characters of the command's output kept for the log


class DeviceResetter:
    def __init__(
        self,
        config: Config,
        inventory: NodeInventory,
        state: Callable[[], DetectorState],
        event: Callable[[str, str, bool], None],
        cleared: Callable[[list[Problem], str], None],
        changed: Callable[[], None],
        totals: Callable[[], Mapping[tuple[int, str], int] | None],
        step_metric: Callable[[str], None],
        holdings: Callable[[], Any] | None = None,
    ) -> None:
        """`holdings`: an awaitable factory of the kubelet's holdings (by default its PodResources
        `List` on --pod-resources-socket)."""
        self.config = config
        self.root = Path(config.host_root)
        self.policy = reset.Policy(
            config.validation_window, config.reset_timeout, bool(config.validation_command), config.device_reset
        )
        self.command = shlex.split(config.validation_command)
        self._state, self._event, self._cleared, self._changed = state, event, cleared, changed
        self._totals, self._step = totals, step_metric
        self.devices = {d.index: d for d in inventory.devices}
        self.cores_of_device = {d.index: d.logical_cores for d in inventory.devices}
        self.errors: dict[int, list[tuple[float, str]]] = {}  # device -> (when, reason) of each match
        # without the reset, nothing asks which pods hold a device (the kubelet's socket is not mounted)
        self._holdings = holdings or (self._podresources() if config.device_reset else None)

    def _podresources(self) -> Callable[[], Any]:
        # imported here: a detector without --device-reset loads no gRPC
        from kubelet_api.podresources_client import PodResourcesClient, flatten

        client = PodResourcesClient(str(self.config.pod_resources_socket), keep_open=False)

        async def holdings() -> Any:
            return flatten(await client.list())

        return holdings

    def seen(self, device: int | None, reason: str, now: float) -> None:
        """A match of any rule on a device: a new error for a validation window under way."""
        if device is not None:
            self.errors.setdefault(device, []).append((now, reason))
            del self.errors[device][:-100]

    # -- observations -------------------------------------------------------------------------------
    def _requests(self, device: int) -> int | None:
        dev = self.devices.get(device)
        if dev is None:
            return None
        total = 0
        for core in range(dev.physical_cores):
            path = layout.core_other_info_value_file(layout.core_dir(Path(dev.sysfs_path), core), "reset_req_count")
            try:
                total += int(path.read_text().strip())
            except (OSError, ValueError):
                return None
        return total

    def _device_state(self, device: int) -> int | None:
        try:
            return int(layout.HostLayout(self.root).reset_node(device).read_text().strip())
        except (OSError, ValueError):
            return None

    async def _held(self) -> dict[int, set[str]] | None:
        if self._holdings is None:
            return None
        try:
            return reset.held_devices(await self._holdings(), self.cores_of_device)
        except Exception as exc:  # the kubelet away or refusing: not known, so no reset
            log.warning("device reset: PodResources List failed: %s", exc)
            return None

    async def observe(self, job: reset.Job, held: dict[int, set[str]] | None = None) -> reset.Observation:
        """What `decide` needs in the job's phase; `held`: the kubelet's answer, asked once per pass."""
        now = wall_now()
        if job.phase is reset.Phase.WAITING:
            holders = None if held is None else tuple(sorted(held.get(job.device, ())))
            return reset.Observation(now, holders=holders, requests=self._requests(job.device))
        if job.phase is reset.Phase.RESETTING:
            return reset.Observation(now, state=self._device_state(job.device), requests=self._requests(job.device))
        errors = tuple(sorted({r for t, r in self.errors.get(job.device, ()) if t >= job.since}))
        return reset.Observation(now, new_errors=errors, unhealthy=reset.unhealthy_sources(self._totals(), job.device))

    # -- actions ------------------------------------------------------------------------------------
    def _write_reset(self, device: int) -> str:
        node = layout.HostLayout(self.root).reset_node(device)
        try:
            with open(node, "w") as f:  # the driver ignores what is written: any write asks for a reset
                f.write("1\n")
        except OSError as exc:
            return f"cannot write {node}: {exc}"
        return ""

    async def run_command(self, device: int) -> tuple[int | None, str]:
        """The validation command's exit status, or None and why it did not run to its end. It gets the
        device and its cores in its environment, as the Neuron runtime reads them."""
        cores = self.cores_of_device.get(device, ())
        env = {"NEURON_RESET_DEVICE": str(device)}
        if cores:
            env["NEURON_RT_VISIBLE_CORES"] = f"{min(cores)}-{max(cores)}"
        return await run_validation_command(self.command, self.config.validation_timeout, env, device=device)

    # -- the loop -----------------------------------------------------------------------------------
    def _jobs(self) -> dict[str, reset.Job]:
        state = self._state()
        jobs = state.resets
        for device, (key, reason) in reset.candidates(
            ((k, p.reason, p.device) for k, p in state.problems.items()), self.policy.reset
        ).items():
            if key not in jobs and not any(j.device == device and not j.phase.done for j in jobs.values()):
                jobs[key] = reset.Job(key, device, reason, since=wall_now())
        for key, job in list(jobs.items()):
            if not job.phase.done and key not in state.problems:
                del jobs[key]  # cleared otherwise (a reload, clearAfter): nothing to validate
        return jobs

    async def _ran(self, obs: reset.Observation, device: int) -> reset.Observation:
        status, error = await self.run_command(device)
        return replace(obs, now=wall_now(), exit_status=status, command_error=error)

    async def step(self) -> None:
        jobs = self._jobs()
        waiting = any(j.phase is reset.Phase.WAITING for j in jobs.values())
        held = await self._held() if waiting else None
        for key, job in list(jobs.items()):
            if job.phase.done:
                continue
            obs = await self.observe(job, held)
            if job.phase is reset.Phase.CHECKING:  # a command a restart cut short: run it again
                obs = await self._ran(obs, job.device)
            decision = reset.decide(job, obs, self.policy)
            if decision.action is reset.Action.RESET:
                failed = self._write_reset(job.device)
                if failed:
                    decision = reset.escalate(decision.job, obs.now, failed)
            if decision.action is reset.Action.RUN:
                self._tell(decision)
                decision = reset.decide(decision.job, await self._ran(obs, job.device), self.policy)
            jobs[key] = decision.job
            self._tell(decision)
            if decision.action is reset.Action.CLEAR:
                # the validation judged the device, not one problem: every problem the rung acts on goes
                problems = self._state().problems
                gone = [
                    problems.pop(k)
                    for k, p in list(problems.items())
                    if p.device == job.device
                    and (k == key or reset.eligible(faults.BY_REASON.get(p.reason), self.policy.reset))
                ]
                how = "validated in place" if decision.job.in_place else "the device was reset and validated"
                self._cleared(gone, how)
            elif decision.job != job:
                self._changed()

    def _tell(self, decision: reset.Decision) -> None:
        if decision.step:
            self._step(decision.step)
        if decision.event is not None:
            reason, message = decision.event
            warning = reason in (reset.ESCALATED_REASON, reset.WAITING_REASON)
            log.log(logging.WARNING if warning else logging.INFO, "%s", message, extra={"reason": reason})
            self._event(reason, message[:1024], warning)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.step()
            await sleep_or_stop(stop, self.config.counter_interval)


async def run_validation_command(
    command: list[str], limit: float, env: Mapping[str, str], *, device: int | None = None
) -> tuple[int | None, str]:
    """`command`'s exit status, or None and why it did not run to its end (no shell; `env` on top of
    the detector's own environment)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env={**os.environ, **env}
        )
    except OSError as exc:
        return None, f"cannot run {command[0]!r}: {exc}"
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), limit)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None, f"no exit within {limit:g}s"
    log.info(
        "validation command exited %s", proc.returncode,
        extra={"device": device, "output": out.decode(errors="replace")[-OUTPUT_LIMIT:]},
    )  # fmt: skip
    return proc.returncode, ""
