"""The PCI functions the simulator writes: what node-feature-discovery reads, Neuron and not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sim_nodes

from neuron_driver import layout
from neuron_driver.inventory import scan
from neuron_model import pci
from neuron_model.instance_types import FAMILIES, INSTANCE_TYPES
from neuron_sim import node as sim

# What node-feature-discovery's pci source needs of a function, or it skips it (source/pci/utils.go).
NFD_MANDATORY = ("class", "vendor", "device", "subsystem_vendor", "subsystem_device")


def read_functions(root: Path) -> dict[str, dict[str, int]]:
    """address -> attribute -> value, parsed as NFD does (hex, 0x prefix)."""
    pci_dir = layout.HostLayout(root).pci_devices_dir
    return {
        d.name: {name: int((d / name).read_text().strip(), 16) for name in NFD_MANDATORY}
        for d in sorted(pci_dir.iterdir())
    }


def test_the_neuron_ids_are_every_familys_ids_and_nothing_else() -> None:
    ids = pci.neuron_device_ids()
    assert ids == (0x7064, 0x7065, 0x7066, 0x7067, 0x7164, 0x7264, 0x7364, 0x7564, 0x7565)
    assert set(ids) == {i for f in FAMILIES.values() for i in f.pci_device_ids}


def test_a_neuron_function_needs_the_vendor_and_a_neuron_device_id() -> None:
    assert pci.is_neuron_function(0x1D0F, 0x7164)
    assert not pci.is_neuron_function(0x1D0F, 0xEC20), "the ENA NIC is Amazon's but not Neuron"
    assert not pci.is_neuron_function(0x8086, 0x7164)


@pytest.mark.parametrize("name", sorted(INSTANCE_TYPES))
def test_each_type_shows_its_neuron_functions_as_nfd_reads_them(name: str) -> None:
    it = INSTANCE_TYPES[name]
    functions = read_functions(sim_nodes.node_root(name))  # sim.create(root, name), shared with other modules
    neuron = {a: f for a, f in functions.items() if pci.is_neuron_function(f["vendor"], f["device"])}
    assert len(neuron) == it.devices
    for attributes in neuron.values():
        assert attributes["device"] == it.pci_device_id
        assert attributes["class"] == pci.NEURON_PCI_CLASS
        assert attributes["subsystem_vendor"] == pci.NEURON_PCI_VENDOR
    # Amazon's other functions are there too, as on a real instance
    others = {a: f for a, f in functions.items() if a not in neuron}
    assert {f["device"] for f in others.values() if f["vendor"] == pci.NEURON_PCI_VENDOR} == {0x1111, 0x8061, 0xEC20}


def test_sysfs_formats_are_the_kernels(tmp_path: Path) -> None:
    sim.create(tmp_path, "trn1.32xlarge")
    (first, *_) = pci.neuron_functions(INSTANCE_TYPES["trn1.32xlarge"])
    d = layout.HostLayout(tmp_path).pci_devices_dir / first.address
    assert (d / "vendor").read_text() == "0x1d0f\n"
    assert (d / "device").read_text() == "0x7164\n"
    assert (d / "class").read_text() == "0x088000\n"
    assert (d / "numa_node").read_text() == "0\n"


def test_the_inventory_maps_numa_nodes_past_amazons_other_functions(tmp_path: Path) -> None:
    """The NIC and NVMe controller share the vendor id; counting them would misalign every device."""
    sim.create(tmp_path, "inf2.48xlarge")
    inv = scan(tmp_path, env={})
    assert [d.numa_node for d in inv.devices] == [0] * 6 + [1] * 6


def test_a_non_neuron_node_has_amazon_functions_but_no_neuron_device(tmp_path: Path) -> None:
    sim.create_non_neuron(tmp_path)
    functions = read_functions(tmp_path)
    assert any(f["vendor"] == pci.NEURON_PCI_VENDOR for f in functions.values())
    assert not [f for f in functions.values() if pci.is_neuron_function(f["vendor"], f["device"])]
    assert scan(tmp_path, env={}).devices == ()
    assert not layout.HostLayout(tmp_path).devices_dir.exists()
    assert layout.HostLayout(tmp_path).dmi_product_name.read_text() == "m5.xlarge\n"
    with pytest.raises(sim.SimError, match="--force"):
        sim.create(tmp_path, "trn1.2xlarge")


@pytest.mark.integration
def test_cli_creates_a_non_neuron_node_over_a_neuron_one(tmp_path: Path) -> None:
    sim.create(tmp_path, "trn1.2xlarge")
    result = subprocess.run(
        [sys.executable, "-m", "neuron_sim.cli", "create-non-neuron", "--root", str(tmp_path),
         "--instance-type", "c7i.large", "--force"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / sim.STATE_DIR / "state.json").read_text()) == {
        "instance_type": "c7i.large",
        "neuron": False,
    }
    assert not layout.HostLayout(tmp_path).devices_dir.exists(), "the Neuron node it replaced is gone"
    assert not [f for f in read_functions(tmp_path).values() if pci.is_neuron_function(f["vendor"], f["device"])]
