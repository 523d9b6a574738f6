"""Which UltraServer group of nodes a node is in, as group placement needs it."""

from __future__ import annotations

from neuron_model.ultraserver import (
    Mode,
    State,
    UltraServerIdentity,
    UltraServerReading,
    domain,
    server_id_label,
    topology_nodes,
)

X4_X2H = UltraServerIdentity((Mode.X4, Mode.X2H, Mode.X1), {4: "a" * 16, 2: "b" * 16}, {4: 2, 2: 0})


def test_the_server_id_labels_name_their_group_size_and_no_other_key_does() -> None:
    assert topology_nodes(server_id_label(4)) == 4
    assert topology_nodes(server_id_label(2)) == 2
    assert topology_nodes("topology.kubernetes.io/zone") is None
    assert topology_nodes("neuron.amazonaws.com/ultraserver-node-id-4") is None


def test_a_node_is_in_the_domain_of_each_size_its_modes_support() -> None:
    reading = UltraServerReading(State.IDENTIFIED, X4_X2H)
    assert domain(reading, 4) == "a" * 16
    assert domain(reading, 2) == "b" * 16
    only_x4 = UltraServerReading(State.IDENTIFIED, UltraServerIdentity((Mode.X4,), X4_X2H.server_ids, X4_X2H.node_ids))
    assert domain(only_x4, 2) is None  # ids for 2 nodes, but no 2-node mode: no group of 2 runs there


def test_no_identity_yet_is_no_domain_never_a_guess() -> None:
    assert domain(None, 4) is None
    assert domain(UltraServerReading(State.PENDING, reason="busy"), 4) is None
    assert domain(UltraServerReading(State.INVALID, reason="invalid"), 4) is None
    assert domain(UltraServerReading(State.NONE), 4) is None
