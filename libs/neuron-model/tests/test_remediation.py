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
