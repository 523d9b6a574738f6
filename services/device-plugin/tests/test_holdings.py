from __future__ import annotations

from neuron_device_plugin.holdings import build_holdings, conflicts, describe
from neuron_model import resources

NEURON = resources.neuron()
CORE = resources.neuroncore()
ALIAS = resources.neurondevice()


def test_same_resource_never_conflicts() -> None:
    h = build_holdings([(NEURON, 3, "ns/p/init")])
    assert conflicts(NEURON, 3, h, (6, 7), None) == []


def test_device_vs_its_cores_both_ways() -> None:
    h = build_holdings([(NEURON, 3, "ns/a/c"), (CORE, 9, "ns/b/c")])
    assert describe(conflicts(CORE, 6, h, (), 3)) == "ns/a/c (as aws.amazon.com/neuron)"
    assert conflicts(CORE, 8, h, (), 4) == []
    assert describe(conflicts(NEURON, 4, h, (8, 9), None)) == "ns/b/c (as aws.amazon.com/neuroncore)"


def test_alias_and_neuron_are_the_same_silicon() -> None:
    h = build_holdings([(ALIAS, 1, "a pending allocation")])
    assert [x.resource for x in conflicts(NEURON, 1, h, (2, 3), None)] == ["aws.amazon.com/neurondevice"]
