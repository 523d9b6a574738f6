from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from neuron_driver import driver_layout, inventory_cli, layout
from neuron_driver.inventory import scan
from neuron_driver.kmsg import parse_hw_error, parse_record
from neuron_sim import cli
from neuron_sim import node as sim


def run_sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "neuron_sim.cli", *args], capture_output=True, text=True, check=False)


def test_driver_formats(tmp_path: Path) -> None:
    sim.create(tmp_path, "trn1.32xlarge")
    d = layout.HostLayout(tmp_path).device_dir(0)
    assert (d / "core_count").read_bytes() == b"2"
    assert (d / "connected_devices").read_text() == "1, 3, 4, 12\n"
    assert (layout.HostLayout(tmp_path).class_dir / "neuron0").resolve() == d.resolve()
    assert (d / "info/architecture/device_name").read_text() == "Trainium1\n"
    assert (d / "stats/power/utilization").read_text().startswith("0,")


def test_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    sim.create(tmp_path, "inf2.xlarge")
    with pytest.raises(sim.SimError, match="--force"):
        sim.create(tmp_path, "trn1.2xlarge")
    sim.create(tmp_path, "trn1.2xlarge", force=True)
    assert scan(tmp_path, env={}).instance_type_name == "trn1.2xlarge"


def test_kmsg_records_have_increasing_sequence(tmp_path: Path) -> None:
    sim.create(tmp_path, "trn1.32xlarge")
    sim.inject_hw_error(tmp_path, "NC_UNCORRECTABLE_ERROR", 5, 1)
    sim.append_kmsg(tmp_path, "neuron: DMA completion timeout on nd05 queue 3")
    lines = layout.HostLayout(tmp_path).kmsg.read_text().splitlines()
    records = [parse_record(line) for line in lines]
    assert [r.seq for r in records] == list(range(len(records)))
    err = parse_hw_error(records[-2].message)
    assert err is not None
    assert (err.kind, err.device, err.core, err.serial) == (
        "NC_UNCORRECTABLE_ERROR",
        5,
        1,
        sim.serial_for("trn1.32xlarge", 5),
    )
    assert records[-2].priority == 3


def test_vanish_and_restore(tmp_path: Path) -> None:
    sim.create(tmp_path, "inf2.24xlarge")
    sim.vanish(tmp_path, 2)
    assert not layout.HostLayout(tmp_path).dev_node(2).exists()
    assert [d.index for d in scan(tmp_path, env={}).devices] == [0, 1, 3, 4, 5]
    sim.restore(tmp_path, 2)
    assert len(scan(tmp_path, env={}).devices) == 6
    with pytest.raises(sim.SimError, match="has not vanished"):
        sim.restore(tmp_path, 2)


def test_reboot_changes_boot_id_and_clears_log(tmp_path: Path) -> None:
    sim.create(tmp_path, "trn1.2xlarge")
    before = (tmp_path / layout.BOOT_ID_FILE).read_text()
    new = sim.reboot(tmp_path)
    assert new + "\n" != before
    assert layout.HostLayout(tmp_path).kmsg.read_text() == ""


@pytest.mark.integration
def test_cli_inject_and_errors(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert run_sim("create", "--instance-type", "trn2.48xlarge", "--root", root, "--lnc", "1").returncode == 0
    out = run_sim(
        "inject", "--root", root, "counter", "--device", "1", "--core", "7", "--name", "hw_error", "--by", "5"
    )
    assert out.stdout.strip() == "5"
    assert run_sim("inject", "--root", root, "hw-error", "--kind", "DMA_ERROR", "--device", "2").returncode == 0
    assert (
        run_sim(
            "inject", "--root", root, "memory", "--device", "1", "--category", "tensors", "--bytes", "10"
        ).returncode
        == 0
    )
    assert (
        run_sim("inject", "--root", root, "power", "--device", "1", "--min", "1", "--max", "2", "--avg", "3").returncode
        == 0
    )
    assert run_sim("inject", "--root", root, "vanish", "--device", "3").returncode == 0
    assert run_sim("inject", "--root", root, "restore", "--device", "3").returncode == 0
    assert run_sim("inject", "--root", root, "kmsg", "--raw", "--message", "garbage\n").returncode == 0

    bad = run_sim("inject", "--root", root, "counter", "--device", "99", "--name", "hw_error")
    assert bad.returncode == 2
    assert "device 99 does not exist" in bad.stderr
    bad = run_sim("inject", "--root", root, "counter", "--device", "0", "--core", "0", "--name", "nope")
    assert "has no counter 'nope'" in bad.stderr
    bad = run_sim("create", "--instance-type", "trn1.32xlarge", "--root", str(tmp_path / "x"), "--lnc", "2")
    assert bad.returncode == 2
    assert "--lnc 2 is not supported on trn1.32xlarge" in bad.stderr
    bad = run_sim("inject", "--root", str(tmp_path / "empty"), "reboot")
    assert "holds no simulated node" in bad.stderr
    bad = run_sim("create", "--instance-type", "p5.48xlarge", "--root", root)
    assert bad.returncode == 2
    assert "invalid choice" in bad.stderr


def test_the_driver_version_is_told_only_when_given(tmp_path: Path) -> None:
    sim.create(tmp_path / "plain", "trn1.2xlarge")
    assert not layout.HostLayout(tmp_path / "plain").driver_version.exists()
    sim.create(tmp_path / "versioned", "trn1.2xlarge", driver_version="2.25.4.0")
    assert layout.HostLayout(tmp_path / "versioned").driver_version.read_text() == "2.25.4.0\n"


def test_the_agents_matrix_is_every_generation_the_simulator_writes(tmp_path: Path) -> None:
    """GENERATION_VERSIONS, which the node agents' tests run on, holds one version of each generation
    in driver_layout.SIMULATED: a generation added there is added to every agent's matrix."""
    assert list(sim.GENERATION_VERSIONS) == [g.name for g in driver_layout.SIMULATED]
    for name, version in sim.GENERATION_VERSIONS.items():
        root = tmp_path / name
        sim.create(root, "trn2.3xlarge", driver_version=version)
        report = driver_layout.check_layout(root, scan(root, env={}))
        assert (report.generation.name, report.ok) == (name, True), report.lines()


def test_the_cli_writes_a_generations_tree_and_moves_a_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`neuron-sim create --driver-version` and `neuron-sim inject move-node`, as docs/driver-versions.md
    gives them; `neuron-inventory --check` passes on the one tree and fails on the other, naming what moved."""
    root = str(tmp_path)
    assert cli.main(["create", "--instance-type", "trn2.3xlarge", "--root", root, "--driver-version", "2.30.2.0"]) == 0
    health = layout.health_status_dir(layout.HostLayout(tmp_path).device_dir(0))
    assert (health / layout.UNHEALTHY_COMPONENTS_FILE).is_file()
    assert inventory_cli.main(["--root", root, "--check"]) == 0
    capsys.readouterr()
    assert cli.main(["inject", "--root", root, "move-node", "--device", "0", "--path", "stats/hardware",
                     "--to", "stats/hardware_v2"]) == 0  # fmt: skip
    assert inventory_cli.main(["--root", root, "--check"]) == 1
    assert "neuron0: stats/hardware/mem_ecc_corrected not found (directory stats/hardware gone" in (
        capsys.readouterr().out
    )
    assert cli.main(["create", "--instance-type", "trn2.3xlarge", "--root", str(tmp_path / "new"),
                     "--driver-version", "2.31.7.0"]) == 2  # fmt: skip
    assert "moved sysfs nodes to paths no source here names" in capsys.readouterr().err


def test_some_nodes_of_an_ultraserver_are_those_nodes_of_the_whole_one(tmp_path: Path) -> None:
    """create_ultraserver(node_ids=...) writes those nodes' UltraServer attributes exactly as the whole
    UltraServer's, and refuses a node id the UltraServer has not."""
    whole = sim.create_ultraserver(tmp_path / "whole", "trn2u.48xlarge", nodes=2, server_id="00c0ffee12345678")
    (some,) = sim.create_ultraserver(tmp_path / "some", "trn2u.48xlarge", 2, "00c0ffee12345678", node_ids=[1])
    assert some.name == whole[1].name == "node-1"
    assert not (tmp_path / "some" / "node-0").exists()

    def attributes(root: Path) -> dict[str, str]:
        return {p.name: p.read_text() for p in layout.HostLayout(root).class_dir.iterdir() if p.is_file()}

    assert attributes(some) == attributes(whole[1])
    assert scan(some).ultraserver == scan(whole[1]).ultraserver
    with pytest.raises(sim.SimError, match="not all among the 2 nodes"):
        sim.create_ultraserver(tmp_path / "bad", "trn2u.48xlarge", nodes=2, node_ids=[2])
