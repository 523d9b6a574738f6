"""The node agent's rungs' decisions (`reset.decide`), over every phase and every kind of observation:
the device-reset rung (no fault of the table is on it, so a stand-in reason stands for one) and the
validate rung (a stalled heartbeat, validated in place unless it is idle and the reset is on)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from neuron_driver import layout
from neuron_health import faults
from neuron_problem_detector import reset, rules
from neuron_problem_detector.detector import DetectorState, Problem, load_state, save_state
from neuron_problem_detector.reset import Action, Job, Observation, Phase, Policy

RULES = rules.default_rules()
HB = "NeuronHasError_HEALTHCHECK_HEARTBEAT_STALE"
# a fault of the device-reset rung: `decide` reads a job's rung from its reason, and this one is not
# validated in place (what makes it eligible for a reset is `candidates`', tested below)
RESETTABLE = "NeuronHasError_HBM_REPAIRABLE_UNCORRECTABLE_ERROR"
POLICY = Policy(window=60, reset_timeout=120, command=True)


def job(
    phase: Phase,
    since: float = 1000.0,
    before: int | None = 8,
    detail: str = "",
    reason: str = RESETTABLE,
    in_place: bool = False,
) -> Job:
    return Job("NeuronHealth/x/3", 3, reason, phase, since, before, detail, in_place)


# (phase, observation, policy) -> (next phase, action, event reason or None)
CASES = [
    # waiting: not known, held, then idle
    (job(Phase.WAITING), Observation(1001), POLICY, Phase.WAITING, Action.NONE, reset.WAITING_REASON),
    (job(Phase.WAITING, detail="which pods hold the device is not known (PodResources unreadable)"),
     Observation(1001), POLICY, Phase.WAITING, Action.NONE, None),
    (job(Phase.WAITING), Observation(1001, holders=("ml/train-0",)), POLICY, Phase.WAITING, Action.NONE,
     reset.WAITING_REASON),
    (job(Phase.WAITING, detail="held by ml/train-0"), Observation(1001, holders=("ml/train-0",)), POLICY,
     Phase.WAITING, Action.NONE, None),
    (job(Phase.WAITING), Observation(1001, holders=(), requests=8), POLICY, Phase.RESETTING, Action.RESET,
     reset.RESET_REASON),
    (job(Phase.WAITING), Observation(1001, holders=(), requests=None), POLICY, Phase.ESCALATED, Action.ESCALATE,
     reset.ESCALATED_REASON),
    # resetting: the driver took it and is done; still running; failed; never took it
    (job(Phase.RESETTING), Observation(1010, state=1, requests=16), POLICY, Phase.VALIDATING, Action.NONE,
     reset.VALIDATING_REASON),
    (job(Phase.RESETTING), Observation(1010, state=0, requests=16), POLICY, Phase.RESETTING, Action.NONE, None),
    (job(Phase.RESETTING), Observation(1010, state=1, requests=8), POLICY, Phase.RESETTING, Action.NONE, None),
    (job(Phase.RESETTING), Observation(1010, state=2, requests=16), POLICY, Phase.ESCALATED, Action.ESCALATE,
     reset.ESCALATED_REASON),
    (job(Phase.RESETTING), Observation(1120, state=1, requests=8), POLICY, Phase.ESCALATED, Action.ESCALATE,
     reset.ESCALATED_REASON),
    (job(Phase.RESETTING), Observation(1120, state=0, requests=16), POLICY, Phase.ESCALATED, Action.ESCALATE,
     reset.ESCALATED_REASON),
    (job(Phase.RESETTING), Observation(1119, state=None, requests=None), POLICY, Phase.RESETTING, Action.NONE, None),
    # validating: an error within the window; the window running; sources unhealthy; command or none
    (job(Phase.VALIDATING), Observation(1010, new_errors=(HB,)), POLICY, Phase.ESCALATED, Action.ESCALATE,
     reset.ESCALATED_REASON),
    (job(Phase.VALIDATING), Observation(1059), POLICY, Phase.VALIDATING, Action.NONE, None),
    (job(Phase.VALIDATING), Observation(1060, unhealthy=(layout.HEARTBEAT_STALE_COUNTER,)), POLICY,
     Phase.ESCALATED, Action.ESCALATE, reset.ESCALATED_REASON),
    (job(Phase.VALIDATING), Observation(1060), POLICY, Phase.CHECKING, Action.RUN, reset.VALIDATING_REASON),
    (job(Phase.VALIDATING), Observation(1060), replace(POLICY, command=False), Phase.PASSED, Action.CLEAR,
     reset.PASSED_REASON),
    # checking: the command's exit status decides
    (job(Phase.CHECKING), Observation(1070, exit_status=0), POLICY, Phase.PASSED, Action.CLEAR, reset.PASSED_REASON),
    (job(Phase.CHECKING), Observation(1070, exit_status=1), POLICY, Phase.ESCALATED, Action.ESCALATE,
     reset.ESCALATED_REASON),
    (job(Phase.CHECKING), Observation(1070, command_error="no exit within 600s"), POLICY, Phase.ESCALATED,
     Action.ESCALATE, reset.ESCALATED_REASON),
    # the end: nothing more
    (job(Phase.PASSED), Observation(2000, holders=()), POLICY, Phase.PASSED, Action.NONE, None),
    (job(Phase.ESCALATED), Observation(2000, holders=()), POLICY, Phase.ESCALATED, Action.NONE, None),
    # the validate rung: held, holders not known, or the reset off: validated in place at once; idle with the
    # reset on: reset first, as the device-reset rung
    (job(Phase.WAITING, reason=HB), Observation(1001, holders=("ml/train-0",)), POLICY, Phase.VALIDATING,
     Action.NONE, reset.VALIDATING_REASON),
    (job(Phase.WAITING, reason=HB), Observation(1001), POLICY, Phase.VALIDATING, Action.NONE,
     reset.VALIDATING_REASON),
    (job(Phase.WAITING, reason=HB), Observation(1001, holders=(), requests=8), replace(POLICY, reset=False),
     Phase.VALIDATING, Action.NONE, reset.VALIDATING_REASON),
    (job(Phase.WAITING, reason=HB), Observation(1001, holders=(), requests=8), POLICY, Phase.RESETTING,
     Action.RESET, reset.RESET_REASON),
    # in place: the window and the sources decide; no command runs on a device a pod may hold
    (job(Phase.VALIDATING, reason=HB, in_place=True), Observation(1060), POLICY, Phase.PASSED, Action.CLEAR,
     reset.PASSED_REASON),
    (job(Phase.VALIDATING, reason=HB, in_place=True), Observation(1060, unhealthy=(layout.HEARTBEAT_STALE_COUNTER,)),
     POLICY, Phase.ESCALATED, Action.ESCALATE, reset.ESCALATED_REASON),
]  # fmt: skip


@pytest.mark.parametrize(("before", "obs", "policy", "phase", "action", "event"), CASES)
def test_each_phase_and_observation(
    before: Job, obs: Observation, policy: Policy, phase: Phase, action: Action, event: str | None
) -> None:
    d = reset.decide(before, obs, policy)
    assert (d.job.phase, d.action, d.event[0] if d.event else None) == (phase, action, event)


def test_every_phase_is_in_the_table() -> None:
    assert {c[0].phase for c in CASES} == set(Phase)
    assert {c[4] for c in CASES} == set(Action)


# Every value of each observation field that one of `decide`'s branches tells apart.
GRID = {
    "holders": (None, (), ("ml/a",)),
    "state": (None, layout.DEVICE_STATE_RESET, layout.DEVICE_STATE_READY, layout.DEVICE_STATE_INVALID),
    "requests": (None, 8, 9),
    "new_errors": ((), (HB,)),
    "unhealthy": ((), ("healthcheck_heartbeat:stale",)),
    "exit": ((None, "not found"), (0, ""), (1, "")),
}
# The fields each phase reads; the others must change nothing.
READS = {
    Phase.WAITING: ("holders", "requests"),
    Phase.RESETTING: ("state", "requests"),
    Phase.VALIDATING: ("new_errors", "unhealthy"),
    Phase.CHECKING: ("exit",),
    Phase.PASSED: (),
    Phase.ESCALATED: (),
}
TIMES = (1000.0, 1059.0, 1060.0, 1119.0, 1120.0)
POLICIES = (POLICY, replace(POLICY, command=False), replace(POLICY, window=0.0), replace(POLICY, reset=False))

ALLOWED = {
    Phase.WAITING: {Phase.WAITING, Phase.RESETTING, Phase.ESCALATED, Phase.VALIDATING},
    Phase.RESETTING: {Phase.RESETTING, Phase.VALIDATING, Phase.ESCALATED},
    Phase.VALIDATING: {Phase.VALIDATING, Phase.CHECKING, Phase.PASSED, Phase.ESCALATED},
    Phase.CHECKING: {Phase.PASSED, Phase.ESCALATED},
    Phase.PASSED: {Phase.PASSED},
    Phase.ESCALATED: {Phase.ESCALATED},
}
ACTION_OF = {Phase.RESETTING: Action.RESET, Phase.CHECKING: Action.RUN, Phase.PASSED: Action.CLEAR,
             Phase.ESCALATED: Action.ESCALATE}  # fmt: skip


def observation(now: float, values: dict[str, object]) -> Observation:
    status, error = values["exit"]  # type: ignore[misc]
    return Observation(now, values["holders"], values["state"], values["requests"], values["new_errors"],  # type: ignore[arg-type]
                       values["unhealthy"], status, error)  # type: ignore[arg-type]  # fmt: skip


def combinations() -> Iterator[tuple[Phase, dict[str, object], dict[str, object]]]:
    """Per phase, every value of each field it reads, with the others at their first values and at
    their last (which must decide the same)."""
    for phase, reads in READS.items():
        for chosen in itertools.product(*(GRID[n] for n in reads)):
            read = dict(zip(reads, chosen, strict=True))
            yield (
                phase,
                {n: read.get(n, v[0]) for n, v in GRID.items()},
                {n: read.get(n, v[-1]) for n, v in GRID.items()},
            )


def test_every_combination_moves_only_forward_and_acts_once_per_move() -> None:
    seen: set[tuple[Phase, Phase]] = set()
    for (phase, values, noisy), details, before, now, policy, reason in itertools.product(
        combinations(), ("", "held by ml/a"), (None, 8), TIMES, POLICIES, (RESETTABLE, HB)
    ):
        in_place = reason == HB and phase in (Phase.VALIDATING, Phase.CHECKING) and not before
        start = job(phase, 1000.0, before, details, reason, in_place)
        obs = observation(now, values)
        d = reset.decide(start, obs, policy)
        # a field the phase does not read changes nothing
        assert reset.decide(start, observation(now, noisy), policy) == d, (start, obs)
        assert d.job.phase in ALLOWED[phase], (start, obs)
        seen.add((phase, d.job.phase))
        if d.job.phase is phase:  # no move: no action, and an Event only for news while waiting
            assert d.action is Action.NONE
            assert d.event is None or d.event[0] == reset.WAITING_REASON
            assert d.job.since == start.since
            continue
        assert d.action is ACTION_OF.get(d.job.phase, Action.NONE), (start, obs)
        assert d.job.since == now  # each phase's time is its start
        assert d.step in reset.STEPS
        assert d.event is not None
        assert f"neuron{start.device}: " in d.event[1]
        if d.job.phase is Phase.ESCALATED:
            assert d.event[0] == reset.ESCALATED_REASON
            assert d.job.detail  # the why is kept
        if d.job.phase is Phase.RESETTING:
            assert d.job.requests_before == values["requests"]  # what the driver's count must pass
            assert policy.reset
            assert values["holders"] == ()  # only an idle device, only with the reset on
        if d.job.phase is Phase.VALIDATING and phase is Phase.WAITING:
            # straight to the window: only the validate rung, in place, never the reset rung
            assert reason == HB
            assert d.job.in_place
            assert not (policy.reset and values["holders"] == ())
        if d.job.phase is Phase.PASSED and phase is Phase.VALIDATING:
            assert not policy.command or start.in_place
            assert not values["new_errors"]
            assert not values["unhealthy"]
    # every move of ALLOWED happens for some observation
    assert seen == {(a, b) for a, bs in ALLOWED.items() for b in bs}


def test_only_reset_rung_faults_and_a_stalled_heartbeat_are_eligible_and_only_alone_on_their_device() -> None:
    eligible = [f.kind for f in faults.BY_KIND.values() if reset.eligible(f)]
    assert eligible == ["HEALTHCHECK_HEARTBEAT_STALE"]  # no fault of the table is cleared by a reset (no source)
    resettable = replace(faults.BY_KIND["HBM_REPAIRABLE_UNCORRECTABLE_ERROR"], cleared_by_device_reset=True)
    assert reset.eligible(resettable)
    assert not reset.eligible(resettable, reset=False)  # the reset off: left to the rung above
    assert reset.eligible(faults.BY_KIND["HEALTHCHECK_HEARTBEAT_STALE"], reset=False)  # validated in place all the same
    assert not reset.eligible(None)
    found = reset.candidates(
        [("k1", HB, 1), ("k2", HB, 2), ("k3", "NeuronHasError_DMA_ERROR", 2), ("k4", HB, None), ("k5", "mine", 5)]
    )
    assert found == {1: ("k1", HB)}  # device 2 also needs a new instance; a user's rule is no fault here


class H:
    def __init__(self, resource: str, device_id: str, pod: str = "p", namespace: str = "ml") -> None:
        self.resource, self.device_id, self.pod, self.namespace = resource, device_id, pod, namespace


def test_held_devices_through_the_device_plugin_and_dra() -> None:
    cores = {0: (0, 1), 1: (2, 3), 2: (4, 5), 3: (6, 7)}
    held = reset.held_devices(
        [
            H("aws.amazon.com/neuron", "neuron1", "a"),
            H("aws.amazon.com/neuroncore", "neuroncore5", "b"),
            H("neuron.aws.com", "neurondevice0", "c"),
            H("neuron.aws.com", "neurongroup2-3", "d"),  # an arc of 2 from device 3, around the ring
            H("neuron.aws.com", "neuroncore99", "e"),  # no such core: placed nowhere
            H("vpc.amazonaws.com/efa", "neuron2", "f"),  # another resource's ID
        ],
        cores,
    )
    assert held == {0: {"ml/c", "ml/d"}, 1: {"ml/a"}, 2: {"ml/b"}, 3: {"ml/d"}}


def test_sources_unhealthy_are_the_devices_firmware_counters_set() -> None:
    totals = {(3, "healthcheck_heartbeat:stale"): 1, (3, "unhealthy_components:hbm"): 0, (4, "unhealthy_components:sram"): 1,
              (3, "mem_ecc_uncorrected"): 5}  # fmt: skip
    assert reset.unhealthy_sources(totals, 3) == ("healthcheck_heartbeat:stale",)
    assert reset.unhealthy_sources(totals, 5) == ()
    assert reset.unhealthy_sources(None, 3) == ("the driver's counters not read yet",)


def test_jobs_survive_a_restart_and_a_new_boot_forgets_them(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    s = DetectorState(boot_id="b1")
    p = Problem("NeuronHealth", HB, 3, "neuron3: " + HB, 5.0)
    s.problems[p.key] = p
    s.resets[p.key] = Job(p.key, 3, HB, Phase.ESCALATED, 9.0, 8, "health sources unhealthy")
    save_state(path, s)
    loaded, _ = load_state(path)
    assert loaded.resets == s.resets
    [c] = loaded.conditions(RULES, 10.0)
    assert c.message == "neuron3: NeuronHasError_HEALTHCHECK_HEARTBEAT_STALE (device reset: escalated)"
    loaded.resets[p.key] = replace(s.resets[p.key], in_place=True, phase=Phase.VALIDATING)
    [c] = loaded.conditions(RULES, 10.0)
    assert c.message == "neuron3: NeuronHasError_HEALTHCHECK_HEARTBEAT_STALE (validation in place: validating)"
    assert loaded.new_boot("b2")
    assert loaded.resets == {}


def test_an_escalated_reset_rung_fault_turns_accelerated_hardware_ready_false(monkeypatch: pytest.MonkeyPatch) -> None:
    fault = replace(faults.BY_KIND["HBM_REPAIRABLE_UNCORRECTABLE_ERROR"], cleared_by_device_reset=True)
    assert fault.rung is faults.Rung.DEVICE_RESET
    monkeypatch.setattr(faults, "BY_REASON", {**faults.BY_REASON, fault.reason: fault})
    s = DetectorState(boot_id="b1")
    p = Problem("NeuronHealth", fault.reason, 2, "neuron2: x", 5.0)
    s.problems[p.key] = p
    s.resets[p.key] = Job(p.key, 2, fault.reason, Phase.VALIDATING, 6.0)

    def ready() -> str:
        return next(c for c in s.conditions(RULES, 7.0, accelerated_hardware=True) if c.ready).status

    assert ready() == "True"  # the device-reset rung does not need a new boot
    s.resets[p.key] = replace(s.resets[p.key], phase=Phase.ESCALATED)
    assert ready() == "False"  # escalated: on the reboot rung


def test_the_remediation_page_names_every_step_event_and_flag() -> None:
    import dataclasses

    from neuron_problem_detector import config

    page = (Path(__file__).resolve().parents[3] / "docs" / "remediation.md").read_text()
    reasons = [v for k, v in vars(reset).items() if k.endswith("_REASON") and isinstance(v, str)]
    assert len(reasons) == 5
    flags = ["--" + f.name.replace("_", "-") for f in dataclasses.fields(config.DeviceReset)]
    steps = [f"`{s}`" for s in reset.STEPS]
    missing = [w for w in [*(f"`{r}`" for r in reasons), *(f"`{f}`" for f in flags), *steps] if w not in page]
    assert missing == []
    assert "`neuron_npd_device_reset_steps_total{step}`" in page
