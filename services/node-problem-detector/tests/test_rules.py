from __future__ import annotations

from pathlib import Path

import pytest

from neuron_driver.counters import devices_reset
from neuron_driver.kmsg import format_hw_error
from neuron_health import faults
from neuron_problem_detector import rules

DEFAULT = rules.default_rules()


@pytest.mark.parametrize("kind", [f.kind for f in faults.FAULTS if f.kernel_names and f.takes_device_out])
def test_every_hw_error_kind_sets_its_aws_reason(kind: str) -> None:
    line = format_hw_error(kind, 3, 1, "19fcda00f5ff6eb9")
    [m] = rules.match_message(DEFAULT, line)
    assert m.rule.permanent
    assert m.rule.reason == f"NeuronHasError_{kind}"
    assert (m.device, m.core, m.serial) == (3, 1, "19fcda00f5ff6eb9")


def test_driver_lines_are_temporary_with_the_device_from_the_pattern() -> None:
    [m] = rules.match_message(DEFAULT, "neuron:ndma_wait: DMA completion timeout on nd05 queue 2")
    assert (m.rule.permanent, m.rule.reason, m.device) == (False, "NeuronDMACompletionTimeout", 5)
    [m] = rules.match_message(DEFAULT, "neuron:nr_reset: nd12: reset request 7 failed")
    assert (m.rule.reason, m.device) == ("NeuronResetFailed", 12)
    assert rules.match_message(DEFAULT, "eth0: link up") == []


def test_counters_first_read_and_growth() -> None:
    first = {(0, "mem_ecc_uncorrected"): 0, (1, "sram_ecc_uncorrected"): 3}
    [m] = rules.match_counters(DEFAULT, None, first)
    assert (m.rule.reason, m.device) == ("NeuronHasError_SRAM_UNCORRECTABLE_ERROR", 1)
    second = first | {(0, "mem_ecc_uncorrected"): 1}
    [m] = rules.match_counters(DEFAULT, first, second)
    assert (m.rule.reason, m.device) == ("NeuronHasError_HBM_UNCORRECTABLE_ERROR", 0)
    assert devices_reset(second, {(0, "mem_ecc_uncorrected"): 0, (1, "sram_ecc_uncorrected"): 3}) == {0}


def test_threshold() -> None:
    r = rules.parse({"conditions": [{"type": "NeuronHealth", "reason": "Ok"}],
                     "rules": [{"type": "permanent", "condition": "NeuronHealth", "reason": "Many",
                                "counter": "mem_ecc_uncorrected", "threshold": 5}]})  # fmt: skip
    assert rules.match_counters(r, {(0, "mem_ecc_uncorrected"): 0}, {(0, "mem_ecc_uncorrected"): 4}) == []
    assert len(rules.match_counters(r, {(0, "mem_ecc_uncorrected"): 0}, {(0, "mem_ecc_uncorrected"): 5})) == 1


GOOD_CONDITION = [{"type": "NeuronHealth", "reason": "NeuronHasNoError"}]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected a mapping"),
        ({"conditions": GOOD_CONDITION, "rules": [], "extra": 1}, "unknown key(s) extra"),
        ({"conditions": [], "rules": []}, "conditions: must be a non-empty list"),
        ({"conditions": [{"type": "Neuron Health", "reason": "X"}], "rules": []}, "conditions[0].type"),
        ({"conditions": [{"type": "A", "reason": "has space"}], "rules": []}, "conditions[0].reason"),
        ({"conditions": GOOD_CONDITION * 2, "rules": [{}]}, "listed twice"),
        ({"conditions": GOOD_CONDITION, "rules": []}, "rules: must be a non-empty list"),
        ({"conditions": GOOD_CONDITION, "rules": [{"type": "sometimes"}]}, "rules[0].type: must be 'permanent' or 'temporary'"),
        ({"conditions": GOOD_CONDITION, "rules": [{"type": "permanent", "reason": "X", "pattern": "a"}]}, "rules[0].condition"),
        ({"conditions": GOOD_CONDITION, "rules": [{"type": "temporary", "reason": "X"}]}, "exactly one of 'pattern' or 'counter'"),
        ({"conditions": GOOD_CONDITION, "rules": [{"type": "temporary", "reason": "X", "pattern": "(("}]}, "not a valid regular expression"),
        ({"conditions": GOOD_CONDITION, "rules": [{"type": "temporary", "reason": "X", "counter": "Bad-Name"}]}, "must be a driver counter"),
        ({"conditions": GOOD_CONDITION, "rules": [{"type": "temporary", "reason": "X", "counter": "hw_error", "threshold": 0}]}, "threshold"),
        ({"conditions": GOOD_CONDITION, "rules": [{"type": "temporary", "reason": "X", "pattern": "a", "clearAfter": -1}]}, "clearAfter"),
        ({"conditions": GOOD_CONDITION, "rules": [{"type": "temporary", "reason": "X", "pattern": "a", "condition": "NeuronHealth"}]}, "only permanent rules"),
        ({"conditions": GOOD_CONDITION, "rules": [{"type": "temporary", "reason": "X", "pattern": "a", "clearOnDriverReload": True}]}, "only permanent rules set a problem"),
        ({"conditions": GOOD_CONDITION, "rules": [{"type": "permanent", "condition": "NeuronHealth", "reason": "X", "pattern": "a", "clearOnDriverReload": "yes"}]}, "true or false"),
    ],
)  # fmt: skip
def test_invalid_rules_say_where_and_what(data: object, message: str) -> None:
    with pytest.raises(rules.RulesError) as err:
        rules.parse(data, "rules.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("rules.yaml: ")


def test_unreadable_and_non_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(rules.RulesError, match="cannot read rules file"):
        rules.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: [unclosed\n")
    with pytest.raises(rules.RulesError, match="not valid YAML"):
        rules.load(bad)


def test_reasons_of() -> None:
    assert "NeuronHasError_DMA_ERROR" in DEFAULT.reasons_of("NeuronHealth")
    assert "NeuronDMACompletionTimeout" not in DEFAULT.reasons_of("NeuronHealth")


def test_default_rules_are_the_fault_table() -> None:
    """Every fault's kernel pattern and counters become one rule each, of the fault's weight."""
    by_source = {(r.pattern.pattern if r.pattern else r.counter): r for r in DEFAULT.rules}
    for fault in faults.FAULTS:
        sources = [fault.kernel_pattern, *fault.counters]
        for source in filter(None, sources):
            rule = by_source.pop(source)
            assert (rule.reason, rule.permanent) == (fault.reason, fault.takes_device_out)
            assert rule.clear_on_driver_reload == fault.severity.clears_on_driver_reload
            assert rule.condition == (faults.CONDITION if fault.takes_device_out else None)
    assert sorted(r.reason for r in by_source.values()) == sorted(
        [faults.UNKNOWN_FATAL.reason, faults.UNKNOWN_NOTICE.reason]
    )


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("NEURON_HW_ERR=BRAND_NEW_KIND nd-id=2 nc-id=0 action=TERMINATE_INSTANCE", "NeuronHasError_UNKNOWN_HW_ERROR"),
        ("NEURON_HW_ERR=BRAND_NEW_KIND nd-id=2 nc-id=0 action=RESET", "NeuronUnknownHardwareError"),
        ("NEURON_HW_ERR=DMA_ERROR nd-id=2 action=TERMINATE_INSTANCE", "NeuronHasError_DMA_ERROR"),
    ],
)
def test_unknown_kinds_follow_the_lines_action(line: str, reason: str) -> None:
    [m] = rules.match_message(DEFAULT, line)
    assert (m.rule.reason, m.device) == (reason, 2)
    assert [f.fault.reason for f in faults.match_kernel_line(line)] == [reason]


def test_core_counters_are_rules_too() -> None:
    r = rules.parse({"conditions": GOOD_CONDITION,
                     "rules": [{"type": "permanent", "condition": "NeuronHealth", "reason": "Nc",
                                "counter": "hw_nc_ue_error"}]})  # fmt: skip
    assert r.rules[0].core_counter
    [m] = rules.match_counters(r, {(4, "hw_nc_ue_error"): 0}, {(4, "hw_nc_ue_error"): 1})
    assert m.device == 4
