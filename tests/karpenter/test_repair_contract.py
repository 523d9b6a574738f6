"""Our `AcceleratedHardwareReady` held to Karpenter's node repair contract (issue 56, section 5).

Karpenter repairs a node when one of its conditions has the type and status of one of the cloud
provider's `RepairPolicies()` (and, in v1.15, a reason matching the policy's ReasonRegex) for longer
than the policy's toleration. The policies read here are the ones the test peer runs
(tests/karpenter/peer/main.go, AWS's provider's list): for AcceleratedHardwareReady, status False
for 10 minutes, replace the node. The detector's own code decides the condition for every fault of
the table; only the faults whose rung is a reboot or a new instance may match a policy, and every one
of those must. tests/karpenter/test_karpenter_repair.py shows Karpenter's controller acting on it.
"""

from __future__ import annotations

import re

import pytest

from karpenter import repair_peer
from neuron_health import faults
from neuron_health.faults import Rung
from neuron_model import node_health
from neuron_problem_detector import rules
from neuron_problem_detector.detector import ConditionStatus, DetectorState, Problem

ALL_FAULTS = (*faults.FAULTS, faults.UNKNOWN_FATAL, faults.UNKNOWN_NOTICE)


def repaired_by(condition: ConditionStatus, policies: list[repair_peer.Policy]) -> list[repair_peer.Policy]:
    """The policies that match `condition` as Karpenter matches them: type, status, reason regex
    (regexp.MatchString: a search, not a full match)."""
    return [
        p
        for p in policies
        if p.condition_type == condition.type
        and p.condition_status == condition.status
        and re.search(p.reason_regex, condition.reason) is not None
    ]


def detector_conditions(fault: faults.Fault | None) -> dict[str, ConditionStatus]:
    """What the detector decides with `fault` active on device 0 (or nothing active)."""
    state = DetectorState(boot_id="boot")
    if fault is not None:
        p = Problem(node_health.CONDITION, fault.reason, 0, f"neuron0: {fault.reason}", 1000.0)
        state.problems[p.key] = p
    return {c.type: c for c in state.conditions(rules.default_rules(), 1000.0, accelerated_hardware=True)}


def test_the_peer_carries_awss_policy_for_our_condition() -> None:
    policies = repair_peer.policies()
    ours = [p for p in policies if p.condition_type == node_health.ACCELERATED_HARDWARE_CONDITION]
    assert len(ours) == 1, policies
    assert (ours[0].condition_status, ours[0].action) == ("False", "ReplaceNode")
    assert ours[0].toleration_seconds is None  # the flag's, which defaults to AWS's
    assert repair_peer.default_accelerated_hardware_toleration() == 600.0
    # AWS's other node monitoring agent conditions, and Ready, wait 30 minutes
    assert {p.condition_type: p.toleration_seconds for p in policies if p is not ours[0]} == {
        "Ready": 1800.0,
        "StorageReady": 1800.0,
        "NetworkingReady": 1800.0,
        "KernelReady": 1800.0,
        "ContainerRuntimeReady": 1800.0,
    }
    assert node_health.CONDITION not in {p.condition_type for p in policies}  # Karpenter never reads NeuronHealth


@pytest.mark.parametrize("fault", ALL_FAULTS, ids=[f.kind for f in ALL_FAULTS])
def test_only_a_reboot_or_replacement_rung_makes_karpenter_repair(fault: faults.Fault) -> None:
    policies = repair_peer.policies()
    conditions = detector_conditions(fault)
    ours = conditions[node_health.ACCELERATED_HARDWARE_CONDITION]
    matched = [p for c in conditions.values() for p in repaired_by(c, policies)]
    if fault.rung in (Rung.REBOOT, Rung.REPLACE):
        assert (ours.status, ours.reason) == ("False", fault.accelerated_hardware_reason)
        assert [p.condition_type for p in matched] == [node_health.ACCELERATED_HARDWARE_CONDITION]
    else:
        assert (ours.status, ours.reason) == ("True", node_health.ACCELERATED_HARDWARE_READY_REASON)
        assert matched == [], f"{fault.kind} ({fault.rung}) would have Karpenter replace the node"


def test_a_healthy_node_matches_no_policy() -> None:
    conditions = detector_conditions(None)
    ours = conditions[node_health.ACCELERATED_HARDWARE_CONDITION]
    assert (ours.status, ours.reason) == ("True", node_health.ACCELERATED_HARDWARE_READY_REASON)
    assert [p for c in conditions.values() for p in repaired_by(c, repair_peer.policies())] == []


def test_the_node_monitoring_agents_four_reasons_reach_karpenter_unchanged() -> None:
    # A user's own reason-specific policy (v1.15's ReasonRegex) keyed on EKS's reasons keeps working.
    expected = {
        "SRAM_UNCORRECTABLE_ERROR": "NeuronSRAMUncorrectableError",
        "NC_UNCORRECTABLE_ERROR": "NeuronNCUncorrectableError",
        "HBM_UNCORRECTABLE_ERROR": "NeuronHBMUncorrectableError",
        "DMA_ERROR": "NeuronDMAError",
    }
    for kind, reason in expected.items():
        assert detector_conditions(faults.BY_KIND[kind])[node_health.ACCELERATED_HARDWARE_CONDITION].reason == reason
