"""Placing a whole pod on a node's free silicon, as the kubelet and the plugin would."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles.neuron_sets import connected, exhaustive_fits, topology

from neuron_model.allocator import Leftover, Topology, choose_cores, choose_devices
from neuron_model.instance_types import INSTANCE_TYPES
from neuron_model.placement import ContainerPlacement, ContainerRequest, FreeState, PodRequest, place, refusal


def all_free(t: Topology) -> FreeState:
    return FreeState.of(t, range(t.device_count * t.cores_per_device))


def pod(*containers: ContainerRequest, init: Iterable[ContainerRequest] = ()) -> PodRequest:
    return PodRequest(tuple(init), containers)


TRN1 = topology("trn1.32xlarge")
# one device unhealthy in each torus row: 12 free, no free row of 4
ONE_BAD_PER_ROW = FreeState.from_holdings(TRN1, set(range(16)) - {0, 4, 8, 12}, (), ())


class TestRefusals:
    def test_no_aligned_group_left_on_the_torus(self) -> None:
        for size in (8, 4):
            result = place(TRN1, ONE_BAD_PER_ROW, pod(ContainerRequest(devices=size)))
            assert not result.fits
            assert result.reason == f"no connected set of {size} free devices (free: 1,2,3,5,6,7,9,10,11,13,14,15)"
            assert result.containers == ()
            assert result.free_after == ONE_BAD_PER_ROW  # a refusal holds nothing
        assert place(TRN1, ONE_BAD_PER_ROW, pod(ContainerRequest(devices=1))).fits

    def test_cores_on_devices_far_apart(self) -> None:
        t = topology("inf2.24xlarge")  # a ring of 6 devices, 2 cores each
        free = FreeState.of(t, {0, 1, 6, 7})  # devices 0 and 3: opposite sides
        result = place(t, free, pod(ContainerRequest(cores=3)))
        assert result.reason == "no connected set of 3 free cores (free: 0,1,6,7)"
        assert place(t, free, pod(ContainerRequest(cores=2))).fits

    def test_counts_are_checked_for_the_whole_pod(self) -> None:
        free = FreeState.of(TRN1, range(6))  # devices 0-2
        result = place(TRN1, free, pod(ContainerRequest(devices=2), ContainerRequest(devices=2)))
        assert result.reason == "4 devices requested, only 3 devices free (free: 0,1,2)"
        result = place(TRN1, free, pod(ContainerRequest(devices=2), ContainerRequest(cores=3)))
        assert result.reason == "2 devices and 3 cores requested, only 6 cores free (free: 0-5)"

    def test_the_refused_container_is_named_when_there_are_several(self) -> None:
        t = topology("inf2.24xlarge")
        free = FreeState.of(t, {0, 1, 6, 7})  # devices 0 and 3: opposite sides
        result = place(t, free, pod(ContainerRequest(cores=1, name="side"), ContainerRequest(cores=3, name="main")))
        assert result.reason == 'container "main": no connected set of 3 free cores (free: 1,6,7)'
        result = place(t, free, pod(ContainerRequest(cores=1), ContainerRequest(cores=3)))
        assert result.reason.startswith("container 2: ")


class TestPlacement:
    def test_containers_get_what_the_plugin_would_choose_in_turn(self) -> None:
        t = topology("trn2.48xlarge")  # 4 logical cores a device
        free = all_free(t)
        result = place(t, free, pod(ContainerRequest(devices=4), ContainerRequest(cores=6)))
        first = choose_devices(t, free.devices, (), 4)
        after = free.without_devices(t, first.ids)
        second = choose_cores(t, after.cores, (), 6)
        assert result.containers == (ContainerPlacement(first.ids, ()), ContainerPlacement((), second.ids))
        assert result.free_after == after.without_cores(t, second.ids)
        assert result.fits

    def test_app_containers_reuse_what_init_containers_held(self) -> None:
        result = place(TRN1, all_free(TRN1), pod(ContainerRequest(devices=4), init=[ContainerRequest(devices=4)]))
        init, app = result.containers
        assert init.devices == app.devices
        assert len(result.free_after.devices) == 12

    def test_more_than_the_init_container_held_includes_all_of_it(self) -> None:
        t = topology("inf1.24xlarge")  # a ring of 16 devices, 4 cores each
        result = place(t, all_free(t), pod(ContainerRequest(cores=6), init=[ContainerRequest(cores=2)]))
        init, app = result.containers
        assert set(init.cores) <= set(app.cores)
        assert len(result.free_after.cores) == 64 - 6

    def test_a_sidecar_keeps_its_cores(self) -> None:
        t = topology("inf1.24xlarge")
        sidecar = ContainerRequest(cores=2, restartable=True)
        result = place(t, all_free(t), pod(ContainerRequest(cores=2), init=[sidecar]))
        side, app = result.containers
        assert not set(side.cores) & set(app.cores)
        assert len(result.free_after.cores) == 64 - 4


@pytest.mark.parametrize(
    ("init", "app", "effective"),
    [
        ((), ((1, 2), (3, 0)), (4, 2)),  # app containers add up
        (((8, 0), (2, 6)), ((1, 2), (3, 0)), (8, 6)),  # the largest init container wins where larger
        (((1, 1),), ((4, 4),), (4, 4)),
        ((("sidecar", 1, 2), (4, 0)), ((2, 1),), (5, 3)),  # a sidecar counts beside everything after it
    ],
)
def test_the_effective_request_is_counted_as_the_scheduler_does(
    init: tuple[tuple[object, ...], ...], app: tuple[tuple[int, int], ...], effective: tuple[int, int]
) -> None:
    def request(spec: tuple[object, ...]) -> ContainerRequest:
        restartable = spec[0] == "sidecar"
        devices, cores = spec[1:] if restartable else spec
        return ContainerRequest(int(str(devices)), int(str(cores)), restartable=restartable)

    requested = PodRequest(tuple(request(s) for s in init), tuple(ContainerRequest(d, c) for d, c in app))
    assert (requested.effective.devices, requested.effective.cores) == effective


class TestFreeState:
    def test_a_device_is_free_only_with_all_its_cores(self) -> None:
        free = FreeState.of(TRN1, set(range(32)) - {5})
        assert 2 not in free.devices
        assert 4 in free.cores
        assert len(free.devices) == 15

    def test_from_holdings(self) -> None:
        free = FreeState.from_holdings(TRN1, set(range(16)) - {15}, held_devices={3}, held_cores={0})
        assert free.devices == frozenset(set(range(15)) - {0, 3})
        assert free.cores == frozenset(set(range(30)) - {0, 6, 7})

    def test_taking_silicon_through_either_resource(self) -> None:
        free = all_free(TRN1)
        assert free.without_devices(TRN1, [2]) == FreeState.of(TRN1, set(range(32)) - {4, 5})
        assert free.without_cores(TRN1, [4]) == FreeState.of(TRN1, set(range(32)) - {4})


class TestLeftover:
    def test_keeping_the_largest_group_ranks_first(self) -> None:
        whole = all_free(TRN1).leftover(TRN1)
        assert whole.groups == ((16, 1), (8, 2), (4, 4), (1, 16))
        row_taken = FreeState.of(TRN1, range(8, 32)).leftover(TRN1)  # row 0 held
        scattered = ONE_BAD_PER_ROW.leftover(TRN1)
        assert whole > row_taken > scattered
        assert scattered == Leftover(((1, 12),), 24, ())

    def test_fragments_break_ties_best_fit_first(self) -> None:
        t = topology("inf1.6xlarge")
        three_left = FreeState.of(t, {1, 2, 3}).leftover(t)  # one device, 3 free cores in a run
        split = FreeState.of(t, {0, 2, 3}).leftover(t)
        assert three_left == Leftover((), 3, (3,))
        assert three_left > split

    def test_the_largest_core_request_that_still_fits(self) -> None:
        t = topology("inf2.24xlarge")  # a ring of 6 devices, 2 cores each
        apart = FreeState.of(t, {1, 7}).leftover(t)  # devices 0 and 3
        together = FreeState.of(t, {1, 3}).leftover(t)  # devices 0 and 1, neighbours
        assert (apart.reach, together.reach) == (1, 2)
        assert together > apart

    def test_comparable_between_shapes(self) -> None:
        ring = topology("inf2.48xlarge")
        assert all_free(TRN1).leftover(TRN1) > all_free(ring).leftover(ring)  # a free 16 beats a free 12


# -- against an exhaustive search -------------------------------------------------------------------

SMALL = {
    "inf1.6xlarge": topology("inf1.6xlarge"),
    "inf2.24xlarge": topology("inf2.24xlarge"),
    "trn1.32xlarge": TRN1,
    "trn2.48xlarge-lnc1": topology("trn2.48xlarge", 1),
}


one_kind = st.one_of(
    st.builds(ContainerRequest, devices=st.integers(1, 3)), st.builds(ContainerRequest, cores=st.integers(1, 6))
)
any_kind = st.builds(ContainerRequest, st.integers(0, 2), st.integers(0, 3))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(SMALL)), st.data())
def test_one_container_fits_exactly_when_an_exhaustive_search_finds_a_valid_set(name: str, data: st.DataObject) -> None:
    t = SMALL[name]
    free_cores = data.draw(st.sets(st.integers(0, t.device_count * t.cores_per_device - 1), max_size=12))
    requested = PodRequest((), (data.draw(one_kind),))
    result = place(t, FreeState.of(t, free_cores), requested)
    assert result.fits == exhaustive_fits(t, free_cores, requested), result.reason


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(SMALL)), st.data())
def test_every_placement_is_made_of_valid_sets(name: str, data: st.DataObject) -> None:
    t = SMALL[name]
    free_cores = data.draw(st.sets(st.integers(0, t.device_count * t.cores_per_device - 1), max_size=12))
    requested = PodRequest(
        tuple(data.draw(st.lists(any_kind, max_size=1))), tuple(data.draw(st.lists(any_kind, min_size=1, max_size=3)))
    )
    result = place(t, FreeState.of(t, free_cores), requested)
    if not result.fits:
        assert result.containers == ()
        return
    assert exhaustive_fits(t, free_cores, requested)
    for placed in result.containers:
        assert not placed.devices or set(placed.devices) in [set(g) for g in t.groups(len(placed.devices))]
        assert connected(t, {t.device_of(c) for c in placed.cores})
    held_cores = {c for p in result.containers for c in p.cores}
    held_devices = {d for p in result.containers for d in p.devices}
    assert len(held_devices) == requested.effective.devices
    assert len(held_cores) == requested.effective.cores
    silicon = held_cores | {c for d in held_devices for c in t.cores_of(d)}
    assert silicon <= free_cores
    assert result.free_after == FreeState.of(t, free_cores - silicon)


def test_containers_are_placed_as_the_plugin_will_not_as_hindsight_could() -> None:
    # The plugin chooses for each container without knowing the next: one range for the first
    # (cores 7-8) leaves the second on devices apart, though 5,7 + 8,11 would have served both.
    t = SMALL["inf2.24xlarge"]
    requested = pod(ContainerRequest(cores=2), ContainerRequest(cores=2))
    result = place(t, FreeState.of(t, {5, 7, 8, 11}), requested)
    assert result.reason == "container 2: no connected set of 2 free cores (free: 5,11)"
    assert exhaustive_fits(t, {5, 7, 8, 11}, requested)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(INSTANCE_TYPES)), st.data())
def test_refusal_answers_as_place_does(name: str, data: st.DataObject) -> None:
    t = topology(name)
    free_cores = data.draw(st.sets(st.integers(0, t.device_count * t.cores_per_device - 1)))
    requested = PodRequest(
        tuple(data.draw(st.lists(any_kind, max_size=1))), tuple(data.draw(st.lists(any_kind, min_size=1, max_size=2)))
    )
    free = FreeState.of(t, free_cores)
    assert refusal(t, free, requested) == place(t, free, requested).reason
