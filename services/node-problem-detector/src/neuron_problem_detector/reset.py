"""The node agent's rungs, `device-reset` and `validate`, and their validation step: what to do next
for one device. Pure.

A fault on the fault table's `device-reset` rung, or on its `validate` rung (a stalled firmware
heartbeat: issue 56's device left usable, whose heartbeat "runs the validation step, then
escalates"), gets a job per device.

On the `validate` rung the device is validated where it stands, with no drain: a pod holding it keeps
it. With the reset on (--device-reset) and no pod holding the device, it is reset first, as below, so
the firmware starts its checks afresh and the validation command can have the device to itself;
otherwise (held, holders not known, the reset off) the validation runs in place: the window and the
health sources, no reset and no command (a test tool on a device a job uses would disturb the job).

On the `device-reset` rung (only with --device-reset) the job waits until no pod holds the device
(the kubelet's PodResources `List`), writes the
driver's reset node, waits for the driver to finish (the device's state reads ready again and its
cores' `reset_req_count` grew: the driver ignores a write while the device is open, so a state that
reads ready is not enough), then validates: no new error on the device for the validation window,
its health sources (the firmware's verdict, the heartbeat) healthy at the end of it, and the
validation command's exit status. Pass: the problem clears. Fail: the job escalates and the problem
stays, on the reboot rung (the remediation controller's workflow goes on to a reboot).

Every input is an `Observation` the I/O side gathers (`resetter`); `decide` returns the next job, the
one action to carry out and the Event to tell.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from neuron_driver import layout
from neuron_health import faults
from neuron_model.resources import DRA_DRIVER, Kind, parse_dra_group, parse_dra_name, parse_id, ring_arc


class Phase(enum.StrEnum):
    WAITING = "waiting"  # for no pod to hold the device
    RESETTING = "resetting"  # the reset node was written; waiting for the driver
    VALIDATING = "validating"  # the validation window runs
    CHECKING = "checking"  # the validation command runs
    PASSED = "passed"  # the problem cleared
    ESCALATED = "escalated"  # the problem stays, on the rung its severity names (`Fault.escalated_rung`)

    @property
    def done(self) -> bool:
        return self in (Phase.PASSED, Phase.ESCALATED)


class Action(enum.StrEnum):
    NONE = "none"
    RESET = "reset"  # write the device's reset node
    RUN = "run"  # run the validation command, then decide again with its exit status
    CLEAR = "clear"  # the job's problem is gone
    ESCALATE = "escalate"  # the job's problem stays, and is no longer the device-reset rung's


class Holding(Protocol):
    """What `kubelet_api.podresources_client.Holding` carries that this reads (the gRPC client is
    imported only where the reset is on: a detector without it loads no gRPC)."""

    @property
    def namespace(self) -> str: ...
    @property
    def pod(self) -> str: ...
    @property
    def resource(self) -> str: ...
    @property
    def device_id(self) -> str: ...


# The metric's step labels, in the order a job takes them.
STEPS = ("wait", "reset", "validate", "check", "pass", "escalate")

# Event reasons, one per step, on the Node (docs/remediation.md names them).
WAITING_REASON = "NeuronDeviceResetWaiting"
RESET_REASON = "NeuronDeviceReset"
VALIDATING_REASON = "NeuronDeviceValidating"
PASSED_REASON = "NeuronDeviceValidated"
ESCALATED_REASON = "NeuronDeviceResetEscalated"


@dataclass(frozen=True)
class Job:
    problem: str  # the detector's problem key
    device: int
    reason: str  # the problem's reason
    phase: Phase = Phase.WAITING
    since: float = 0.0  # the phase's start (wall clock seconds)
    requests_before: int | None = None  # the cores' reset_req_count before the write
    detail: str = ""  # why it waits, or why it escalated
    in_place: bool = False  # validated where it stands: no reset, no command

    @property
    def what(self) -> str:
        """The job's name in messages (and in the condition's, `node_health.job_note`)."""
        return "validation in place" if self.in_place else "device reset"

    def to_dict(self) -> dict[str, object]:
        return {
            "problem": self.problem,
            "device": self.device,
            "reason": self.reason,
            "phase": str(self.phase),
            "since": self.since,
            "requests_before": self.requests_before,
            "detail": self.detail,
            "in_place": self.in_place,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Job:
        before = data.get("requests_before")
        return cls(
            str(data["problem"]),
            int(str(data["device"])),
            str(data["reason"]),
            Phase(str(data.get("phase", "waiting"))),
            float(str(data.get("since", 0.0))),
            None if before is None else int(str(before)),
            str(data.get("detail", "")),
            bool(data.get("in_place", False)),
        )


@dataclass(frozen=True)
class Policy:
    window: float = 60.0  # seconds without a new error on the device after the reset
    reset_timeout: float = 120.0  # seconds the driver has to finish a reset
    command: bool = False  # a validation command is configured
    reset: bool = True  # --device-reset: the reset node may be written


@dataclass(frozen=True)
class Observation:
    now: float
    holders: tuple[str, ...] | None = None  # pods holding the device ("ns/pod"); None: not known
    state: int | None = None  # what the reset node reads; None: unreadable
    requests: int | None = None  # the device's cores' reset_req_count, summed; None: unreadable
    new_errors: tuple[str, ...] = ()  # reasons seen on the device since the window began
    unhealthy: tuple[str, ...] = ()  # the device's health sources that are not healthy
    exit_status: int | None = None  # the validation command's; None with `command_error` set: it did not run
    command_error: str = ""


@dataclass(frozen=True)
class Decision:
    job: Job
    action: Action = Action.NONE
    event: tuple[str, str] | None = None  # (reason, message)
    step: str = ""  # the metric's label: wait, reset, validate, check, pass, escalate


def eligible(fault: faults.Fault | None, reset: bool = True) -> bool:
    """A fault these rungs act on: the table's validate rung, and its device-reset rung with the reset on."""
    if fault is None:
        return False
    return fault.rung is faults.Rung.VALIDATE or (reset and fault.rung is faults.Rung.DEVICE_RESET)


def validated_in_place(reason: str) -> bool:
    fault = faults.BY_REASON.get(reason)
    return fault is not None and fault.rung is faults.Rung.VALIDATE


def candidates(problems: Iterable[tuple[str, str, int | None]], reset: bool = True) -> dict[int, tuple[str, str]]:
    """Devices to validate (or reset), with the (problem key, reason) of the job: every problem of the
    device must be eligible, since a validation that leaves a fault needing a new instance would only
    delay the rung above."""
    by_device: dict[int, list[tuple[str, str]]] = {}
    refused: set[int] = set()
    for key, reason, device in problems:
        if device is None:
            continue
        if eligible(faults.BY_REASON.get(reason), reset):
            by_device.setdefault(device, []).append((key, reason))
        else:
            refused.add(device)
    return {d: sorted(found)[0] for d, found in by_device.items() if d not in refused}


def held_devices(holdings: Iterable[Holding], cores_of_device: Mapping[int, Iterable[int]]) -> dict[int, set[str]]:
    """Device -> the pods holding it or one of its cores, through the device plugin's IDs (`neuron3`,
    `neuroncore12`) or the DRA driver's (`neurondevice3`, `neuroncore12`, `neurongroup4-8`). An ID of
    another resource is not Neuron's; a Neuron ID this cannot place counts for no device."""
    core_device = {c: d for d, cores in cores_of_device.items() for c in cores}
    ring = len(cores_of_device)
    held: dict[int, set[str]] = {}
    for h in holdings:
        devices: tuple[int, ...] = ()
        parsed: tuple[Kind, int] | None
        if h.resource == DRA_DRIVER:
            arc = parse_dra_group(h.device_id)
            if arc is not None:
                devices = ring_arc(arc[1], arc[0], ring) if ring else ()
                parsed = None
            else:
                parsed = parse_dra_name(h.device_id)
        elif h.resource.rsplit("/", 1)[-1].startswith("neuron"):
            parsed = parse_id(h.device_id)
        else:
            continue
        if parsed is not None:
            kind, index = parsed
            devices = (index,) if kind is Kind.DEVICE else (core_device[index],) if index in core_device else ()
        for device in devices:
            held.setdefault(device, set()).add(f"{h.namespace}/{h.pod}")
    return held


def unhealthy_sources(totals: Mapping[tuple[int, str], int] | None, device: int) -> tuple[str, ...]:
    """The device's firmware verdict entries and heartbeat staleness that are set (counter value 1)."""
    if totals is None:
        return ("the driver's counters not read yet",)
    return tuple(sorted(n for (d, n), v in totals.items() if d == device and layout.is_firmware_counter(n) and v))


def _go(job: Job, phase: Phase, now: float, detail: str = "", **changes: object) -> Job:
    return replace(job, phase=phase, since=now, detail=detail, **changes)  # type: ignore[arg-type]


def escalate(job: Job, now: float, why: str) -> Decision:
    fault = faults.BY_REASON.get(job.reason)
    rung = fault.escalated_rung if fault is not None else faults.Rung.REBOOT
    message = f"neuron{job.device}: {job.reason}: {job.what} escalated to the {rung} rung: {why}"
    return Decision(_go(job, Phase.ESCALATED, now, why), Action.ESCALATE, (ESCALATED_REASON, message), "escalate")


def decide(job: Job, obs: Observation, policy: Policy) -> Decision:
    now, where = obs.now, f"neuron{job.device}: {job.reason}"
    if job.phase is Phase.WAITING:
        if validated_in_place(job.reason) and not (policy.reset and obs.holders == ()):
            why = (
                "the device reset is off"
                if not policy.reset
                else "which pods hold the device is not known (PodResources unreadable)"
                if obs.holders is None
                else "held by " + ", ".join(sorted(obs.holders))
            )
            message = f"{where}: validating in place for {policy.window:g}s ({why}; no drain, no reset, no command)"
            job = _go(job, Phase.VALIDATING, now, why, in_place=True)
            return Decision(job, event=(VALIDATING_REASON, message), step="validate")
        if not policy.reset:  # `candidates` makes no such job; one a restart with the reset turned off left
            return escalate(job, now, "the device reset is off (--device-reset)")
        if obs.holders is None:
            detail = "which pods hold the device is not known (PodResources unreadable)"
        elif obs.holders:
            detail = "held by " + ", ".join(sorted(obs.holders))
        else:
            if obs.requests is None:
                return escalate(job, now, "the device's reset_req_count is unreadable: a reset could not be told")
            reset = _go(job, Phase.RESETTING, now, requests_before=obs.requests)
            return Decision(reset, Action.RESET, (RESET_REASON, f"{where}: no pod holds the device: reset"), "reset")
        if detail == job.detail:
            return Decision(job)
        waiting = replace(job, detail=detail)
        return Decision(waiting, event=(WAITING_REASON, f"{where}: device reset waits: {detail}"), step="wait")
    if job.phase is Phase.RESETTING:
        if obs.state == layout.DEVICE_STATE_INVALID:
            return escalate(job, now, "the driver's reset failed (the device's state reads invalid)")
        grew = obs.requests is not None and job.requests_before is not None and obs.requests > job.requests_before
        if grew and obs.state == layout.DEVICE_STATE_READY:
            message = f"{where}: reset done; validating for {policy.window:g}s"
            return Decision(_go(job, Phase.VALIDATING, now), event=(VALIDATING_REASON, message), step="validate")
        if now - job.since >= policy.reset_timeout:
            why = "the device's state did not read ready" if grew else "the driver took no reset request (device open?)"
            return escalate(job, now, f"no reset done within {policy.reset_timeout:g}s: {why}")
        return Decision(job)
    if job.phase is Phase.VALIDATING:
        if obs.new_errors:
            return escalate(job, now, "new errors during the validation window: " + ", ".join(obs.new_errors))
        if now - job.since < policy.window:
            return Decision(job)
        if obs.unhealthy:
            return escalate(job, now, "health sources unhealthy after the window: " + ", ".join(obs.unhealthy))
        if policy.command and not job.in_place:
            message = f"{where}: no new error and healthy sources; running the validation command"
            return Decision(_go(job, Phase.CHECKING, now), Action.RUN, (VALIDATING_REASON, message), "check")
        return _passed(job, now, "no new error and healthy sources")
    if job.phase is Phase.CHECKING:
        if obs.exit_status == 0:
            return _passed(job, now, "no new error, healthy sources, and the validation command passed")
        why = obs.command_error or f"exit status {obs.exit_status}"
        return escalate(job, now, f"the validation command failed: {why}")
    return Decision(job)  # passed or escalated: nothing more on this boot


def _passed(job: Job, now: float, why: str) -> Decision:
    how = "validated in place" if job.in_place else "validated after a device reset"
    message = f"neuron{job.device}: {job.reason}: {how} ({why})"
    return Decision(_go(job, Phase.PASSED, now, why), Action.CLEAR, (PASSED_REASON, message), "pass")
