"""create -> discover -> compare with the table, for every instance type (and trn2 at LNC 1 and 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sim_nodes

from neuron_driver import layout
from neuron_driver.inventory import InstanceTypeSource, TopologySource, scan, topology_from
from neuron_driver.lnc import LncSource
from neuron_model.allocator import topology_for
from neuron_model.instance_types import INSTANCE_TYPES
from neuron_sim import node as sim

CASES = [(name, None) for name in INSTANCE_TYPES] + [
    (name, lnc) for name, it in INSTANCE_TYPES.items() if len(it.family.supported_lnc) > 1 for lnc in (1, 2)
]


@pytest.mark.parametrize(("name", "lnc"), CASES, ids=[f"{n}-lnc{lnc or 'default'}" for n, lnc in CASES])
def test_round_trip_agrees_with_table(name: str, lnc: int | None) -> None:
    it = INSTANCE_TYPES[name]
    inv = sim_nodes.inventory(name, lnc)  # sim.create, then scan(root, env={}), shared with other modules
    effective = lnc or it.family.default_lnc
    per_device = it.physical_cores_per_device // effective

    assert inv.issues == ()
    assert inv.instance_type == it
    assert inv.instance_type_source is InstanceTypeSource.DMI
    assert inv.lnc.value == effective
    assert inv.lnc.source is (LncSource.FILE if lnc else LncSource.DEFAULT)
    assert [d.index for d in inv.devices] == list(range(it.devices))
    assert all(d.physical_cores == it.physical_cores_per_device for d in inv.devices)
    assert inv.logical_cores_per_device == per_device
    assert [c.index for c in inv.cores] == list(range(it.devices * per_device))
    assert dict(inv.adjacency) == it.adjacency()
    assert inv.topology_source is (TopologySource.CONNECTED_DEVICES)
    assert all(d.dev_node_present for d in inv.devices)
    assert all((d.serial is not None) == it.family.has_serial_number for d in inv.devices)
    assert {d.numa_node for d in inv.devices} == set(range(it.numa_nodes))
    # what a component without sysfs (the scheduler extender) assumes is what the plugin reads here
    assert topology_from(inv) == topology_for(it, per_device)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["inf1.6xlarge", "trn1.32xlarge", "trn2.48xlarge", "trn3.48xlarge"])
def test_cli_json_agrees_with_table(tmp_path: Path, name: str) -> None:
    create = subprocess.run(
        [sys.executable, "-m", "neuron_sim.cli", "create", "--instance-type", name, "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert name in create.stdout
    out = subprocess.run(
        [sys.executable, "-m", "neuron_driver.inventory_cli", "--root", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout)
    it = INSTANCE_TYPES[name]
    per_device = it.physical_cores_per_device // it.family.default_lnc
    assert data["instance_type"] == name
    assert data["device_count"] == it.devices
    assert data["core_count"] == it.devices * per_device
    assert data["memory_bytes_per_device"] == it.memory_bytes_per_device
    assert {d["index"]: tuple(d["connected_devices"]) for d in data["devices"]} == it.adjacency()
    assert data["devices"][1]["logical_cores"] == list(range(per_device, 2 * per_device))


@pytest.mark.integration
def test_cli_text_table_and_exit_code_on_empty_root(tmp_path: Path) -> None:
    sim.create(tmp_path / "n", "inf2.24xlarge")
    out = subprocess.run(
        [sys.executable, "-m", "neuron_driver.inventory_cli", "--root", str(tmp_path / "n")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "inf2.24xlarge (dmi)" in out
    assert "neuron5" in out
    empty = subprocess.run(
        [sys.executable, "-m", "neuron_driver.inventory_cli", "--root", str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert empty.returncode == 1
    assert "is the driver loaded?" in empty.stdout


def test_a_trainium3_node_whose_driver_lists_trn2s_torus_is_still_a_switch(tmp_path: Path) -> None:
    """Today's driver lists trn2's torus neighbours in connected_devices on Trainium3 ("TODO PDS update",
    v3/neuron_dhal_v3.c): no mismatch issue, and every set of devices stays connected."""
    it = sim.create(tmp_path, "trn3.48xlarge")
    torus = INSTANCE_TYPES["trn2.48xlarge"].adjacency()
    for d, links in torus.items():
        device_dir = layout.HostLayout(tmp_path).devices_dir / f"neuron{d}"
        sim.write_attr(device_dir / "connected_devices", ", ".join(map(str, links)) + "\n")
    inv = scan(tmp_path, env={})
    assert inv.issues == ()
    assert dict(inv.adjacency) == torus
    topo = topology_from(inv)
    assert topo.connected(1 << 0 | 1 << 10)  # no torus link, yet connected through the switch
    assert it.devices == topo.device_count
