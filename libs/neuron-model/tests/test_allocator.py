"""The allocator, exhaustively: every instance type, every size, random holdings."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles.neuron_sets import (
    connected,
    contiguous_per_device,
    devices_of,
    exhaustive_devices,
    is_range,
    longest_run,
    per_device,
    pieces,
    ranges_on,
    topology,
    valid_core_sets,
)

from neuron_model import allocator
from neuron_model.allocator import (
    Choice,
    Topology,
    choose_cores,
    choose_devices,
    topology_for,
)
from neuron_model.instance_types import INSTANCE_TYPES, TopologyKind

# every instance type with its default logical-core setting, and "<type>-lnc<N>" for every other one
TOPOLOGIES = {name: topology(name) for name in INSTANCE_TYPES} | {
    f"{name}-lnc{lnc}": topology(name, lnc)
    for name, it in INSTANCE_TYPES.items()
    for lnc in it.family.supported_lnc
    if lnc != it.family.default_lnc
}


def test_equal_topologies_hash_alike_so_results_can_be_memoized() -> None:
    it = INSTANCE_TYPES["trn1.32xlarge"]
    read_from_a_node = Topology(it.topology, 16, dict(sorted(it.adjacency().items(), reverse=True)), 2, (4, 4))
    assert read_from_a_node == topology_for(it, 2)
    assert {topology_for(it, 2): "memo"}[read_from_a_node] == "memo"
    assert topology_for(it, 2) != topology_for(it, 1)


def draw_free_cores(topo: Topology, data: st.DataObject) -> tuple[set[int], int]:
    """Some free cores of `topo` (at least one) and a number of cores to ask for that they can hold."""
    total = topo.device_count * topo.cores_per_device
    free = data.draw(st.sets(st.integers(0, total - 1), min_size=1))
    return free, data.draw(st.integers(1, len(free)))


def is_ring_arc(ids: tuple[int, ...], n: int) -> bool:
    s = set(ids)
    return any(s == {(start + i) % n for i in range(len(ids))} for start in range(n))


class TestDevices:
    def test_ring_any_contiguous_arc_never_gaps(self) -> None:
        topo = TOPOLOGIES["inf2.48xlarge"]
        for size in range(1, 13):
            choice = choose_devices(topo, range(12), (), size)
            assert choice.valid
            assert is_ring_arc(choice.ids, 12)

    def test_ring_rejects_0_2_4(self) -> None:
        topo = TOPOLOGIES["inf1.24xlarge"]
        choice = choose_devices(topo, [0, 2, 4, 6], (), 3)
        assert not choice.valid
        assert choice.reason == "no connected set of 3 free devices (free: 0,2,4,6)"
        assert len(choice.ids) == 3

    def test_ring_wraps_around(self) -> None:
        topo = TOPOLOGIES["inf2.24xlarge"]
        choice = choose_devices(topo, [5, 0, 3], (), 2)
        assert choice.ids == (0, 5)
        assert choice.valid

    def test_ring_keeps_the_long_free_arc(self) -> None:
        topo = TOPOLOGIES["inf2.24xlarge"]  # 6 devices; 2 held: free arc 3,4,5,0 plus 1? no: held 1,2
        choice = choose_devices(topo, [0, 3, 4, 5], (), 1)
        # taking 0 or 3 or 5 leaves an arc of 3; taking 4 breaks it; lowest wins among the best
        assert choice.ids in {(0,), (3,)}
        assert choice.ids == (0,)

    @pytest.mark.parametrize("name", ["trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge", "trn2u.48xlarge"])
    def test_torus_sizes(self, name: str) -> None:
        topo = TOPOLOGIES[name]
        assert topo.group_sizes == (16, 8, 4, 1)
        for size in (1, 4, 8, 16):
            assert choose_devices(topo, range(16), (), size).valid
        for size in (2, 3, 5, 6, 7, 9, 12, 15):
            choice = choose_devices(topo, range(16), (), size)
            assert not choice.valid
            assert "valid sizes: 1, 4, 8, 16" in choice.reason
            assert len(choice.ids) == size

    def test_torus_four_is_a_row_and_keeps_whole_pairs_of_rows(self) -> None:
        topo = TOPOLOGIES["trn1.32xlarge"]
        # device 0 is held: row 0 is broken, so a 4-group should come from row 2 or 3 and
        # keep rows 2+3 ... no: rows 0+1 are already broken as an 8-group; take row 1.
        choice = choose_devices(topo, range(1, 16), (), 4)
        assert choice.ids == (4, 5, 6, 7)

    def test_must_include_is_honoured(self) -> None:
        topo = TOPOLOGIES["trn1.32xlarge"]
        choice = choose_devices(topo, range(16), [9], 4)
        assert choice.ids == (8, 9, 10, 11)
        choice = choose_devices(topo, range(16), [9], 8)
        assert choice.ids == tuple(range(8, 16))

    def test_single_device_instance(self) -> None:
        topo = TOPOLOGIES["trn1.2xlarge"]
        assert choose_devices(topo, [0], (), 1) == choose_devices(topo, [0], [0], 1)
        assert choose_devices(topo, [0], (), 1).ids == (0,)

    def test_more_than_available(self) -> None:
        choice = choose_devices(TOPOLOGIES["inf1.6xlarge"], [1, 2], (), 3)
        assert not choice.valid
        assert choice.reason == "3 devices requested, only 2 devices free (free: 1,2)"

    @settings(max_examples=300, deadline=None)
    @given(st.sampled_from(sorted(TOPOLOGIES)), st.data())
    def test_properties(self, name: str, data: st.DataObject) -> None:
        topo = TOPOLOGIES[name]
        n = topo.device_count
        available = data.draw(st.sets(st.integers(0, n - 1), min_size=1))
        must = data.draw(st.sets(st.sampled_from(sorted(available)), max_size=min(2, len(available))))
        size = data.draw(st.integers(max(1, len(must)), len(available)))
        choice = choose_devices(topo, available, must, size)
        assert len(choice.ids) == size
        assert set(must) <= set(choice.ids) <= available
        valid_options = [g for g in exhaustive_devices(topo, available, size) if set(must) <= set(g)]
        assert choice.valid == bool(valid_options)
        if choice.valid:
            assert choice.ids in valid_options
        if not must:  # the same answer without choosing
            assert allocator.device_refusal(topo, available, size) == ("" if choice.valid else choice.reason)


class TestCores:
    def test_two_cores_on_a_trn1_fill_one_device(self) -> None:
        topo = TOPOLOGIES["trn1.32xlarge"]
        assert choose_cores(topo, range(32), (), 2).ids == (0, 1)

    def test_best_fit_uses_the_partly_used_device(self) -> None:
        topo = TOPOLOGIES["trn1.32xlarge"]
        available = set(range(32)) - {10}  # core 10 (device 5) is held
        assert choose_cores(topo, available, (), 1).ids == (11,)

    def test_contiguous_within_device(self) -> None:
        topo = TOPOLOGIES["trn2.48xlarge-lnc1"]  # 8 cores a device
        available = set(range(128)) - {1, 5}  # device 0 has runs [0], [2,3,4], [6,7]
        choice = choose_cores(topo, available, (), 3)
        assert choice.ids == (2, 3, 4)
        choice = choose_cores(topo, available, (), 2)
        assert choice.ids == (6, 7)  # the smallest run that fits, leaving [2,3,4] whole

    def test_fewest_devices_for_large_requests(self) -> None:
        topo = TOPOLOGIES["trn2.48xlarge"]  # 4 logical cores a device
        choice = choose_cores(topo, range(64), (), 16)
        assert len(per_device(topo, choice.ids)) == 4
        assert sorted(per_device(topo, choice.ids)) == [0, 1, 2, 3]  # a torus row
        choice = choose_cores(topo, range(64), (), 6)
        assert len(per_device(topo, choice.ids)) == 2

    def test_must_include(self) -> None:
        topo = TOPOLOGIES["inf1.24xlarge"]
        choice = choose_cores(topo, range(64), [13], 2)
        assert choice.ids in {(12, 13), (13, 14)}

    def test_cores_across_devices_are_neighbours(self) -> None:
        topo = TOPOLOGIES["trn1.32xlarge"]
        available = set(range(32)) - {21}  # device 10 keeps one free core, 20
        choice = choose_cores(topo, available, (), 3)
        # the partly used device and its row neighbour, as one range; not device 10 and a far device
        assert choice == Choice((18, 19, 20), True)

    def test_one_global_range_when_the_free_cores_allow(self) -> None:
        topo = TOPOLOGIES["inf1.6xlarge"]  # a ring of 4 devices of 4 cores
        available = {2, 3, 6, 7, 8, 9, 10, 11, 12, 13}  # 3 devices at least for 8 cores
        assert choose_cores(topo, available, (), 8).ids == tuple(range(6, 14))

    def test_no_connected_set_is_invalid_with_a_best_effort(self) -> None:
        topo = TOPOLOGIES["inf2.24xlarge"]  # a ring of 6 devices of 2 cores
        choice = choose_cores(topo, {0, 1, 6, 7}, (), 3)  # devices 0 and 3: opposite sides of the ring
        assert not choice.valid
        assert choice.reason == "no connected set of 3 free cores (free: 0,1,6,7)"
        assert len(choice.ids) == 3
        assert len(devices_of(topo, choice.ids)) == 2

    def test_must_devices_that_cannot_be_joined_are_invalid(self) -> None:
        topo = TOPOLOGIES["inf2.24xlarge"]
        choice = choose_cores(topo, range(12), [0, 4], 2)  # devices 0 and 2: joining needs device 1 too
        assert not choice.valid
        assert choice.ids == (0, 4)
        assert "including 0,4" in choice.reason

    @settings(max_examples=150, deadline=None)
    @given(st.sampled_from(sorted(TOPOLOGIES)), st.data())
    def test_properties_on_every_shape(self, name: str, data: st.DataObject) -> None:
        topo = TOPOLOGIES[name]
        available, size = draw_free_cores(topo, data)
        choice = choose_cores(topo, available, (), size)
        assert len(choice.ids) == size
        assert set(choice.ids) <= available
        chosen = devices_of(topo, choice.ids)
        assert allocator.core_refusal(topo, available, size) == ("" if choice.valid else choice.reason)
        # valid exactly when one connected piece of the devices with free cores holds enough of them
        assert choice.valid == any(
            sum(1 for c in available if topo.device_of(c) in piece) >= size
            for piece in pieces(topo, devices_of(topo, available))
        )
        if choice.valid:
            assert connected(topo, chosen)
            for device, cores in per_device(topo, choice.ids).items():
                free_here = sorted(c for c in available if topo.device_of(c) == device)
                if longest_run(free_here) >= len(cores) and not ranges_on(topo, available, size, len(chosen)):
                    assert longest_run(cores) == len(cores), (device, cores, free_here)
        # one global range whenever a free one lies on a connected set of as few devices
        if ranges_on(topo, available, size, len(chosen)) and choice.valid:
            assert is_range(choice.ids), choice

    @settings(max_examples=150, deadline=None)
    @given(
        st.sampled_from(["inf1.6xlarge", "inf2.24xlarge", "trn1.32xlarge", "trn2.48xlarge", "trn2.48xlarge-lnc1"]),
        st.data(),
    )
    def test_against_exhaustive_search(self, name: str, data: st.DataObject) -> None:
        topo = TOPOLOGIES[name]
        total = topo.device_count * topo.cores_per_device
        # few free cores on the large shapes, so every subset can be tried
        available = data.draw(st.sets(st.integers(0, total - 1), min_size=1, max_size=11))
        must = data.draw(st.sets(st.sampled_from(sorted(available)), max_size=min(2, len(available))))
        size = data.draw(st.integers(max(1, len(must)), len(available)))
        choice = choose_cores(topo, available, must, size)
        assert len(choice.ids) == size
        assert set(must) <= set(choice.ids) <= available
        valid_sets = list(valid_core_sets(topo, available, must, size))
        assert choice.valid == bool(valid_sets)
        if not valid_sets:
            return
        fewest = min(len(devices_of(topo, cores)) for cores in valid_sets)
        best = [cores for cores in valid_sets if len(devices_of(topo, cores)) == fewest]
        assert connected(topo, devices_of(topo, choice.ids))
        assert len(devices_of(topo, choice.ids)) == fewest
        if any(is_range(cores) for cores in best):
            assert is_range(choice.ids)
        elif any(contiguous_per_device(topo, cores) for cores in best):
            assert contiguous_per_device(topo, choice.ids)


def test_every_size_on_every_instance_type() -> None:
    for name, topo in TOPOLOGIES.items():
        n = topo.device_count
        for size in range(1, n + 1):
            choice = choose_devices(topo, range(n), (), size)
            assert len(choice.ids) == size, name
            if topo.kind is TopologyKind.RING:
                assert choice.valid
        cpd = topo.cores_per_device
        for size in range(1, n * cpd + 1):
            choice = choose_cores(topo, range(n * cpd), (), size)
            # a free node: always one range on the fewest devices, which are connected
            assert choice.valid, (name, size)
            assert is_range(choice.ids), (name, size, choice.ids)
            assert len(devices_of(topo, choice.ids)) == -(-size // cpd), (name, size)
            assert connected(topo, devices_of(topo, choice.ids)), (name, size)


TRN3 = sorted(name for name, it in INSTANCE_TYPES.items() if it.topology is TopologyKind.SWITCH)
TRN3_TOPOLOGIES = sorted(name for name in TOPOLOGIES if name.split("-lnc")[0] in TRN3)


@cache
def switch_groups(name: str, size: int) -> frozenset[frozenset[int]]:
    """topo.groups(size) as a set, made once: a 16-device switch has up to 12,870 groups of a size,
    and building them again for each of 300 examples was most of the test's time."""
    return frozenset(TOPOLOGIES[name].groups(size))


# What the driver's connected_devices lists on Trainium3 today: trn2's torus neighbours ("TODO PDS
# update", aws-neuron-driver v3/neuron_dhal_v3.c fw_io_topology_v3), not the switch.
TORUS_LINKS = INSTANCE_TYPES["trn2.48xlarge"].adjacency()


class TestSwitch:
    """Trainium3's NeuronSwitch: every set of a node's devices is connected."""

    def test_there_are_trainium3_types(self) -> None:
        assert TRN3 == ["trn3.48xlarge", "trn3e.24xlarge", "trn3p.48xlarge"]  # trn3pd98.3xlarge: one device

    @settings(max_examples=300, deadline=None)
    @given(st.sampled_from(TRN3_TOPOLOGIES), st.data())
    def test_every_subset_is_a_valid_connected_group(self, name: str, data: st.DataObject) -> None:
        topo = TOPOLOGIES[name]
        subset = data.draw(st.sets(st.integers(0, topo.device_count - 1), min_size=1))
        mask = sum(1 << d for d in subset)
        assert topo.connected(mask)
        assert connected(topo, subset)
        assert len(subset) in topo.group_sizes
        assert frozenset(subset) in switch_groups(name, len(subset))

    @settings(max_examples=300, deadline=None)
    @given(st.sampled_from(TRN3_TOPOLOGIES), st.data())
    def test_k_devices_always_fit_when_k_are_free(self, name: str, data: st.DataObject) -> None:
        topo = TOPOLOGIES[name]
        free = data.draw(st.sets(st.integers(0, topo.device_count - 1), min_size=1))
        must = data.draw(st.sets(st.sampled_from(sorted(free)), max_size=len(free)))
        size = data.draw(st.integers(max(1, len(must)), len(free)))
        choice = choose_devices(topo, free, must, size)
        assert choice.valid, choice.reason
        assert len(choice.ids) == size
        assert set(must) <= set(choice.ids) <= free
        # all free devices are alike: the must devices, then the lowest
        rest = sorted(free - must)[: size - len(must)]
        assert choice.ids == tuple(sorted(must | set(rest)))
        assert allocator.device_refusal(topo, free, size) == ""

    @settings(max_examples=200, deadline=None)
    @given(st.sampled_from(TRN3_TOPOLOGIES), st.data())
    def test_k_cores_always_fit_when_k_are_free(self, name: str, data: st.DataObject) -> None:
        topo = TOPOLOGIES[name]
        free, size = draw_free_cores(topo, data)
        choice = choose_cores(topo, free, (), size)
        assert choice.valid, choice.reason
        assert len(choice.ids) == size
        assert set(choice.ids) <= free
        assert allocator.core_refusal(topo, free, size) == ""

    def test_the_listed_links_do_not_matter_on_a_switch(self) -> None:
        it = INSTANCE_TYPES["trn3.48xlarge"]
        as_the_driver_lists_them = Topology(it.topology, it.devices, TORUS_LINKS, 4)
        # devices 0 and 10 share no torus row, column or link: on the switch they are a group
        assert as_the_driver_lists_them.connected(1 << 0 | 1 << 10)
        assert choose_devices(as_the_driver_lists_them, [0, 10], (), 2) == Choice((0, 10), True)
        assert choose_cores(as_the_driver_lists_them, [0, 1, 40, 41], (), 4).valid

    def test_refusals_say_how_many_are_free(self) -> None:
        topo = TOPOLOGIES["trn3.48xlarge"]
        choice = choose_devices(topo, [1, 2], (), 3)
        assert not choice.valid
        assert choice.reason == "3 devices requested, only 2 devices free (free: 1,2)"
        assert allocator.device_refusal(topo, [1, 2], 3) == choice.reason

    def test_leftover_counts_the_groups_the_free_devices_make(self) -> None:
        topo = TOPOLOGIES["trn3e.24xlarge"]  # 4 devices, 4 logical cores each at LNC=2
        score = allocator.leftover_score(topo, range(4, 16))  # device 0 taken
        assert score.groups == ((3, 1), (2, 3), (1, 3))
        assert score.reach == 12
