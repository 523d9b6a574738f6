from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from neuron_driver import layout
from neuron_driver.kmsg import format_hw_error
from neuron_health import faults
from neuron_health.faults import Severity
from neuron_sim import node as sim


def test_a_counter_or_kernel_name_belongs_to_one_fault() -> None:
    counters = [c for f in faults.FAULTS for c in f.counters]
    names = [n for f in faults.FAULTS for n in f.kernel_names]
    assert len(set(counters)) == len(counters)
    assert len(set(names)) == len(names)


def test_only_condition_setting_faults_take_a_device_out() -> None:
    for fault in (*faults.FAULTS, faults.UNKNOWN_FATAL, faults.UNKNOWN_NOTICE):
        in_service = fault.severity in (Severity.TRANSIENT, Severity.MULTI_NODE_UNFIT)
        assert fault.takes_device_out is fault.severity.takes_device_out is (not in_service)
        # a link fault keeps the device for work on this node and only marks it unfit for multi-node work
        assert fault.severity.unfit_for_multi_node is (fault.severity is Severity.MULTI_NODE_UNFIT)
        assert fault.severity.clears_on_driver_reload is (fault.severity is Severity.UNTIL_REBOOT)
        if fault.takes_device_out:
            assert fault.reason == f"NeuronHasError_{fault.kind}"  # AWS's reasons, so existing alerts keep working


@pytest.mark.parametrize("fault", [f for f in faults.FAULTS if f.kernel_names], ids=lambda f: f.kind)
def test_each_runtime_line_names_its_fault_device_and_core(fault: faults.Fault) -> None:
    line = format_hw_error(fault.kernel_names[0], 3, 1, "19fcda00f5ff6eb9", action="TERMINATE_INSTANCE")
    [found] = faults.match_kernel_line(line)
    assert (found.fault, found.device, found.core, found.serial) == (fault, 3, 1, "19fcda00f5ff6eb9")


@pytest.mark.parametrize(
    "line",
    [
        "",
        "NEURON_HW_ERR=",
        "neuron_hw_err=dma_error nd-id=1",
        "NEURON_HW_ERR=DMA_ERRORS nd-id=1",  # a longer word is another kind: unknown, and says no action
        "\x00\xff garbage NEURON_HW_ERR",
        "DMA completion timeout on ndXY",
    ],
)
def test_garbage_matches_no_known_fault(line: str) -> None:
    found = faults.match_kernel_line(line)
    assert all(f.fault in (faults.UNKNOWN_NOTICE, faults.UNKNOWN_FATAL) or f.device is None for f in found)
    assert all(f.fault.kind not in {"DMA_ERROR"} for f in found)


def test_driver_lines_name_the_device_from_the_message() -> None:
    [found] = faults.match_kernel_line("neuron:ndma_wait: DMA completion timeout on nd05 queue 2")
    assert (found.fault.kind, found.device) == ("DMA_COMPLETION_TIMEOUT", 5)


def test_patterns_compile_and_unknown_patterns_exclude_every_known_kind() -> None:
    for _, pattern in faults.kernel_rules():
        re.compile(pattern)
    for name in faults.KERNEL_NAMES:
        line = f"NEURON_HW_ERR={name} nd-id=0 action=TERMINATE_INSTANCE"
        assert [f.fault.kind for f in faults.match_kernel_line(line)] == [faults.BY_KERNEL_NAME[name].kind]


def test_sim_injects_every_fault_through_every_source(tmp_path: Path) -> None:
    sim.create(tmp_path, "trn2.3xlarge", driver_version="2.30.2.0")
    for fault in faults.FAULTS:
        if fault.kernel_pattern:
            assert "kernel line" in sim.inject_fault(tmp_path, fault.kind, 0, via="kernel")
        for counter in [c for c in fault.device_counters if not layout.is_firmware_counter(c)][:1]:
            assert sim.inject_fault(tmp_path, fault.kind, 0, via="device-counter") == f"{counter}=1"
        if fault.kind == "HEALTHCHECK_HEARTBEAT_STALE":  # stale by standing still, not by a write
            with pytest.raises(sim.SimError, match="standing still"):
                sim.inject_fault(tmp_path, fault.kind, 0, via="firmware")
        elif "firmware" in sim.sources_of(fault):
            component = fault.device_counters[0].removeprefix(layout.FIRMWARE_COUNTER_PREFIX)
            assert component in sim.inject_fault(tmp_path, fault.kind, 0, via="firmware").split("=")[1].split(",")
        assert sim.sources_of(fault) or fault.kind == "HEALTHCHECK_HEARTBEAT_STALE", fault.kind
        for counter in fault.core_counters[:1]:
            assert sim.inject_fault(tmp_path, fault.kind, 0, via="core-counter", core=1) == f"{counter}=1"
    with pytest.raises(sim.SimError, match="does not show through"):
        sim.inject_fault(tmp_path, "DMA_COMPLETION_TIMEOUT", 0, via="device-counter")
    with pytest.raises(sim.SimError, match="unknown fault kind"):
        sim.inject_fault(tmp_path, "NOPE", 0)
    sim.reload_driver(tmp_path)
    assert sim.bump_counter(tmp_path, 0, "sram_ecc_uncorrected") == 1


def test_readme_fault_table_is_generated_from_the_table() -> None:
    readme = (Path(__file__).resolve().parents[3] / "docs" / "device-plugin.md").read_text()
    begin, end = "<!-- faults:begin (neuron-sim faults) -->", "<!-- faults:end -->"
    assert begin in readme, "docs/device-plugin.md lacks the generated fault table"
    table = readme.split(begin, 1)[1].split(end, 1)[0].strip()
    assert table == faults.markdown_table(), "docs/device-plugin.md's fault table is stale: paste `neuron-sim faults`"


# --- the remediation ladder (issue 56) --------------------------------------------------------------


def test_eks_node_monitoring_agents_four_reasons_come_out_of_the_rule_unchanged() -> None:
    # shared/reference/fleet-and-scale.md: the agent's reasons for the four kinds it matches
    eks = {
        "SRAM_UNCORRECTABLE_ERROR": "NeuronSRAMUncorrectableError",
        "NC_UNCORRECTABLE_ERROR": "NeuronNCUncorrectableError",
        "HBM_UNCORRECTABLE_ERROR": "NeuronHBMUncorrectableError",
        "DMA_ERROR": "NeuronDMAError",
    }
    assert {kind: faults.BY_KIND[kind].accelerated_hardware_reason for kind in eks} == eks
    assert faults.BY_KIND["HBM_REPAIRABLE_UNCORRECTABLE_ERROR"].accelerated_hardware_reason == (
        "NeuronHBMRepairableUncorrectableError"
    )
    reasons = [f.accelerated_hardware_reason for f in faults.BY_KIND.values()]
    assert len(set(reasons)) == len(reasons), "two fault kinds share an AcceleratedHardwareReady reason"
    assert all(re.fullmatch(r"Neuron[A-Z][A-Za-z]+", r) for r in reasons), reasons


def test_every_rung_follows_the_severity_and_no_fault_claims_a_device_reset_without_a_source() -> None:
    rungs = {f.kind: f.rung for f in faults.BY_KIND.values()}
    assert rungs["HBM_REPAIRABLE_UNCORRECTABLE_ERROR"] is faults.Rung.REBOOT
    assert rungs["HBM_UNCORRECTABLE_ERROR"] is faults.Rung.REPLACE
    assert rungs["UNKNOWN_HW_ERROR"] is faults.Rung.REPLACE
    assert rungs["HANG_ON_COLLECTIVES"] is faults.Rung.EVENT
    for f in faults.BY_KIND.values():
        # the condition others replace nodes on turns False exactly where the device leaves service, at
        # once or once the node agent's validation escalates
        assert (f.rung.needs_new_boot_or_instance or f.rung.node_agent_first) == f.takes_device_out, f.kind
        assert f.escalated_rung in (faults.Rung.REBOOT, faults.Rung.REPLACE)
        assert f.rung.node_agent_first or not f.takes_device_out or f.rung is f.escalated_rung, f.kind
    # only a stalled heartbeat (the device unchecked, not known broken) is validated in place, before a drain
    assert [f.kind for f in faults.BY_KIND.values() if f.rung is faults.Rung.VALIDATE] == [
        "HEALTHCHECK_HEARTBEAT_STALE"
    ]
    assert faults.BY_KIND["HEALTHCHECK_HEARTBEAT_STALE"].escalated_rung is faults.Rung.REBOOT
    # nothing in AWS's documentation or the driver's source says a reset clears a fault: no fault says so
    assert not [f.kind for f in faults.BY_KIND.values() if f.cleared_by_device_reset]
    reset = dataclasses.replace(faults.BY_KIND["HBM_REPAIRABLE_UNCORRECTABLE_ERROR"], cleared_by_device_reset=True)
    assert reset.rung is faults.Rung.DEVICE_RESET
    assert not reset.rung.needs_new_boot_or_instance


def test_docs_remediation_ladder_is_generated_from_the_table() -> None:
    page = (Path(__file__).resolve().parents[3] / "docs" / "remediation.md").read_text()
    begin, end = "<!-- ladder:begin (neuron-sim faults --ladder) -->", "<!-- ladder:end -->"
    assert begin in page, "docs/remediation.md lacks the generated ladder"
    assert page.split(begin, 1)[1].split(end, 1)[0].strip() == faults.remediation_table()
