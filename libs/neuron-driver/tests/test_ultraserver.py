"""The node's UltraServer identity (issue 26 item 1): the driver's class attributes in each of their
formats (aws-neuron-driver fca19f7, v3/neuron_pelect.c), the election still running (busy, a zero
server id), garbage, and a whole simulated UltraServer whose nodes agree on their groups as the
driver's remapping says they must."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_driver import layout
from neuron_driver.inventory import scan
from neuron_driver.parse import (
    BUSY,
    parse_ultraserver_modes,
    parse_ultraserver_node_id,
    parse_ultraserver_server_id,
)
from neuron_driver.ultraserver import read_ultraserver
from neuron_model.ultraserver import NO_SERVER, X4H_MAP, X4V_MAP, Mode, State, modal_node_id, node_labels, pair_of
from neuron_sim import node as sim

SERVER = "00c0ffee12345678"


@pytest.fixture(scope="module")
def trn2u_server(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """One simulated 4-node trn2u UltraServer for the tests that only read it (~50,000 files)."""
    return sim.create_ultraserver(tmp_path_factory.mktemp("trn2u"), "trn2u.48xlarge", server_id=SERVER)


def first_node(root: Path, instance_type: str, nodes: int = 4) -> Path:
    """Node 0 of a simulated UltraServer of `nodes`, without the others' trees: for a test that
    rewrites node 0's attributes and reads nothing else."""
    return sim.create_ultraserver(root, instance_type, nodes, server_id=SERVER, node_ids=[0])[0]


@given(st.lists(st.integers(1, 4), min_size=1, max_size=4, unique=True))
def test_modes_are_the_driver_comma_list(modes: list[int]) -> None:
    assert parse_ultraserver_modes(",".join(map(str, modes)) + "\n") == tuple(modes)


@pytest.mark.parametrize(("text", "expected"), [("busy\n", BUSY), ("\n", ()), ("", ())])
def test_modes_busy_and_none(text: str, expected: object) -> None:
    assert parse_ultraserver_modes(text) == expected


@pytest.mark.parametrize("text", ["1,5\n", "x\n", "1,,2\n", "invalid\n", "1;2\n", "1,\u0663\n", "\u00b2\n"])
def test_modes_garbage_is_refused_quoting_it(text: str) -> None:
    with pytest.raises(ValueError, match="expected UltraServer modes"):
        parse_ultraserver_modes(text)


@given(st.integers(-1, 3))
def test_node_ids_read_back(node: int) -> None:
    assert parse_ultraserver_node_id(f"{node}\n") == node


def test_node_id_busy_invalid_and_negative() -> None:
    assert parse_ultraserver_node_id("busy\n") == BUSY
    for text in ("invalid\n", "-2\n", "\n", "one\n"):
        with pytest.raises(ValueError, match="expected"):
            parse_ultraserver_node_id(text)


@given(st.text("0123456789abcdef", min_size=16, max_size=16))
def test_server_ids_are_16_hex_digits_and_all_zero_is_none(server: str) -> None:
    assert parse_ultraserver_server_id(server + "\n") == (None if server == NO_SERVER else server)


@pytest.mark.parametrize("text", ["ABCDEF0123456789\n", "123\n", "busy\n", "00c0ffee123456789\n", "\n"])
def test_server_id_garbage_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="16 lowercase hex digits"):
        parse_ultraserver_server_id(text)


def test_the_driver_remaps_node_ids_for_two_node_groups() -> None:
    for node in range(4):
        assert modal_node_id(node, 4, Mode.X4) == node
        assert modal_node_id(node, 4, Mode.X2H) == X4H_MAP[node]
        assert modal_node_id(node, 4, Mode.X2V) == X4V_MAP[node]
        assert modal_node_id(node, 4, Mode.X1) == -1
    assert modal_node_id(1, 2, Mode.X4) == -1  # a 2-node UltraServer has no 4-node group
    assert modal_node_id(1, 2, Mode.X2H) == 1


def test_a_simulated_ultraserver_is_four_nodes_that_agree(trn2u_server: list[Path]) -> None:
    roots = trn2u_server
    readings = [read_ultraserver(root) for root in roots]
    assert {r.state for r in readings} == {State.IDENTIFIED}
    identities = [r.identity for r in readings]
    assert all(i is not None and i.modes == (Mode.X4, Mode.X2H, Mode.X2V, Mode.X1) for i in identities)
    groups4 = [i.group(4) for i in identities if i is not None]
    assert groups4 == [(SERVER, 0), (SERVER, 1), (SERVER, 2), (SERVER, 3)]
    pairs = [g for i in identities if i is not None and (g := i.group(2)) is not None]
    assert len(pairs) == 4
    # X2H pairs 4-node ids 0 with 2 and 1 with 3: each pair shares a server id, its own, with ids 0 and 1
    for a, b in ((0, 2), (1, 3)):
        assert pairs[a][0] == pairs[b][0] != SERVER
        assert (pairs[a][1], pairs[b][1]) == (0, 1)
        assert pair_of(a, Mode.X2H) == pair_of(b, Mode.X2H)
    assert pairs[0][0] != pairs[1][0]
    # and the inventory carries it
    assert scan(roots[3]).ultraserver == readings[3]


def test_while_the_election_runs_the_identity_is_pending_never_guessed(tmp_path: Path) -> None:
    root = first_node(tmp_path, "trn2u.48xlarge", nodes=2)
    sim.write_ultraserver(root, None, busy=True)
    reading = read_ultraserver(root)
    assert (reading.state, reading.identity) == (State.PENDING, None)
    assert "ultraserver_mode: busy" in reading.reason
    # modes known, node ids known, but the server id still zero: pending as well
    sim.write_ultraserver(root, sim.UltraServerSpec(0, SERVER, 2))
    (layout.HostLayout(root).class_dir / "server_id_2").write_text(NO_SERVER + "\n")
    reading = read_ultraserver(root)
    assert reading.state is State.PENDING
    assert "server_id_2: no server id yet for node id 0" in reading.reason


def test_a_node_outside_any_ultraserver_and_a_driver_without_support(tmp_path: Path) -> None:
    sim.create(tmp_path / "alone", "trn2u.48xlarge")
    sim.write_ultraserver(tmp_path / "alone", None)
    assert read_ultraserver(tmp_path / "alone").state is State.NONE
    sim.create(tmp_path / "trn1", "trn1.32xlarge")  # no class attributes at all
    assert read_ultraserver(tmp_path / "trn1").state is State.NONE
    assert scan(tmp_path / "trn1").ultraserver.state is State.NONE


@pytest.mark.parametrize(
    ("attribute", "text", "says"),
    [
        ("node_id_4", "invalid\n", "node_id_4: expected an integer"),
        ("server_id_4", "garbage\n", "server_id_4: expected 16 lowercase hex digits"),
        ("ultraserver_mode", "1,9\n", "ultraserver_mode: expected UltraServer modes"),
        ("node_id_4", "7\n", "node_id_4: node id 7 does not fit a group of 4"),
    ],
)
def test_garbage_is_invalid_naming_the_attribute(tmp_path: Path, attribute: str, text: str, says: str) -> None:
    root = first_node(tmp_path, "trn2u.48xlarge")
    (layout.HostLayout(root).class_dir / attribute).write_text(text)
    reading = read_ultraserver(root)
    assert reading.state is State.INVALID
    assert says in reading.reason


def test_trainium3_reservation_attributes(tmp_path: Path) -> None:
    """Trainium3 PDS: reservation_id, node_id and node_cnt instead of the per-size attributes."""
    root = tmp_path / "pds"
    directory = layout.HostLayout(root).class_dir
    directory.mkdir(parents=True)
    for name, text in (("ultraserver_mode", "1,4\n"), ("reservation_id", SERVER + "\n"), ("node_id", "3\n"),
                       ("node_cnt", "4\n")):  # fmt: skip
        (directory / name).write_text(text)
    reading = read_ultraserver(root)
    assert reading.state is State.IDENTIFIED
    assert reading.identity is not None
    assert reading.identity.group(4) == (SERVER, 3)
    (directory / "node_cnt").write_text("-1\n")  # not a partitioned platform
    reading = read_ultraserver(root)
    assert reading.identity is not None
    assert reading.identity.group(4) is None


def test_the_simulator_refuses_shapes_that_are_not_ultraservers(tmp_path: Path) -> None:
    with pytest.raises(sim.SimError, match="not an UltraServer instance type"):
        sim.create_ultraserver(tmp_path, "trn2.48xlarge")
    with pytest.raises(sim.SimError, match="2 or 4 nodes"):
        sim.create_ultraserver(tmp_path, "trn2u.48xlarge", nodes=3)
    with pytest.raises(sim.SimError, match="16 lowercase hex digits"):
        sim.create_ultraserver(tmp_path, "trn2u.48xlarge", server_id=NO_SERVER)


def test_aws_labels_of_each_node_of_a_simulated_ultraserver(tmp_path: Path, trn2u_server: list[Path]) -> None:
    """The labels AWS's LeaderWorkerSet examples key on: one 4-node server id for all four nodes, one
    2-node server id per pair, each node's id in both groups, and the group sizes it can run in."""
    roots = trn2u_server
    labels = [node_labels(read_ultraserver(root)) for root in roots]
    prefix = "neuron.amazonaws.com/ultraserver-"
    assert {k for one in labels for k in one} == {
        prefix + k for k in ("mode", "server-id-4", "node-id-4", "server-id-2", "node-id-2")
    }
    assert {one[prefix + "mode"] for one in labels} == {"1_2_4"}
    assert [one[prefix + "server-id-4"] for one in labels] == [SERVER] * 4
    assert [one[prefix + "node-id-4"] for one in labels] == ["0", "1", "2", "3"]
    pairs = [(one[prefix + "server-id-2"], one[prefix + "node-id-2"]) for one in labels]
    assert pairs[0][0] == pairs[2][0] != pairs[1][0] == pairs[3][0]  # X2H: 0 with 2, 1 with 3
    assert [node for _, node in pairs] == ["0", "0", "1", "1"]
    assert all(len(server) == 16 for server, _ in pairs)
    # a 2-node UltraServer: its pair only, and no 4-node labels
    two = [
        node_labels(read_ultraserver(root))
        for root in sim.create_ultraserver(tmp_path / "two", "trn2u.48xlarge", nodes=2)
    ]
    assert all(prefix + "server-id-4" not in one and prefix + "server-id-2" in one for one in two)


def test_no_labels_without_an_identity(tmp_path: Path) -> None:
    """Pending, invalid and none carry no labels: one from an earlier identity would be a guess."""
    root = first_node(tmp_path, "trn2u.48xlarge", nodes=2)
    assert node_labels(read_ultraserver(root))
    sim.write_ultraserver(root, None, busy=True)
    assert node_labels(read_ultraserver(root)) == {}
    (layout.HostLayout(root).class_dir / "ultraserver_mode").write_text("garbage\n")
    reading = read_ultraserver(root)
    assert reading.state is State.INVALID
    assert node_labels(reading) == {}
    sim.create(tmp_path / "trn1", "trn1.32xlarge")
    assert node_labels(read_ultraserver(tmp_path / "trn1")) == {}


def test_a_simulated_trainium3_reservation_is_four_nodes_read_back(tmp_path: Path) -> None:
    """trn3.48xlarge (PDS): the simulator writes reservation_id, node_id and node_cnt, never trn2u's."""
    roots = sim.create_ultraserver(tmp_path, "trn3.48xlarge", server_id=SERVER)
    directory = layout.HostLayout(roots[0]).class_dir
    assert (directory / "node_cnt").read_text() == "4\n"
    assert not (directory / "node_id_4").exists()
    readings = [read_ultraserver(root) for root in roots]
    assert {r.state for r in readings} == {State.IDENTIFIED}
    identities = [r.identity for r in readings if r.identity is not None]
    assert [i.group(4) for i in identities] == [(SERVER, n) for n in range(4)]
    assert all(i.group(2) is None for i in identities)
    prefix = "neuron.amazonaws.com/ultraserver-"
    assert node_labels(readings[2]) == {
        prefix + "mode": "1_4",
        prefix + "server-id-4": SERVER,
        prefix + "node-id-4": "2",
    }
    assert scan(roots[1]).ultraserver == readings[1]
    with pytest.raises(sim.SimError, match="has 4 nodes, not 2"):
        sim.create_ultraserver(tmp_path / "two", "trn3.48xlarge", nodes=2)
    with pytest.raises(sim.SimError, match="not an UltraServer instance type"):
        sim.create_ultraserver(tmp_path / "max", "trn3e.24xlarge")


def test_a_trainium3_node_while_the_election_runs_and_outside_any_reservation(tmp_path: Path) -> None:
    root = first_node(tmp_path, "trn3.48xlarge")
    sim.write_ultraserver(root, None, busy=True, reservation=True)
    reading = read_ultraserver(root)
    assert (reading.state, reading.identity) == (State.PENDING, None)
    sim.write_ultraserver(root, None, reservation=True)
    assert read_ultraserver(root).state is State.NONE
