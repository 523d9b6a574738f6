"""What the detector believes: active problems and the conditions they imply. Pure.

Problems are keyed by (condition, reason, device), so the same error seen again (a kernel
line replayed by the look-back, a counter that keeps growing) is one problem. They live
until the node boots again, the device's counters go back down (the driver was reloaded)
for rules with `clearOnDriverReload`, or a rule's `clearAfter` passes. The state is saved to a small file
on a host path so a restarted detector on the same boot keeps its conditions.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from neuron_driver.files import replace_file
from neuron_health import faults, layout_check
from neuron_model import node_health, remediation
from neuron_problem_detector import reset
from neuron_problem_detector.rules import Match, Rules

MESSAGE_LIMIT = 1024  # the API server keeps condition messages short; so do we


@dataclass(frozen=True)
class Problem:
    condition: str
    reason: str
    device: int | None
    message: str
    since: float  # wall clock seconds
    clear_on_driver_reload: bool = False
    clear_after: float | None = None

    @property
    def key(self) -> str:
        return f"{self.condition}/{self.reason}/{'' if self.device is None else self.device}"


@dataclass(frozen=True)
class ConditionStatus:
    type: str
    status: str  # "True" or "False"
    reason: str
    message: str
    last_transition: float  # wall clock seconds
    ready: bool = False  # a readiness condition (AcceleratedHardwareReady): "False" is the unhealthy status
    # whether --taint and --cordon follow it; False for NeuronHealthSourcesMissing, which is about what the
    # detector can read, not about the hardware
    remediates: bool = True

    @property
    def unhealthy(self) -> bool:
        return self.status == ("False" if self.ready else "True")


@dataclass
class DetectorState:
    boot_id: str | None = None
    last_seq: int = -1  # highest kernel log sequence number handled on this boot
    seq_source: str = "kmsg"  # the kernel log format that numbered last_seq (kmsg and syslog number apart)
    problems: dict[str, Problem] = field(default_factory=dict)
    transitions: dict[str, float] = field(default_factory=dict)  # condition type -> last change
    statuses: dict[str, str] = field(default_factory=dict)  # condition type -> last status
    # the driver's counters as last read on this boot, by (device, name): a restart measures growth
    # (and a driver reload) from them; None: not read yet on this boot
    counters: dict[tuple[int, str], int] | None = None
    # device resets on this boot, by problem key (`reset`): what a restart resumes, and the record of
    # each one's end (a device is reset once per problem and boot)
    resets: dict[str, reset.Job] = field(default_factory=dict)

    # -- changes ---------------------------------------------------------------------------------
    def add(self, match: Match, now: float) -> Problem | None:
        """A permanent match becomes a problem; returns it when it is new."""
        rule = match.rule
        if not rule.permanent or rule.condition is None:
            return None
        where = f"neuron{match.device}" if match.device is not None else "a Neuron device"
        extra = "".join(f" {k}={v}" for k, v in (("nc-id", match.core), ("serial", match.serial)) if v is not None)
        problem = Problem(
            rule.condition,
            rule.reason,
            match.device,
            f"{where}: {rule.reason}{extra}",
            now,
            clear_on_driver_reload=rule.clear_on_driver_reload,
            clear_after=rule.clear_after,
        )
        if problem.key in self.problems:
            return None
        self.problems[problem.key] = problem
        return problem

    def clear_devices(self, devices: set[int]) -> list[Problem]:
        """The driver was reloaded on these devices: the problems a reload mends are gone."""
        gone = [p for p in self.problems.values() if p.clear_on_driver_reload and p.device in devices]
        for p in gone:
            del self.problems[p.key]
        return gone

    def expire(self, now: float) -> list[Problem]:
        gone = [p for p in self.problems.values() if p.clear_after is not None and now - p.since >= p.clear_after]
        for p in gone:
            del self.problems[p.key]
        return gone

    def new_boot(self, boot_id: str | None) -> bool:
        """True when this is another boot than the saved state's: everything is forgotten."""
        if boot_id == self.boot_id:
            return False
        self.boot_id = boot_id
        self.problems.clear()
        self.resets.clear()
        self.last_seq = -1
        self.counters = None
        return True

    # -- views -----------------------------------------------------------------------------------
    def conditions(
        self,
        rules: Rules,
        now: float,
        accelerated_hardware: bool = False,
        validation_failed: str | None = None,
        sources_missing: str | None = None,
    ) -> list[ConditionStatus]:
        """The rules' conditions; with `accelerated_hardware`, also EKS's `AcceleratedHardwareReady`.
        `validation_failed`: the message of this boot's failed validation after a reboot, if it failed.
        `sources_missing`: what the layout check could not find, None when it found everything; given,
        `NeuronHealthSourcesMissing` is published too (not given: not, as for a caller with no check)."""
        result = []
        for c in rules.conditions:
            active = sorted((p for p in self.problems.values() if p.condition == c.type), key=lambda p: p.since)
            status = self._status(c.type, "True" if active else "False", now)
            if active:
                message = _joined(active, self._reset_phases())
                result.append(ConditionStatus(c.type, status, active[-1].reason, message, self.transitions[c.type]))
            else:
                result.append(
                    ConditionStatus(c.type, status, c.healthy_reason, c.healthy_message, self.transitions[c.type])
                )
        if accelerated_hardware:
            result.append(self._accelerated_hardware(now, validation_failed))
        if sources_missing is not None:
            result.append(self._sources(now, sources_missing))
        return result

    def _sources(self, now: float, missing: str) -> ConditionStatus:
        """True while the layout check names a health source it cannot find (`missing`, its summary; ""
        when it found them all): the other conditions' "no error" does not cover what is not read."""
        ctype = node_health.SOURCES_MISSING_CONDITION
        status = self._status(ctype, "True" if missing else "False", now)
        if missing:
            return ConditionStatus(
                ctype, status, layout_check.REASON, _cut(missing), self.transitions[ctype], remediates=False
            )
        message = "Every health counter the stack reads is where this driver's layout puts it"
        return ConditionStatus(
            ctype, status, node_health.SOURCES_FOUND_REASON, message, self.transitions[ctype], remediates=False
        )

    def _reset_phases(self) -> dict[str, str]:
        """Problem key -> the note its message carries while a node agent's job on it runs or escalated."""
        return {
            key: node_health.job_note(job.what, str(job.phase))
            for key, job in self.resets.items()
            if job.phase is not reset.Phase.PASSED
        }

    def _status(self, ctype: str, status: str, now: float) -> str:
        if self.statuses.get(ctype) != status:
            self.statuses[ctype] = status
            self.transitions[ctype] = now
        return status

    def _accelerated_hardware(self, now: float, validation_failed: str | None = None) -> ConditionStatus:
        """False while a problem of the fault table's reboot or replacement rungs is active, with that
        fault's reason in the agent's form, or one whose node agent's job escalated; a rule of the user's
        own, whose reason the table does not know, leaves it alone (its rung is unknown). Also False when
        the validation after a reboot failed on this boot: the node asks for a new instance, and with
        `--replacement=condition` this condition is the only request EKS and Karpenter read."""
        ctype = node_health.ACCELERATED_HARDWARE_CONDITION
        needing: list[tuple[Problem, faults.Fault]] = []
        for p in sorted(self.problems.values(), key=lambda p: p.since):
            fault = faults.BY_REASON.get(p.reason)
            escalated = p.key in self.resets and self.resets[p.key].phase is reset.Phase.ESCALATED
            if fault is not None and (fault.rung.needs_new_boot_or_instance or escalated):
                needing.append((p, fault))
        status = self._status(ctype, "False" if needing or validation_failed else "True", now)
        if needing:
            reason = needing[-1][1].accelerated_hardware_reason
            message = _joined([p for p, _ in needing])
        elif validation_failed:
            reason = remediation.VALIDATION_FAILED_REASON
            message = f"the validation after a reboot failed: {validation_failed}"[:MESSAGE_LIMIT]
        else:
            reason = node_health.ACCELERATED_HARDWARE_READY_REASON
            message = "No Neuron hardware error on this boot needs a reboot or a new instance"
        return ConditionStatus(ctype, status, reason, message, self.transitions[ctype], ready=True)

    def unhealthy_devices(self) -> dict[int, Problem]:
        latest: dict[int, Problem] = {}
        for p in sorted(self.problems.values(), key=lambda p: p.since):
            if p.device is not None:
                latest[p.device] = p
        return latest

    # -- persistence -----------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(
            {
                "boot_id": self.boot_id,
                "last_seq": self.last_seq,
                "seq_source": self.seq_source,
                "problems": [asdict(p) for p in self.problems.values()],
                "transitions": self.transitions,
                "statuses": self.statuses,
                "counters": None if self.counters is None else [[d, n, v] for (d, n), v in self.counters.items()],
                "resets": [job.to_dict() for job in self.resets.values()],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> DetectorState:
        data: dict[str, Any] = json.loads(text)
        state = cls(
            boot_id=data.get("boot_id"),
            last_seq=int(data.get("last_seq", -1)),
            seq_source=str(data.get("seq_source", "kmsg")),
        )
        known = {f.name for f in fields(Problem)}
        for raw in data.get("problems", []):
            # a state file written by an older version may carry fields this one dropped
            p = Problem(**{k: v for k, v in raw.items() if k in known})
            state.problems[p.key] = p
        state.transitions = {str(k): float(v) for k, v in data.get("transitions", {}).items()}
        state.statuses = {str(k): str(v) for k, v in data.get("statuses", {}).items()}
        for raw in data.get("resets", []):
            job = reset.Job.from_dict(raw)
            state.resets[job.problem] = job
        counters = data.get("counters")
        if counters is not None:
            state.counters = {(int(d), str(n)): int(v) for d, n, v in counters}
        return state


def _joined(problems: list[Problem], resets: dict[str, str] | None = None) -> str:
    """The problems' messages; one whose device is being reset or validated, or whose job escalated, says so."""
    notes = resets or {}
    return _cut("; ".join(p.message + notes.get(p.key, "") for p in problems))


def _cut(message: str) -> str:
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 3] + "..."


def load_state(path: Path) -> tuple[DetectorState, str | None]:
    """The saved state, or a fresh one and why (missing is normal; unreadable is said)."""
    try:
        return DetectorState.from_json(path.read_text()), None
    except FileNotFoundError:
        return DetectorState(), None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        return DetectorState(), f"state file {path} is unreadable ({exc}); starting afresh"


def save_state(path: Path, state: DetectorState) -> None:
    replace_file(path, state.to_json(), durable=True)


def wall_now() -> float:
    return time.time()
