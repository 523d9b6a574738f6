"""The simulator's device reset: what a write of the driver's reset node ends, and what it leaves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from neuron_driver import layout
from neuron_sim import node as sim


@pytest.fixture
def trn2(tmp_path: Path) -> Path:
    sim.create(tmp_path / "node", "trn2.48xlarge", driver_version="2.30.2.0")
    return tmp_path / "node"


def verdict(root: Path, device: int) -> str:
    d = layout.HostLayout(root).device_dir(device)
    return layout.health_status_file(d, layout.UNHEALTHY_COMPONENTS_FILE).read_text().strip()


def heartbeat(root: Path, device: int) -> str:
    d = layout.HostLayout(root).device_dir(device)
    return layout.health_status_file(d, layout.HEARTBEAT_FILE).read_text().strip()


def reset_count(root: Path, device: int) -> list[int]:
    d = layout.HostLayout(root).device_dir(device)
    return [
        int(layout.core_other_info_value_file(c, "reset_req_count").read_text()) for c in sorted(d.glob("neuron_core*"))
    ]


def test_a_reset_ends_transient_states_and_leaves_defects_and_counters(trn2: Path) -> None:
    assert sim.device_state(trn2, 3) == layout.DEVICE_STATE_READY  # what a set-up device's node reads
    sim.set_unhealthy_components(trn2, 3, ["firmware_service_api", "hbm"], transient=["firmware_service_api"])
    sim.bump_counter(trn2, 3, "mem_ecc_uncorrected", by=2)
    sim.bump_counter(trn2, 3, "hw_hbm_ue_error", core=1)
    sim.stall_heartbeat(trn2, 3)
    before = heartbeat(trn2, 3)
    cores = len(reset_count(trn2, 3))
    ended = sim.reset_device(trn2, 3)
    assert ended == ["unhealthy_components:firmware_service_api", "healthcheck_heartbeat:stalled"]
    assert verdict(trn2, 3) == "hbm"  # the defect stays listed
    assert heartbeat(trn2, 3) != before
    assert not sim.heartbeat_stalled(trn2, 3)
    assert int(sim.counter_path(trn2, 3, "mem_ecc_uncorrected").read_text()) == 2  # cumulative
    assert int(sim.counter_path(trn2, 3, "hw_hbm_ue_error", core=1).read_text()) == 1
    assert reset_count(trn2, 3) == [1] * cores  # the driver counts each core's reset request
    assert sim.device_state(trn2, 3) == layout.DEVICE_STATE_READY
    log = layout.HostLayout(trn2).kmsg.read_text()
    assert "nd3: initiating device reset request 4294967295" in log
    assert "nd3: reset request 4294967295 completed" in log
    # a second reset ends nothing more: the defect is no state a reset ends
    assert sim.reset_device(trn2, 3) == []
    assert verdict(trn2, 3) == "hbm"


def test_a_persistent_heartbeat_stall_survives_a_reset(trn2: Path) -> None:
    sim.beat_heartbeat(trn2, 0)
    sim.stall_heartbeat(trn2, 0, persistent=True)
    before = heartbeat(trn2, 0)
    assert sim.reset_device(trn2, 0) == []
    assert heartbeat(trn2, 0) == before
    assert sim.heartbeat_stalled(trn2, 0)


def test_a_stall_resumes_by_itself_without_a_reset_unless_persistent(trn2: Path) -> None:
    sim.beat_heartbeat(trn2, 1)
    sim.stall_heartbeat(trn2, 1)
    sim.stall_heartbeat(trn2, 2, persistent=True)
    before = heartbeat(trn2, 1), reset_count(trn2, 1)
    assert sim.resume_heartbeat(trn2, 1) == "resumed"
    assert not sim.heartbeat_stalled(trn2, 1)
    assert heartbeat(trn2, 1) != before[0]  # beaten again at once
    assert reset_count(trn2, 1) == before[1]  # and no reset was asked
    assert sim.resume_heartbeat(trn2, 2) == "persistent: not resumed"
    assert sim.heartbeat_stalled(trn2, 2)
    assert sim.resume_heartbeat(trn2, 2, mended=True) == "resumed"
    assert not sim.heartbeat_stalled(trn2, 2)


def test_only_a_written_reset_node_resets_its_device(trn2: Path) -> None:
    sim.set_unhealthy_components(trn2, 1, ["link_host"], transient=["link_host"])
    sim.set_unhealthy_components(trn2, 2, ["link_host"], transient=["link_host"])
    assert sim.apply_reset_requests(trn2) == {}  # nothing written yet
    # what a node agent does: any write through the driver's class path
    (layout.HostLayout(trn2).reset_node(2)).write_text("1\n")
    assert sim.apply_reset_requests(trn2) == {2: ["unhealthy_components:link_host"]}
    assert (verdict(trn2, 1), verdict(trn2, 2)) == ("link_host", "")
    assert sim.apply_reset_requests(trn2) == {}  # once per write


def test_transient_marks_only_listed_components_and_only_firmware_faults(trn2: Path) -> None:
    with pytest.raises(sim.SimError, match="not listed"):
        sim.set_unhealthy_components(trn2, 1, ["hbm"], transient=["sram"])
    with pytest.raises(sim.SimError, match="cumulative"):
        sim.inject_fault(trn2, "HBM_UNCORRECTABLE_ERROR", 1, via="device-counter", transient=True)
    sim.inject_fault(trn2, "UNHEALTHY_LINK_HOST", 1, via="firmware", transient=True)
    sim.inject_fault(trn2, "UNHEALTHY_SRAM", 1, via="firmware")
    assert sim.reset_device(trn2, 1) == ["unhealthy_components:link_host"]
    assert verdict(trn2, 1) == "sram"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "neuron_sim.cli", *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.integration  # runs neuron-sim's CLI and its driver loop as processes
def test_the_driver_loop_and_the_cli(trn2: Path) -> None:
    root = str(trn2)
    assert run_cli("inject", "--root", root, "heartbeat-stall", "--device", "4").stdout.strip() == "stalled"
    before = heartbeat(trn2, 4), heartbeat(trn2, 5)
    layout.HostLayout(trn2).reset_node(4).write_text("1\n")
    done = run_cli("driver", "--root", root, "--count", "1", "--heartbeat-every", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "neuron4: reset; ended: healthcheck_heartbeat:stalled"
    # the reset restarted device 4's heartbeat, the loop beat device 5's (not stalled) too
    assert heartbeat(trn2, 4) != before[0]
    assert heartbeat(trn2, 5) != before[1]
    out = run_cli("inject", "--root", root, "unhealthy-components", "--device", "6", "--components", "hbm,sram",
                  "--transient", "sram")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert run_cli("inject", "--root", root, "reset", "--device", "6").stdout.strip() == "unhealthy_components:sram"
    assert run_cli("inject", "--root", root, "reset", "--device", "6").stdout.strip() == "nothing ended"
    bad = run_cli("inject", "--root", root, "reset", "--device", "99")
    assert bad.returncode == 2
    assert "device 99 does not exist" in bad.stderr


def test_a_reboot_ends_what_a_reset_ends_and_keeps_the_defects(trn2: Path) -> None:
    sim.set_unhealthy_components(trn2, 2, ["hbm", "link_host"], transient=["link_host"])
    sim.stall_heartbeat(trn2, 2)
    sim.stall_heartbeat(trn2, 7, persistent=True)
    sim.reboot(trn2)
    assert verdict(trn2, 2) == "hbm"
    assert not sim.heartbeat_stalled(trn2, 2)
    assert sim.heartbeat_stalled(trn2, 7)
