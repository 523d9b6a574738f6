"""The allocator, exhaustively: every instance type, every size, random holdings."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_sysfs.allocator import (
    Topology,
    choose_cores,
    choose_devices,
    exhaustive_devices,
    topology_for,
    topology_from,
)
from neuron_sysfs.instance_types import INSTANCE_TYPES, TopologyKind
from neuron_sysfs.inventory import scan


def topo_for(name: str, lnc: int | None = None) -> Topology:
    it = INSTANCE_TYPES[name]
    return topology_for(it, it.logical_cores_per_device(lnc or it.family.default_lnc))


TOPOLOGIES = {name: topo_for(name) for name in INSTANCE_TYPES} | {"trn2.48xlarge-lnc1": topo_for("trn2.48xlarge", 1)}


@pytest.mark.parametrize(
    ("name", "lnc"), [(name, lnc) for name, it in INSTANCE_TYPES.items() for lnc in it.family.supported_lnc]
)
def test_the_table_promises_what_a_healthy_node_reads(make_node, name: str, lnc: int) -> None:  # type: ignore[no-untyped-def]
    it = INSTANCE_TYPES[name]
    scanned = topology_from(scan(make_node(name, lnc), env={}))
    assert scanned == topology_for(it, it.logical_cores_per_device(lnc))
    assert scanned.cores_per_device * scanned.device_count == it.devices * it.physical_cores_per_device // lnc


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
        assert "no free group of 3 contiguous devices" in choice.reason
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
        assert "only 2 available" in choice.reason

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


def per_device(topo: Topology, ids: tuple[int, ...]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for c in ids:
        out.setdefault(topo.device_of(c), []).append(c)
    return out


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

    @settings(max_examples=400, deadline=None)
    @given(st.sampled_from(sorted(TOPOLOGIES)), st.data())
    def test_properties(self, name: str, data: st.DataObject) -> None:
        topo = TOPOLOGIES[name]
        total = topo.device_count * topo.cores_per_device
        available = data.draw(st.sets(st.integers(0, total - 1), min_size=1))
        must = data.draw(st.sets(st.sampled_from(sorted(available)), max_size=min(2, len(available))))
        size = data.draw(st.integers(max(1, len(must)), len(available)))
        choice = choose_cores(topo, available, must, size)
        assert len(choice.ids) == size
        assert set(must) <= set(choice.ids) <= available
        # fewest devices: no set of fewer devices can hold `size` free cores (with the must devices)
        free_counts: dict[int, int] = {}
        for c in available:
            free_counts[topo.device_of(c)] = free_counts.get(topo.device_of(c), 0) + 1
        forced = {topo.device_of(c) for c in must}
        capacity = sum(free_counts[d] for d in forced)
        minimum = len(forced)
        for count in sorted((v for d, v in free_counts.items() if d not in forced), reverse=True):
            if capacity >= size:
                break
            capacity += count
            minimum += 1
        assert len(per_device(topo, choice.ids)) == minimum
        # contiguous within a device whenever that device had such a run and no must forced a gap
        if not must:
            for device, cores in per_device(topo, choice.ids).items():
                locals_ = sorted(c - device * topo.cores_per_device for c in cores)
                free_locals = sorted(
                    c - device * topo.cores_per_device for c in available if topo.device_of(c) == device
                )
                has_run = any(
                    all(x + 1 == y for x, y in pairwise(free_locals[i : i + len(locals_)]))
                    for i in range(len(free_locals) - len(locals_) + 1)
                )
                if has_run:
                    assert all(x + 1 == y for x, y in pairwise(locals_)), (device, locals_, free_locals)


def test_every_size_on_every_instance_type() -> None:
    for name, topo in TOPOLOGIES.items():
        n = topo.device_count
        for size in range(1, n + 1):
            choice = choose_devices(topo, range(n), (), size)
            assert len(choice.ids) == size, name
            if topo.kind is TopologyKind.RING:
                assert choice.valid
        for size in range(1, n * topo.cores_per_device + 1):
            assert len(choose_cores(topo, range(n * topo.cores_per_device), (), size).ids) == size
