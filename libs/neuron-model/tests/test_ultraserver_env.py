"""The runtime's UltraServer variables (issue 26 item 3), one function for the DRA driver's
UltraServerConfig and the device plugin's whole-node containers: the identity the driver tells, or a
clear refusal; never variables for a node whose identity is none, pending or invalid."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_model.ultraserver import (
    MODE_ENV,
    NODE_ID_ENV,
    NODES,
    SERVER_ID_ENV,
    Mode,
    State,
    UltraServerIdentity,
    UltraServerReading,
    env_mode,
    ultraserver_env,
)

US4 = "00c0ffee12345678"
US2 = "00c0ffee00000001"
TRN2U = (Mode.X4, Mode.X2H, Mode.X1)  # AWS's published trn2u row: mode label 1_2_4


def identified(modes: tuple[Mode, ...], **groups: tuple[str, int]) -> UltraServerReading:
    sizes = {int(k.removeprefix("g")): v for k, v in groups.items()}
    identity = UltraServerIdentity(modes, {n: s for n, (s, _) in sizes.items()}, {n: i for n, (_, i) in sizes.items()})
    return UltraServerReading(State.IDENTIFIED, identity)


def test_four_nodes_tell_x4_and_the_four_node_ids() -> None:
    reading = identified(TRN2U, g4=(US4, 3), g2=(US2, 1))
    assert ultraserver_env(reading, 4) == {MODE_ENV: "1", SERVER_ID_ENV: US4, NODE_ID_ENV: "3"}


def test_two_nodes_tell_the_mode_the_drivers_two_node_ids_belong_to() -> None:
    reading = identified(TRN2U, g4=(US4, 3), g2=(US2, 1))
    assert ultraserver_env(reading, 2) == {MODE_ENV: "2", SERVER_ID_ENV: US2, NODE_ID_ENV: "1"}
    vertical = identified((Mode.X4, Mode.X2V), g4=(US4, 3), g2=(US2, 1))
    assert ultraserver_env(vertical, 2)[MODE_ENV] == "3"
    # both supported: the driver's 2-node ids are X2H's (AWS's script would say X2V: see env_mode)
    both = identified((Mode.X4, Mode.X2H, Mode.X2V), g4=(US4, 3), g2=(US2, 1))
    assert ultraserver_env(both, 2)[MODE_ENV] == "2"


@pytest.mark.parametrize(
    ("reading", "match"),
    [
        (None, r"^this node's UltraServer identity is none: it is not an UltraServer node$"),
        (UltraServerReading(State.NONE, reason="ultraserver_mode: absent"), r"is none: .*\(ultraserver_mode: absent\)"),
        (
            UltraServerReading(State.PENDING, reason="node_id_4: busy"),
            r"is not known yet \(the Neuron driver's election is running\) \(node_id_4: busy\)",
        ),
        (
            UltraServerReading(State.INVALID, reason="node_id_4: 'x' is not a number"),
            r"cannot be read \(node_id_4: 'x'",
        ),
        # a reading that says identified but carries no identity is no identity either
        (UltraServerReading(State.IDENTIFIED), r"identity is missing$"),
    ],
)
def test_no_identity_no_variables(reading: UltraServerReading | None, match: str) -> None:
    for nodes in (2, 4):
        with pytest.raises(ValueError, match=match):
            ultraserver_env(reading, nodes)


def test_a_group_the_node_is_not_in_is_refused_naming_what_it_supports() -> None:
    pair_only = identified((Mode.X2H, Mode.X1), g2=(US2, 0))
    with pytest.raises(ValueError, match=r"in no group of 4 nodes \(its UltraServer supports: 2 \(X2H\), 1 \(X1\)\)"):
        ultraserver_env(pair_only, 4)
    alone = identified((Mode.X1,))
    with pytest.raises(ValueError, match=r"in no group of 2 nodes"):
        ultraserver_env(alone, 2)
    # ids for 4 nodes, but the driver does not list X4 among the supported modes: contradictory, refused
    with pytest.raises(ValueError, match=r"in no group of 4 nodes \(its UltraServer supports: 2 \(X2H\)\)"):
        ultraserver_env(identified((Mode.X2H,), g4=(US4, 0), g2=(US2, 0)), 4)
    with pytest.raises(ValueError, match=r"supports: none"):
        ultraserver_env(identified(()), 4)


@pytest.mark.parametrize("nodes", [0, 1, 3, 8, -1])
def test_only_two_and_four_node_jobs_get_variables(nodes: int) -> None:
    reading = identified(TRN2U, g4=(US4, 3), g2=(US2, 1))
    with pytest.raises(ValueError, match=f"in no group of {nodes} nodes"):
        ultraserver_env(reading, nodes)


server_ids = st.text("0123456789abcdef", min_size=16, max_size=16)


@st.composite
def readings(draw: st.DrawFn) -> UltraServerReading:
    state = draw(st.sampled_from(State))
    reason = draw(st.text(max_size=10))
    if state is not State.IDENTIFIED and not draw(st.booleans()):
        return UltraServerReading(state, reason=reason)
    modes = tuple(draw(st.lists(st.sampled_from(Mode), unique=True, max_size=4)))
    sizes = draw(st.lists(st.sampled_from((2, 4)), unique=True))
    servers = {n: draw(server_ids) for n in sizes}
    nodes = {n: draw(st.integers(0, n - 1)) for n in sizes}
    return UltraServerReading(state, UltraServerIdentity(modes, servers, nodes), reason)


@given(readings(), st.integers(-1, 5))
def test_variables_are_the_drivers_identity_or_a_refusal(reading: UltraServerReading, nodes: int) -> None:
    identity = reading.identity
    expected_ok = (
        reading.state is State.IDENTIFIED
        and identity is not None
        and identity.group(nodes) is not None
        and env_mode(identity.modes, nodes) is not None
    )
    if not expected_ok:
        with pytest.raises(ValueError, match="UltraServer") as refused:
            ultraserver_env(reading, nodes)
        if reading.reason and reading.state is not State.IDENTIFIED:
            assert reading.reason in str(refused.value)  # the attribute the driver's reading names is kept
        return
    env = ultraserver_env(reading, nodes)
    assert identity is not None
    group = identity.group(nodes)
    assert group is not None
    mode = Mode(int(env[MODE_ENV]))
    assert env == {MODE_ENV: str(int(mode)), SERVER_ID_ENV: group[0], NODE_ID_ENV: str(group[1])}
    assert NODES[mode] == nodes
    assert mode in identity.modes
    assert 0 <= int(env[NODE_ID_ENV]) < nodes


# -- NEURON_GLOBAL_TOPOID: the job's, by AWS's init script's rule ------------------------------------------


def test_global_topology_ids_number_the_workers_by_server_node_and_fqdn() -> None:
    from neuron_model.ultraserver import TOPOID0_HOST_ENV, TOPOID_ENV, JobWorker, global_topology_env

    other = "00c0ffeeffffffff"  # sorts after US4
    workers = [
        JobWorker(other, 0, "job-worker-4.job.ns.svc.cluster.local"),
        JobWorker(US4, 2, "job-worker-0.job.ns.svc.cluster.local"),
        JobWorker(US4, 0, "job-worker-3.job.ns.svc.cluster.local"),
        JobWorker(US4, 1, "job-worker-1.job.ns.svc.cluster.local"),
        JobWorker(US4, 3, "job-worker-2.job.ns.svc.cluster.local"),
    ]
    envs = {w.fqdn: global_topology_env(workers, w) for w in workers}
    leader = "job-worker-3.job.ns.svc.cluster.local"  # the lowest server id's node 0, not the lowest pod name
    assert {env[TOPOID0_HOST_ENV] for env in envs.values()} == {leader}
    assert [envs[w.fqdn][TOPOID_ENV] for w in workers] == ["4", "2", "0", "1", "3"]
    # one group of 4 nodes alone: the rank is the node's id in it
    group = workers[1:]
    assert all(global_topology_env(group, w)[TOPOID_ENV] == str(w.node_id) for w in group)


@given(st.lists(st.tuples(st.sampled_from([US4, US2]), st.integers(-1, 3)), min_size=1, max_size=8))
def test_global_topology_ids_are_0_to_n_minus_1_and_follow_the_text_sort(ids: list[tuple[str, int]]) -> None:
    from neuron_model.ultraserver import TOPOID0_HOST_ENV, TOPOID_ENV, JobWorker, global_topology_env

    workers = [JobWorker(s, n, f"w{i}.example") for i, (s, n) in enumerate(ids)]
    envs = [global_topology_env(workers, w) for w in workers]
    assert sorted(int(e[TOPOID_ENV]) for e in envs) == list(range(len(workers)))
    lines = sorted(f"{w.server_id}:{w.node_id}:{w.fqdn}" for w in workers)  # what `sort` would order
    assert {e[TOPOID0_HOST_ENV] for e in envs} == {lines[0].split(":")[2]}


def test_global_topology_ids_refuse_a_stranger_and_duplicate_fqdns() -> None:
    from neuron_model.ultraserver import JobWorker, global_topology_env

    a, b = JobWorker(US4, 0, "a"), JobWorker(US4, 1, "b")
    with pytest.raises(ValueError, match="not one of the job's workers"):
        global_topology_env([a], b)
    with pytest.raises(ValueError, match="same FQDN"):
        global_topology_env([a, JobWorker(US4, 1, "a")], a)
