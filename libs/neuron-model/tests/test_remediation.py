"""The remediation controller's workflow state as it is kept on a Node: it reads back as written, and
an annotation it did not write is refused, never half read."""

from __future__ import annotations

import dataclasses

import pytest

from neuron_model import remediation
from neuron_model.remediation import Phase, WorkflowState


def test_a_state_round_trips() -> None:
    s = WorkflowState("DMA_ERROR", "NeuronHasError_DMA_ERROR", "replace", "b", Phase.REQUESTED, 1.5, 2.5)
    assert remediation.load(s.dump()) == s
    cancelled = dataclasses.replace(s, phase=Phase.CANCELLED, cordoned_by_us=True, why="an admin uncordoned")
    assert remediation.load(cancelled.dump()) == cancelled
    moved = s.to(Phase.CANCELLED, 9.0, "opted out")
    assert (moved.phase, moved.since, moved.why, moved.started) == (Phase.CANCELLED, 9.0, "opted out", 1.5)


def test_only_a_cancelled_workflow_holds_no_node() -> None:
    assert [p for p in Phase if not p.holds_node] == [Phase.CANCELLED]


@pytest.mark.parametrize("text", ["{", "[]", '{"v": 2}', '{"v": 1, "phase": "lost"}', '{"v":1,"fault":1}'])
def test_a_foreign_annotation_is_refused(text: str) -> None:
    with pytest.raises(remediation.StateError):
        remediation.load(text)


def test_an_escalated_state_round_trips_and_an_older_one_reads_unescalated() -> None:
    s = WorkflowState("DMA_ERROR", "r", "replace", "b2", Phase.REQUESTED, 1.5, 2.5, escalated="validation failed")
    assert remediation.load(s.dump()) == s
    older = s.dump().replace(',"escalated":"validation failed"', "")
    assert "escalated" not in older
    assert remediation.load(older).escalated == ""


REQUESTED = WorkflowState("DMA_ERROR", "r", "reboot", "boot-1", Phase.REQUESTED, 1.0, 2.0)


@pytest.mark.parametrize("phase", list(Phase))
def test_a_new_boot_awaits_validation_once_the_reboot_was_asked_for(phase: Phase) -> None:
    s = dataclasses.replace(REQUESTED, phase=phase)
    assert remediation.awaits_validation(s, "boot-2") is (phase in (Phase.REQUESTED, Phase.VALIDATING))
    assert not remediation.awaits_validation(s, "boot-1")  # the boot the workflow began on
    assert not remediation.awaits_validation(s, "")  # boot not known
    assert not remediation.awaits_validation(None, "boot-2")


P, F = remediation.VALIDATION_PASSED_REASON, remediation.VALIDATION_FAILED_REASON


@pytest.mark.parametrize(
    ("status", "reason", "message", "expected"),
    [
        ("True", P, remediation.verdict_message("boot-2", "passed"), True),
        ("False", F, remediation.verdict_message("boot-2", "exit 1"), False),
        ("True", P, remediation.verdict_message("boot-1", "passed"), None),  # an earlier boot's verdict
        ("True", P, remediation.verdict_message("boot-22", "passed"), None),  # a boot id that only starts alike
        ("True", F, remediation.verdict_message("boot-2", "x"), None),  # status and reason disagree
        ("False", P, remediation.verdict_message("boot-2", "x"), None),
        ("Unknown", "NeuronValidating", remediation.verdict_message("boot-2", "running"), None),
        (None, None, None, None),  # no condition
    ],
)
def test_the_controller_accepts_only_a_verdict_on_the_current_boot(
    status: str | None, reason: str | None, message: str | None, expected: bool | None
) -> None:
    assert remediation.verdict(status, reason, message, "boot-2") is expected
    assert remediation.verdict(status, reason, message, "") is None
