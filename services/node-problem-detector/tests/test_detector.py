from __future__ import annotations

from pathlib import Path

from neuron_problem_detector import rules
from neuron_problem_detector.detector import DetectorState, load_state, save_state

DEFAULT = rules.default_rules()


def match(line: str) -> rules.Match:
    [m] = rules.match_message(DEFAULT, line)
    return m


def test_problem_sets_condition_once_and_transition_time_is_stable() -> None:
    s = DetectorState(boot_id="b1")
    [healthy] = s.conditions(DEFAULT, now=100)
    assert (healthy.status, healthy.reason, healthy.last_transition) == ("False", "NeuronHasNoError", 100)
    assert s.add(match("NEURON_HW_ERR=DMA_ERROR nd-id=2 nc-id=0"), now=200) is not None
    assert s.add(match("NEURON_HW_ERR=DMA_ERROR nd-id=2 nc-id=1"), now=210) is None  # same device, same reason
    [c] = s.conditions(DEFAULT, now=220)
    assert (c.status, c.reason, c.last_transition) == ("True", "NeuronHasError_DMA_ERROR", 220)
    s.add(match("NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=4 nc-id=1 serial-num=0123456789abcdef"), now=230)
    [c] = s.conditions(DEFAULT, now=240)
    assert (c.reason, c.last_transition) == ("NeuronHasError_HBM_UNCORRECTABLE_ERROR", 220)
    assert (
        c.message
        == "neuron2: NeuronHasError_DMA_ERROR nc-id=0; neuron4: NeuronHasError_HBM_UNCORRECTABLE_ERROR nc-id=1 serial=0123456789abcdef"
    )
    assert set(s.unhealthy_devices()) == {2, 4}


def test_temporary_matches_are_no_problem() -> None:
    s = DetectorState()
    assert s.add(match("DMA completion timeout on nd03"), now=1) is None
    assert s.problems == {}


def test_a_driver_reload_clears_only_what_it_mends() -> None:
    s = DetectorState()
    [m] = rules.match_counters(DEFAULT, None, {(1, "mem_ecc_uncorrected"): 2})
    s.add(m, now=1)
    [m] = rules.match_counters(DEFAULT, None, {(1, "mem_ecc_repairable_uncorrected"): 1})
    s.add(m, now=2)
    s.add(match("NEURON_HW_ERR=HBM_REPAIRABLE_UNCORRECTABLE_ERROR nd-id=3"), now=3)
    gone = s.clear_devices({1, 3})
    assert sorted((p.device, p.reason) for p in gone) == [
        (1, "NeuronHasError_HBM_REPAIRABLE_UNCORRECTABLE_ERROR"),
        (3, "NeuronHasError_HBM_REPAIRABLE_UNCORRECTABLE_ERROR"),
    ]
    # uncorrectable memory needs a new instance: a reload leaves it until the next boot
    assert [p.reason for p in s.problems.values()] == ["NeuronHasError_HBM_UNCORRECTABLE_ERROR"]


def test_clear_after_and_new_boot() -> None:
    r = rules.parse({"conditions": [{"type": "NeuronHealth", "reason": "Ok"}],
                     "rules": [{"type": "permanent", "condition": "NeuronHealth", "reason": "Hang",
                                "pattern": "HANG", "clearAfter": 60}]})  # fmt: skip
    s = DetectorState(boot_id="b1")
    [m] = rules.match_message(r, "HANG nd-id=0")
    s.add(m, now=0)
    assert s.expire(now=59) == []
    assert len(s.expire(now=60)) == 1
    s.add(m, now=100)
    assert not s.new_boot("b1")
    assert s.problems
    assert s.new_boot("b2")
    assert s.problems == {}
    assert s.last_seq == -1


def test_state_round_trip_and_garbage(tmp_path: Path) -> None:
    s = DetectorState(boot_id="b1", last_seq=41)
    s.add(match("NEURON_HW_ERR=NC_UNCORRECTABLE_ERROR nd-id=7 nc-id=3"), now=5)
    s.conditions(DEFAULT, now=6)
    path = tmp_path / "state" / "state.json"
    save_state(path, s)
    loaded, warning = load_state(path)
    assert warning is None
    assert (loaded.boot_id, loaded.last_seq, list(loaded.problems)) == ("b1", 41, list(s.problems))
    assert loaded.conditions(DEFAULT, now=99)[0].last_transition == 6
    assert loaded.seq_source == "kmsg"
    # the format that numbered last_seq is kept, and a state file from before it was recorded is kmsg's
    s.seq_source = "syslog"
    save_state(path, s)
    assert load_state(path)[0].seq_source == "syslog"
    path.write_text('{"boot_id": "b1", "last_seq": 41}')
    assert load_state(path)[0].seq_source == "kmsg"
    path.write_text("{not json")
    fresh, warning = load_state(path)
    assert fresh.problems == {}
    assert warning is not None
    assert "unreadable" in warning


# --- AcceleratedHardwareReady, the condition EKS node auto repair and Karpenter act on (issue 56) -----


def test_accelerated_hardware_ready_turns_false_for_faults_that_need_a_reboot_or_a_new_instance() -> None:
    s = DetectorState(boot_id="b1")
    health, ready = s.conditions(DEFAULT, now=100, accelerated_hardware=True)
    assert (health.type, health.unhealthy) == ("NeuronHealth", False)
    assert (ready.type, ready.status, ready.reason, ready.unhealthy) == (
        "AcceleratedHardwareReady", "True", "NeuronAcceleratedHardwareIsReady", False,
    )  # fmt: skip
    s.add(match("NEURON_HW_ERR=HBM_REPAIRABLE_UNCORRECTABLE_ERROR nd-id=3"), now=150)
    _, ready = s.conditions(DEFAULT, now=160, accelerated_hardware=True)
    assert (ready.status, ready.reason, ready.last_transition) == (
        "False", "NeuronHBMRepairableUncorrectableError", 160,
    )  # fmt: skip
    s.add(match("NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=4 nc-id=1"), now=170)
    health, ready = s.conditions(DEFAULT, now=180, accelerated_hardware=True)
    # the latest fault names it, in EKS's node monitoring agent's own words; the transition stays
    assert (ready.status, ready.reason, ready.last_transition, ready.unhealthy) == (
        "False", "NeuronHBMUncorrectableError", 160, True,
    )  # fmt: skip
    assert "neuron3" in ready.message
    assert "neuron4" in ready.message
    assert health.unhealthy
    assert health.status == "True"
    s.clear_devices({3, 4})  # a reload mends the repairable one only
    _, ready = s.conditions(DEFAULT, now=190, accelerated_hardware=True)
    assert (ready.status, ready.reason) == ("False", "NeuronHBMUncorrectableError")
    assert s.new_boot("b2")
    _, ready = s.conditions(DEFAULT, now=200, accelerated_hardware=True)
    assert (ready.status, ready.reason, ready.last_transition) == ("True", "NeuronAcceleratedHardwareIsReady", 200)


def test_a_users_rule_whose_reason_the_table_does_not_know_leaves_accelerated_hardware_ready_alone() -> None:
    r = rules.parse({"conditions": [{"type": "NeuronHealth", "reason": "Ok"}],
                     "rules": [{"type": "permanent", "condition": "NeuronHealth", "reason": "SiteSpecific",
                                "pattern": "OUR_OWN"}]})  # fmt: skip
    s = DetectorState(boot_id="b1")
    [m] = rules.match_message(r, "OUR_OWN nd-id=1")
    s.add(m, now=1)
    health, ready = s.conditions(r, now=2, accelerated_hardware=True)
    assert health.status == "True"
    assert (ready.status, ready.unhealthy) == ("True", False)


def test_accelerated_hardware_ready_keeps_its_transition_across_a_restart(tmp_path: Path) -> None:
    s = DetectorState(boot_id="b1")
    s.add(match("NEURON_HW_ERR=DMA_ERROR nd-id=2 nc-id=0"), now=10)
    _, before = s.conditions(DEFAULT, now=11, accelerated_hardware=True)
    save_state(tmp_path / "state.json", s)
    restored, warning = load_state(tmp_path / "state.json")
    assert warning is None
    _, after = restored.conditions(DEFAULT, now=500, accelerated_hardware=True)
    assert (after.status, after.reason, after.last_transition) == ("False", "NeuronDMAError", before.last_transition)
