"""The runtime's UltraServer variables on the device-plugin path (issue 26 item 3): with
--ultraserver-env, a container holding all of the node's devices gets the driver's identity for a
job of that many nodes; fewer devices get none; a node outside any UltraServer gives none; an
identity that is pending, unreadable or without such a group refuses the container (holding nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest
from polling import until_async
from standins.kubelet import AdmissionError

from neuron_device_plugin import config
from neuron_device_plugin.state import whole_node_ultraserver_env
from neuron_driver import layout
from neuron_model.ultraserver import (
    MODE_ENV,
    NODE_ID_ENV,
    SERVER_ID_ENV,
    Mode,
    State,
    UltraServerIdentity,
    UltraServerReading,
)
from neuron_sim import node as sim

NEURON = "aws.amazon.com/neuron"
NEURONCORE = "aws.amazon.com/neuroncore"
US = "00c0ffee12345678"
TRN2U = "trn2u.48xlarge"  # 16 devices, 64 logical cores


def ultra(envs: object) -> dict[str, str]:
    return {k: v for k, v in dict(envs).items() if "ULTRASERVER" in k or "GLOBAL_TOPOID" in k}  # type: ignore[call-overload]


def errors(h, reason: str = "ultraserver") -> float:  # type: ignore[no-untyped-def]
    return h.plugin.metrics.allocation_errors.labels(NEURON, reason)._value.get()  # type: ignore[no-any-return]


# -- the flag ------------------------------------------------------------------------------------------


def test_the_flag_is_off_by_default_and_has_an_environment_twin() -> None:
    assert config.parse([], env={}).ultraserver_env is None
    assert config.parse(["--ultraserver-env", "4"], env={}).ultraserver_env == 4
    assert config.parse([], env={"NEURON_DP_ULTRASERVER_ENV": "2"}).ultraserver_env == 2
    assert config.parse(["--ultraserver-env", "off"], env={"NEURON_DP_ULTRASERVER_ENV": "4"}).ultraserver_env is None


@pytest.mark.parametrize(("args", "env"), [(["--ultraserver-env", "3"], {}), ([], {"NEURON_DP_ULTRASERVER_ENV": "1"})])
def test_other_values_stop_the_plugin(args: list[str], env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        config.parse(args, env=env)
    assert "ultraserver-env" in capsys.readouterr().err.lower().replace("_", "-")


# -- the decision, pure ----------------------------------------------------------------------------------


def test_whole_node_env_by_identity_state() -> None:
    assert whole_node_ultraserver_env(4, UltraServerReading(State.NONE, reason="absent")) == {}
    with pytest.raises(ValueError, match=r"not known yet .*busy"):
        whole_node_ultraserver_env(4, UltraServerReading(State.PENDING, reason="ultraserver_mode: busy"))
    with pytest.raises(ValueError, match="cannot be read"):
        whole_node_ultraserver_env(2, UltraServerReading(State.INVALID, reason="node_id_2: garbage"))
    identity = UltraServerIdentity((Mode.X4, Mode.X2H, Mode.X1), {4: US}, {4: 2})
    reading = UltraServerReading(State.IDENTIFIED, identity)
    assert whole_node_ultraserver_env(4, reading) == {MODE_ENV: "1", SERVER_ID_ENV: US, NODE_ID_ENV: "2"}
    with pytest.raises(ValueError, match="in no group of 2 nodes"):
        whole_node_ultraserver_env(2, reading)


# -- Allocate ----------------------------------------------------------------------------------------------


async def released(h, pod: str) -> None:  # type: ignore[no-untyped-def]
    """Until the kubelet was told the pod's silicon is held (the other resource's IDs turn
    Unhealthy), then, once the plugin's next List sees the release, that every ID is back."""

    def healthy() -> tuple[int, int]:
        return len(h.kubelet.healthy(NEURON)), len(h.kubelet.healthy(NEURONCORE))

    await until_async(lambda: healthy() != (16, 64), "the hand-out seen by the kubelet", 5, 0.02)
    h.kubelet.release(pod)
    await until_async(lambda: healthy() == (16, 64), "the release seen by the kubelet", 5, 0.02)


async def test_a_container_holding_every_device_gets_the_identity(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin(TRN2U, "--ultraserver-env=4")
    sim.write_ultraserver(h.root, sim.UltraServerSpec(3, US, 4))
    expected = {MODE_ENV: "1", SERVER_ID_ENV: US, NODE_ID_ENV: "3"}  # no NEURON_GLOBAL_*: the job's, not the node's
    whole = await h.kubelet.allocate(NEURON, 16, pod="devices")
    assert ultra(whole.envs) == expected
    assert len(whole.envs["NEURON_RT_VISIBLE_CORES"].split(",")) == 64
    await released(h, "devices")
    every_core = await h.kubelet.allocate(NEURONCORE, 64, pod="cores")  # all of the silicon, counted in cores
    assert ultra(every_core.envs) == expected
    await released(h, "cores")
    fewer = await h.kubelet.allocate(NEURON, 15, pod="fewer")
    assert ultra(fewer.envs) == {}
    assert ultra((await h.kubelet.allocate(NEURONCORE, 1, pod="one")).envs) == {}


async def test_two_node_jobs_get_the_pairs_identity(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin(TRN2U, "--ultraserver-env=2")
    sim.write_ultraserver(h.root, sim.UltraServerSpec(3, US, 4))
    whole = await h.kubelet.allocate(NEURON, 16)
    # the driver's 2-node ids are X2H's where supported: 4-node id 3 is node 1 of the pair {1, 3}
    assert ultra(whole.envs) == {
        MODE_ENV: "2",
        SERVER_ID_ENV: sim.pair_server_id(US, Mode.X2H, 1),
        NODE_ID_ENV: "1",
    }


async def test_off_by_default(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin(TRN2U)
    sim.write_ultraserver(h.root, sim.UltraServerSpec(3, US, 4))
    assert ultra((await h.kubelet.allocate(NEURON, 16)).envs) == {}


@pytest.mark.parametrize("ultraserver", [False, True])
async def test_a_node_outside_any_ultraserver_gives_none_and_refuses_nothing(start_plugin, ultraserver: bool) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin(TRN2U if ultraserver else "trn1.32xlarge", "--ultraserver-env=4")
    if ultraserver:
        sim.write_ultraserver(h.root, None)  # an UltraServer-capable driver on a node in none: no modes
    assert ultra((await h.kubelet.allocate(NEURON, 16)).envs) == {}
    assert errors(h) == 0


async def test_a_pending_identity_refuses_the_whole_node_container_and_holds_nothing(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin(TRN2U, "--ultraserver-env=4")
    sim.write_ultraserver(h.root, None, busy=True)
    with pytest.raises(AdmissionError, match=r"FAILED_PRECONDITION: --ultraserver-env 4: .* is not known yet .*busy"):
        await h.kubelet.allocate(NEURON, 16, pod="early")
    assert errors(h) == 1
    assert len(h.kubelet.healthy(NEURON)) == 16  # nothing was recorded as held
    # a container with fewer devices is not an UltraServer job: it starts, without variables
    small = await h.kubelet.allocate(NEURON, 1, pod="small")
    assert ultra(small.envs) == {}
    await released(h, "small")
    # the identity is read at each Allocate: once the election is over, the next pod gets it
    sim.write_ultraserver(h.root, sim.UltraServerSpec(0, US, 4))
    later = await h.kubelet.allocate(NEURON, 16, pod="later")
    assert ultra(later.envs) == {MODE_ENV: "1", SERVER_ID_ENV: US, NODE_ID_ENV: "0"}


async def test_an_unreadable_identity_or_a_missing_group_refuses(start_plugin) -> None:  # type: ignore[no-untyped-def]
    h = await start_plugin(TRN2U, "--ultraserver-env=4")
    sim.write_ultraserver(h.root, sim.UltraServerSpec(1, US, 4))
    node_id = layout.HostLayout(Path(h.root)).class_dir / "node_id_4"
    node_id.write_text("seven\n")
    with pytest.raises(AdmissionError, match=r"identity cannot be read \(.*node_id_4"):
        await h.kubelet.allocate(NEURON, 16, pod="garbage")
    sim.write_ultraserver(h.root, sim.UltraServerSpec(1, US, 2))  # a 2-node UltraServer: no group of 4
    with pytest.raises(AdmissionError, match=r"this node is in no group of 4 nodes \(its UltraServer supports: "):
        await h.kubelet.allocate(NEURONCORE, 64, pod="cores")
    assert errors(h) == 1
    assert h.plugin.metrics.allocation_errors.labels(NEURONCORE, "ultraserver")._value.get() == 1


async def test_a_trainium3_reservation_node_tells_its_reservation_as_the_4_node_group(start_plugin) -> None:  # type: ignore[no-untyped-def]
    """trn3.48xlarge (PDS): the driver's reservation_id and node_id (node_cnt 4) are the identity told."""
    h = await start_plugin("trn3.48xlarge", "--ultraserver-env=4")
    sim.write_ultraserver(h.root, sim.pds_spec(2, US))
    whole = await h.kubelet.allocate(NEURON, 16, pod="devices")
    assert ultra(whole.envs) == {MODE_ENV: "1", SERVER_ID_ENV: US, NODE_ID_ENV: "2"}
    await released(h, "devices")
    # the reservation groups 4 nodes only: a 2-node job is refused, never told a guessed pair
    h2 = await start_plugin("trn3.48xlarge", "--ultraserver-env=2")
    sim.write_ultraserver(h2.root, sim.pds_spec(1, US))
    with pytest.raises(AdmissionError, match=r"this node is in no group of 2 nodes"):
        await h2.kubelet.allocate(NEURON, 16, pod="pair")
