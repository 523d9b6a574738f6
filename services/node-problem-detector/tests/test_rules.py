from __future__ import annotations

from pathlib import Path

import pytest

from neuron_problem_detector import rules
from neuron_sysfs.kmsg import HW_ERROR_KINDS, format_hw_error

DEFAULT = rules.load(rules.DEFAULT_RULES)


@pytest.mark.parametrize("kind", [k for k in HW_ERROR_KINDS if k != "HANG_ON_COLLECTIVES"])
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
    assert rules.counters_reset(second, {(0, "mem_ecc_uncorrected"): 0, (1, "sram_ecc_uncorrected"): 3}) == {0}


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
        ({"conditions": GOOD_CONDITION, "rules": [{"type": "temporary", "reason": "X", "counter": "Bad-Name"}]}, "driver counter name"),
        ({"conditions": GOOD_CONDITION, "rules": [{"type": "temporary", "reason": "X", "counter": "a", "threshold": 0}]}, "threshold"),
        ({"conditions": GOOD_CONDITION, "rules": [{"type": "temporary", "reason": "X", "pattern": "a", "clearAfter": -1}]}, "clearAfter"),
        ({"conditions": GOOD_CONDITION, "rules": [{"type": "temporary", "reason": "X", "pattern": "a", "condition": "NeuronHealth"}]}, "only permanent rules"),
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
