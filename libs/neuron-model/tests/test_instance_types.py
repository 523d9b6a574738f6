from __future__ import annotations

import pytest

from neuron_model.instance_types import (
    INSTANCE_TYPES,
    TopologyKind,
    UnknownInstanceTypeError,
    get_instance_type,
    guess_instance_type,
)

EXPECTED = {
    # name: (devices, physical cores per device, GiB per device, topology, pci id)
    "inf1.xlarge": (1, 4, 8, TopologyKind.SINGLE, 0x7064),
    "inf1.2xlarge": (1, 4, 8, TopologyKind.SINGLE, 0x7064),
    "inf1.6xlarge": (4, 4, 8, TopologyKind.RING, 0x7064),
    "inf1.24xlarge": (16, 4, 8, TopologyKind.RING, 0x7064),
    "inf2.xlarge": (1, 2, 32, TopologyKind.SINGLE, 0x7264),
    "inf2.8xlarge": (1, 2, 32, TopologyKind.SINGLE, 0x7264),
    "inf2.24xlarge": (6, 2, 32, TopologyKind.RING, 0x7264),
    "inf2.48xlarge": (12, 2, 32, TopologyKind.RING, 0x7264),
    "trn1.2xlarge": (1, 2, 32, TopologyKind.SINGLE, 0x7164),
    "trn1.32xlarge": (16, 2, 32, TopologyKind.TORUS_2D, 0x7164),
    "trn1n.32xlarge": (16, 2, 32, TopologyKind.TORUS_2D, 0x7164),
    "trn2.3xlarge": (1, 8, 96, TopologyKind.SINGLE, 0x7364),
    "trn2.48xlarge": (16, 8, 96, TopologyKind.TORUS_2D, 0x7364),
    "trn2u.48xlarge": (16, 8, 96, TopologyKind.TORUS_2D, 0x7364),
    # device counts unconfirmed (instance_types.TRN3_UNCONFIRMED); cores, HBM, switch and PCI id confirmed
    "trn3.48xlarge": (16, 8, 144, TopologyKind.SWITCH, 0x7564),
    "trn3e.24xlarge": (4, 8, 144, TopologyKind.SWITCH, 0x7564),
    "trn3p.48xlarge": (16, 8, 144, TopologyKind.SWITCH, 0x7564),
    "trn3pd98.3xlarge": (1, 8, 144, TopologyKind.SINGLE, 0x7564),
}


def test_table_lists_exactly_the_supported_types() -> None:
    assert set(INSTANCE_TYPES) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_table_facts(name: str) -> None:
    it = get_instance_type(name)
    devices, cores, gib, topo, pci = EXPECTED[name]
    assert (it.devices, it.physical_cores_per_device, it.memory_bytes_per_device // 2**30) == (devices, cores, gib)
    assert (it.topology, it.pci_device_id) == (topo, pci)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_adjacency_is_symmetric_with_the_right_degree(name: str) -> None:
    it = get_instance_type(name)
    adj = it.adjacency()
    assert set(adj) == set(range(it.devices))
    for a, neighbours in adj.items():
        assert a not in neighbours
        for b in neighbours:
            assert a in adj[b]
    kinds = {
        TopologyKind.SINGLE: 0,
        TopologyKind.RING: 2,
        TopologyKind.TORUS_2D: 4,
        TopologyKind.SWITCH: it.devices - 1,
    }
    assert all(len(n) == kinds[it.topology] for n in adj.values())


def test_trainium3_is_a_switch_of_eight_core_devices_with_its_driver_names() -> None:
    for name in ("trn3.48xlarge", "trn3e.24xlarge"):
        it = get_instance_type(name)
        assert it.topology is TopologyKind.SWITCH
        assert it.torus_shape is None
        assert it.adjacency() == {d: tuple(x for x in range(it.devices) if x != d) for d in range(it.devices)}
        fam = it.family
        assert (fam.arch_type, fam.sysfs_instance_type, fam.device_name, fam.core_arch) == (
            "NDv4", "Trn3", "Trainium3", "NCv4")  # fmt: skip
        assert fam.pci_device_ids == (0x7564, 0x7565)
    assert get_instance_type("trn3.48xlarge").ultraserver
    assert not get_instance_type("trn3e.24xlarge").ultraserver


def test_a_trainium3_node_without_a_product_name_is_told_by_its_device_count() -> None:
    assert guess_instance_type("Trn3", 16) == get_instance_type("trn3.48xlarge")
    assert guess_instance_type("Trn3", 4) == get_instance_type("trn3e.24xlarge")
    assert guess_instance_type("Trn3", 1) == get_instance_type("trn3pd98.3xlarge")  # the driver's 3xlarge types


def test_the_drivers_trainium3_names_are_the_truth_and_the_charts_map_onto_them() -> None:
    from neuron_model.instance_types import ALIASES, ALL_NAMES, TRN3_DRIVER_TYPES, TRN3_UNCONFIRMED

    # shared/reference/fleet-and-scale.md, "Today's Neuron driver": the HAL's list, every one known
    driver = {
        "trn3e.24xlarge", "trn3.48xlarge", "trn3s-es.48xlarge", "trn3sn.48xlarge", "trn3sn-es.48xlarge",
        "trn3p.48xlarge", "trn3pd98.3xlarge", "trn3s-es.3xlarge", "trn3sn.3xlarge", "trn3sn-es.3xlarge",
    }  # fmt: skip
    assert set(TRN3_DRIVER_TYPES) == driver
    for name in driver:
        it = get_instance_type(name)
        assert it.family.name == "trn3"
        assert it.name == TRN3_DRIVER_TYPES[name]
    assert get_instance_type("trn3sn-es.48xlarge") == get_instance_type("trn3.48xlarge")  # one PDS platform
    assert get_instance_type("trn3sn.3xlarge").devices == TRN3_UNCONFIRMED.trn3_3xlarge_devices
    assert get_instance_type("trn3p.48xlarge").devices == TRN3_UNCONFIRMED.trn3p_48xlarge_devices
    # AWS's chart 1.10 names: trn3s-es.48xlarge is the driver's; the other two map, unconfirmed
    assert get_instance_type("trn3s-es.48xlarge").name == "trn3.48xlarge"
    assert dict(TRN3_UNCONFIRMED.chart_names) == {
        "trn3n.48xlarge": "trn3.48xlarge",
        "trn3en.24xlarge": "trn3e.24xlarge",
    }
    assert get_instance_type("trn3n.48xlarge") == get_instance_type("trn3.48xlarge")
    assert get_instance_type("trn3en.24xlarge") == get_instance_type("trn3e.24xlarge")
    assert set(ALL_NAMES) == set(INSTANCE_TYPES) | set(ALIASES)
    assert not set(ALIASES) & set(INSTANCE_TYPES)
    with pytest.raises(UnknownInstanceTypeError):
        get_instance_type("trn3x.48xlarge")


def test_trainium3_unconfirmed_facts_live_in_one_place() -> None:
    from neuron_model.instance_types import TRN3_UNCONFIRMED

    assert get_instance_type("trn3.48xlarge").devices == TRN3_UNCONFIRMED.trn3_48xlarge_devices
    assert get_instance_type("trn3e.24xlarge").devices == TRN3_UNCONFIRMED.trn3e_24xlarge_devices
    fam = get_instance_type("trn3.48xlarge").family
    assert (fam.supported_lnc, fam.default_lnc) == (TRN3_UNCONFIRMED.supported_lnc, TRN3_UNCONFIRMED.default_lnc)


def test_ring_links_consecutive_devices() -> None:
    adj = get_instance_type("inf2.24xlarge").adjacency()
    assert adj[0] == (1, 5)
    assert adj[3] == (2, 4)


def test_torus_links_rows_and_columns() -> None:
    adj = get_instance_type("trn1.32xlarge").adjacency()
    assert adj[0] == (1, 3, 4, 12)
    assert adj[5] == (1, 4, 6, 9)


def test_trn2_defaults_to_two_physical_cores_per_logical_core() -> None:
    it = get_instance_type("trn2.48xlarge")
    assert it.family.default_lnc == 2
    assert it.logical_cores_per_device(2) == 4
    assert it.logical_cores_per_device(1) == 8


def test_unknown_type_names_the_known_ones() -> None:
    with pytest.raises(UnknownInstanceTypeError, match=r"unknown Neuron instance type 'p4d.24xlarge'.*trn1.32xlarge"):
        get_instance_type("p4d.24xlarge")


def test_guess_from_family_and_count() -> None:
    guess = guess_instance_type("Trn1", 16)
    assert guess is not None
    assert guess.name == "trn1.32xlarge"
    assert guess_instance_type("Trn1", 7) is None
