"""The layout check on every driver generation's tree, and on trees whose nodes moved."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from neuron_driver import driver_layout, inventory_cli, layout
from neuron_driver.counters import DEVICE_LEVEL, CounterKind, CounterReader
from neuron_driver.driver_layout import GenerationSource
from neuron_driver.inventory import scan
from neuron_sim import node as sim

# One version per generation the simulator writes; trn2.3xlarge (one device) has the firmware's
# verdict (trn2), trn1.2xlarge has not: between them every branch of a generation's paths.
VERSIONS = {"pre-2.28": "2.27.4.0", "2.28": "2.28.0.0", "2.30.2": "2.30.2.0"}
TYPES = ("trn2.3xlarge", "trn1.2xlarge")


def _node(tmp_path: Path, instance_type: str, version: str | None) -> Path:
    root = tmp_path / f"{instance_type}-{version}"
    sim.create(root, instance_type, driver_version=version)
    return root


def test_every_supported_generation_has_a_simulated_tree() -> None:
    assert {g.name for g in driver_layout.SIMULATED} == set(VERSIONS)
    assert [g for g in driver_layout.GENERATIONS if not g.paths_known] == [driver_layout.GEN_2_31]


@pytest.mark.parametrize("instance_type", TYPES)
@pytest.mark.parametrize("generation", sorted(VERSIONS))
def test_each_generations_tree_passes_and_is_recognised(tmp_path: Path, generation: str, instance_type: str) -> None:
    root = _node(tmp_path, instance_type, VERSIONS[generation])
    report = driver_layout.check_layout(root, scan(root, env={}))
    assert report.ok, report.lines()
    assert (report.generation.name, report.generation_source) == (generation, GenerationSource.VERSION)
    assert report.devices_checked == 1
    # without a version file, the tree itself tells the generation
    layout.HostLayout(root).driver_version.unlink()
    by_layout = driver_layout.check_layout(root, scan(root, env={}))
    assert by_layout.ok
    assert by_layout.generation_source is GenerationSource.LAYOUT
    assert by_layout.generation.name == generation


def test_no_version_is_the_tree_before_2_28(tmp_path: Path) -> None:
    root = _node(tmp_path, "trn2.3xlarge", None)
    device = layout.HostLayout(root).device_dir(0)
    assert not layout.health_status_dir(device).exists()
    assert driver_layout.check_layout(root, scan(root, env={})).generation is driver_layout.PRE_2_28


def test_a_renamed_hardware_directory_is_named_per_device_with_where_it_went(tmp_path: Path) -> None:
    root = tmp_path / "n"
    sim.create(root, "trn2.48xlarge", driver_version="2.30.2.0")
    sim.move_node(root, 3, "stats/hardware", "stats/hardware_v2")
    report = driver_layout.check_layout(root, scan(root, env={}))
    assert not report.ok
    missing = {(m.device, m.path): m for m in report.missing}
    assert {d for d, _ in missing} == {3}
    hit = missing[3, "stats/hardware/mem_ecc_uncorrected"]
    assert "directory stats/hardware gone" in hit.found_instead
    assert "stats/hardware_v2/mem_ecc_uncorrected" in hit.found_instead
    assert (3, "stats/hardware/health_status/unhealthy_components") in missing
    assert "stats/hardware/mem_ecc_uncorrected on neuron3" in report.summary()
    assert report.summary().startswith("health counters unreadable")


def test_a_moved_core_status_counter_is_named(tmp_path: Path) -> None:
    root = _node(tmp_path, "trn1.2xlarge", "2.28.0.0")
    core = layout.core_dir(layout.HostLayout(root).device_dir(0), 1)
    os.rename(core / "stats" / "status" / "hw_nc_ue_error", core / "stats" / "status" / "hw_nc_uncorrectable")
    report = driver_layout.check_layout(root, scan(root, env={}))
    assert [(m.device, m.core, m.path) for m in report.missing] == [(0, 1, "stats/status/hw_nc_ue_error/total")]
    assert "has no total" not in report.missing[0].found_instead
    assert "directory stats/status/hw_nc_ue_error gone" in report.missing[0].found_instead


def test_a_version_newer_than_its_tree_names_what_the_version_promises(tmp_path: Path) -> None:
    root = _node(tmp_path, "trn2.3xlarge", None)
    sim.write_attr(layout.HostLayout(root).driver_version, "2.30.2.0\n")
    report = driver_layout.check_layout(root, scan(root, env={}))
    paths = {m.path for m in report.missing}
    assert "stats/hardware/health_status/healthcheck_heartbeat" in paths
    assert "stats/hardware/mem_ecc_corrected" in paths
    assert "stats/hardware/mem_ecc_uncorrected" not in paths


def test_driver_2_31_is_checked_against_the_known_paths_and_says_it(tmp_path: Path) -> None:
    with pytest.raises(sim.SimError, match="moved sysfs nodes"):
        sim.create(tmp_path / "x", "trn2.3xlarge", driver_version="2.31.0.0")
    root = _node(tmp_path, "trn2.3xlarge", "2.30.2.0")
    sim.write_attr(layout.HostLayout(root).driver_version, "2.31.8.0\n")
    report = driver_layout.check_layout(root, scan(root, env={}))
    assert report.generation is driver_layout.GEN_2_31
    assert report.ok
    assert any("no source here names" in n for n in report.notes)


def test_inventory_check_cli_fails_naming_the_missing_counter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _node(tmp_path, "trn2.3xlarge", "2.30.2.0")
    assert inventory_cli.main(["--root", str(root), "--check"]) == 0
    assert "every path the stack reads is there" in capsys.readouterr().out
    sim.move_node(root, 0, "stats/hardware", "stats/hw")
    assert inventory_cli.main(["--root", str(root), "--check"]) == 1
    out = capsys.readouterr().out
    assert "neuron0: stats/hardware/sram_ecc_uncorrected not found (directory stats/hardware gone" in out
    assert inventory_cli.main(["--root", str(root), "--check", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False
    assert data["generation"] == "2.30.2"
    assert {"device": 0, "core": None, "path": "stats/hardware/mem_ecc_corrected"}.items() <= data["missing"][4].items()


def test_the_reader_reads_each_generations_health_files(tmp_path: Path) -> None:
    root = _node(tmp_path, "trn2.3xlarge", "2.30.2.0")
    sim.bump_counter(root, 0, "mem_ecc_corrected", by=5)
    sim.bump_counter(root, 0, "hbm_ecc_err_count", by=2)
    sim.set_unhealthy_components(root, 0, ["hbm", "link_efa"])
    sim.beat_heartbeat(root, 0)
    reader = CounterReader(scan(root, env={}), firmware=True)
    snap = reader.read()
    assert snap.issues == ()
    assert snap.get(CounterKind.HARDWARE, 0, DEVICE_LEVEL, "mem_ecc_corrected") == 5
    assert snap.get(CounterKind.HARDWARE, 0, DEVICE_LEVEL, "sram_ecc_corrected") == 0
    assert snap.get(CounterKind.HEALTH_STATUS, 0, DEVICE_LEVEL, "hbm_ecc_err_count") == 2
    # health_status/ is a directory of stats/hardware, not a counter of it
    assert snap.get(CounterKind.HARDWARE, 0, DEVICE_LEVEL, "health_status") is None
    assert snap.firmware[0].unhealthy == frozenset({"hbm", "link_efa"})
    assert snap.firmware[0].heartbeat == "1"
    sim.set_unhealthy_components(root, 0, [])
    assert reader.read().firmware[0].unhealthy == frozenset()


def test_reload_keeps_the_firmware_registers(tmp_path: Path) -> None:
    root = _node(tmp_path, "trn2.3xlarge", "2.30.2.0")
    sim.set_unhealthy_components(root, 0, ["sram"])
    sim.bump_counter(root, 0, "mem_ecc_uncorrected")
    sim.reload_driver(root)
    snap = CounterReader(scan(root, env={}), firmware=True).read()
    assert snap.get(CounterKind.HARDWARE, 0, DEVICE_LEVEL, "mem_ecc_uncorrected") == 0
    assert snap.firmware[0].unhealthy == frozenset({"sram"})


@pytest.mark.parametrize("text", ["2.30.2.0", "2.30.2.0\n", "2.30.2-dkms"])
def test_versions_parse(text: str) -> None:
    assert driver_layout.parse_version(text)[:3] == (2, 30, 2)  # type: ignore[index]
    assert driver_layout.generation_for((2, 30, 1)) is driver_layout.GEN_2_28
    assert driver_layout.generation_for((2, 30, 2, 0)) is driver_layout.GEN_2_30_2
    assert driver_layout.parse_version("unknown") is None
