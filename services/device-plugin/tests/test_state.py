"""The plugin's device list across rescans: what `PluginState` keeps of a device gone from sysfs,
and what a renumbering of its cores (another logical core setting) starts afresh. The verdicts
themselves are `neuron_health.device_health.DeviceHealth`'s, tested in libs/neuron-common."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from neuron_device_plugin.metrics import PluginMetrics
from neuron_device_plugin.state import KnownDevice, PluginState
from neuron_driver.inventory import InstanceTypeSource, NodeInventory, scan
from neuron_model import resources
from neuron_sim import node as sim

NEURON = resources.neuron()
CORE = resources.neuroncore()


@pytest.fixture(scope="module")
def trn2(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], NodeInventory]:
    """trn2.48xlarge (16 devices, NUMA 0 for 0-7 and 1 for 8-15) at a logical core setting."""
    made: dict[int, NodeInventory] = {}

    def make(lnc: int) -> NodeInventory:
        if lnc not in made:
            root = tmp_path_factory.mktemp(f"trn2-lnc{lnc}")
            sim.create(root, "trn2.48xlarge", lnc)
            made[lnc] = scan(root, env={})
        return made[lnc]

    return make


def without(inventory: NodeInventory, *gone: int) -> NodeInventory:
    return dataclasses.replace(inventory, devices=tuple(d for d in inventory.devices if d.index not in gone))


def guessed(inventory: NodeInventory) -> NodeInventory:
    """The same node with its instance type guessed, so it promises no device."""
    return dataclasses.replace(inventory, instance_type_source=InstanceTypeSource.GUESSED)


def state_of(inventory: NodeInventory) -> PluginState:
    return PluginState(inventory, [NEURON, CORE], PluginMetrics(), quiet_period=1, pending_ttl=60, clock=lambda: 0.0)


def transitions(state: PluginState, device: int, to: str) -> float:
    return float(state.metrics.health_transitions.labels(str(device), to)._value.get())


def test_a_vanished_device_stays_advertised_unhealthy_with_its_numa_node_and_cores(
    trn2: Callable[[int], NodeInventory],
) -> None:
    state = state_of(guessed(trn2(2)))
    event = state.changed
    state.set_inventory(guessed(without(trn2(2), 9)))
    assert event.is_set()  # the streams send the list again
    assert state.known[9] == KnownDevice(9, 1, (36, 37, 38, 39))
    advertised = {a.id: a for a in state.advertised(NEURON)}
    assert not advertised["neuron9"].healthy
    assert advertised["neuron9"].numa_node == 1
    assert transitions(state, 9, "unhealthy") == 1
    state.set_inventory(guessed(without(trn2(2), 9)))  # still gone: no second transition
    assert transitions(state, 9, "unhealthy") == 1


def test_renumbered_cores_forget_the_vanished_devices_no_one_promised(trn2: Callable[[int], NodeInventory]) -> None:
    state = state_of(guessed(trn2(2)))
    state.set_inventory(guessed(without(trn2(2), 9)))
    state.set_inventory(guessed(without(trn2(1), 9)))
    assert state.topology.cores_per_device == 8
    assert sorted(state.known) == [i for i in range(16) if i != 9]
    assert state.known[10] == KnownDevice(10, 1, tuple(range(80, 88)))
    assert "neuron9" not in {a.id for a in state.advertised(NEURON)}


def test_renumbered_cores_keep_the_promised_devices_with_their_new_cores(trn2: Callable[[int], NodeInventory]) -> None:
    state = state_of(trn2(2))  # the instance type read from DMI promises 16 devices
    state.set_inventory(without(trn2(2), 9))
    state.set_inventory(without(trn2(1), 9))
    assert sorted(state.known) == list(range(16))
    # renumbered: the old numbering's knowledge of the missing device (its NUMA node) is dropped
    assert state.known[9] == KnownDevice(9, None, tuple(range(72, 80)))
    assert not state.verdict(9).healthy
