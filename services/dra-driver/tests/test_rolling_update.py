"""Two instances of the driver on one node, as during a rolling update with `maxSurge` (the kubelet's
seamless upgrade of DRA plugins, KEP-4381): sockets named after each pod's UID, so the new one
registers beside the old one; dead instances' sockets cleaned up, live ones left alone; and the claim
state shared through the checkpoint under a file lock, since the kubelet may prepare a claim through
one instance and unprepare it through the other."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import sim_nodes
from dra_harness import eventually
from flag_errors import refusal
from neuron_dra_driver import config
from neuron_dra_driver.claims import ClaimRef, spec_file_name
from neuron_dra_driver.driver import Driver
from neuron_dra_driver.metrics import DriverMetrics
from neuron_dra_driver.servers import remove_dead_sockets
from standins.dra_kubelet import allocated_claim

OLD_POD = "7c1d2a40-aaaa-4bbb-8ccc-000000000001"
NEW_POD = "7c1d2a40-aaaa-4bbb-8ccc-000000000002"


def test_a_pod_uid_names_both_sockets_as_the_kubeletplugin_helper_does() -> None:
    alone = config.parse(["--node-name", "a"], env={})
    assert (alone.dra_socket.name, alone.registration_socket.name, alone.serialize_lock) == (
        "dra.sock",
        "neuron.aws.com-reg.sock",
        None,
    )
    old = config.parse(["--node-name", "a", "--pod-uid", OLD_POD], env={})
    new = config.parse(["--node-name", "a"], env={"NEURON_DRA_POD_UID": NEW_POD})
    assert old.dra_socket == Path(f"/var/lib/kubelet/plugins/neuron.aws.com/dra-{OLD_POD}.sock")
    assert old.registration_socket == Path(f"/var/lib/kubelet/plugins_registry/neuron.aws.com-{OLD_POD}-reg.sock")
    # side by side: nothing of one instance's is the other's, but the lock (and checkpoint) they share
    assert {old.dra_socket, old.registration_socket}.isdisjoint({new.dra_socket, new.registration_socket})
    assert old.serialize_lock == new.serialize_lock == old.checkpoint_file.with_name("serialize.lock")


def test_a_pod_uid_that_would_leave_the_directory_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert "not a pod UID" in refusal(lambda: config.parse(["--node-name", "a", "--pod-uid", "../x"], env={}), capsys)


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        ("dra.sock", True),
        (f"dra-{OLD_POD}.sock", True),
        ("neuron.aws.com-reg.sock", True),
        (f"neuron.aws.com-{OLD_POD}-reg.sock", True),
        ("gpu.example.com-reg.sock", False),
        (f"gpu.example.com-{OLD_POD}-reg.sock", False),
        ("dra-.sock", False),
        ("checkpoint.json", False),
        ("serialize.lock", False),
    ],
)
def test_which_names_are_an_instances_socket(name: str, ours: bool) -> None:
    assert config.is_instance_socket(name) is ours


def _dead_socket(path: Path) -> None:
    """A socket file whose process is gone: bound, then closed without unlinking it."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()


def test_only_dead_instances_sockets_are_removed(short_tmp: Path) -> None:
    tmp_path = short_tmp  # socket paths must stay under 108 bytes
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        live.bind(str(tmp_path / f"neuron.aws.com-{OLD_POD}-reg.sock"))
        live.listen(1)
        _dead_socket(tmp_path / "neuron.aws.com-0000dead-reg.sock")
        _dead_socket(tmp_path / "neuron.aws.com-reg.sock")  # an instance from before pod UIDs, killed
        _dead_socket(tmp_path / "gpu.example.com-0000dead-reg.sock")  # another driver's: not ours to judge
        own = tmp_path / f"neuron.aws.com-{NEW_POD}-reg.sock"
        _dead_socket(own)  # its own name is left to the caller, which binds it anew
        removed = remove_dead_sockets(tmp_path, own)
    finally:
        live.close()
    assert sorted(p.name for p in removed) == ["neuron.aws.com-0000dead-reg.sock", "neuron.aws.com-reg.sock"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["gpu.example.com-0000dead-reg.sock", f"neuron.aws.com-{OLD_POD}-reg.sock", own.name]
    )


class Claims:
    """The API server as the driver reads claims from it."""

    def __init__(self, *objs: dict[str, Any]) -> None:
        self.objs = {f"/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/{o['metadata']['name']}": o for o in objs}

    async def get(self, path: str) -> dict[str, Any]:
        return self.objs[path]


def allocated(name: str, uid: str, device: str) -> dict[str, Any]:
    result = {"request": "neuron", "driver": "neuron.aws.com", "pool": "node-a", "device": device}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


ONE = ClaimRef("11111111-0000-0000-0000-000000000001", "ns", "one")
TWO = ClaimRef("11111111-0000-0000-0000-000000000002", "ns", "two")
CLAIMS = Claims(allocated("one", ONE.uid, "neurondevice1"), allocated("two", TWO.uid, "neurondevice2"))


def instance(tmp_path: Path, shared: bool = True) -> Driver:
    """One instance of the driver on node-a; all share the node's plugin directory and CDI directory."""
    inv = sim_nodes.inventory("trn1.32xlarge", None)
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir(exist_ok=True)
    d = Driver(
        node_name="node-a",
        api=CLAIMS,
        inventory=lambda: inv,
        unhealthy=dict,
        checkpoint_file=plugin_dir / "checkpoint.json",
        cdi_dir=tmp_path / "cdi",
        host_dev_root=Path("/"),
        metrics=DriverMetrics(),
        lock_file=plugin_dir / config.SERIALIZE_LOCK if shared else None,
    )
    d.load()
    return d


@pytest.mark.parametrize("shared", [True, False], ids=["with the shared lock", "alone (the failure it prevents)"])
async def test_two_instances_keep_one_claim_state(tmp_path: Path, shared: bool) -> None:
    old, new = instance(tmp_path, shared), instance(tmp_path, shared)
    assert not isinstance((await old.prepare([ONE]))[ONE.uid], str)
    assert not isinstance((await new.prepare([TWO]))[TWO.uid], str)  # started before `one` was prepared
    saved = set(new.checkpoint.load())
    # the kubelet unprepares `one` through the new instance, which never prepared it
    assert (await new.unprepare([ONE])) == {ONE.uid: ""}
    after = set(old.checkpoint.load())
    if not shared:
        # each instance rewrote the checkpoint from its own memory: `one` was lost when `two` was saved,
        # so a restart would no longer know the claim the kubelet still holds
        assert saved == {TWO.uid}
        return
    assert saved == {ONE.uid, TWO.uid}
    assert after == {TWO.uid}
    assert not (tmp_path / "cdi" / spec_file_name(ONE.uid)).exists()
    # the old instance, asked again for `two`, answers from the shared state with the same devices
    again = (await old.prepare([TWO]))[TWO.uid]
    assert not isinstance(again, str)
    assert [d.device for d in again.devices] == ["neurondevice2"]
    assert set(old.prepared) == {TWO.uid}


@pytest.mark.integration
async def test_a_new_instance_serves_beside_the_old_one_and_takes_over_its_claims(start_driver) -> None:  # type: ignore[no-untyped-def]
    """The real driver twice on one simulated node (one plugin directory, one registry, one API
    server), as a rollout with a surge runs it: the new instance registers without touching the old
    one's sockets; a claim prepared through one is unprepared through the other; the old one stops
    and removes only its own sockets, and the new one goes on serving."""
    old = await start_driver("trn1.32xlarge", "--pod-uid", OLD_POD, register=False)
    old_reg = old.dirs / "registry" / config.registration_socket_name(OLD_POD)
    await _eventually_exists(old_reg)
    assert (await old.kubelet.register(old_reg.name)).endpoint == str(old.dirs / "plugins" / f"dra-{OLD_POD}.sock")
    new = await start_driver(
        "trn1.32xlarge", "--pod-uid", NEW_POD, register=False, root=old.root, dirs=old.dirs, node=old.node
    )
    new_reg = old.dirs / "registry" / config.registration_socket_name(NEW_POD)
    await _eventually_exists(new_reg)
    assert (await new.kubelet.register(new_reg.name)).endpoint == str(old.dirs / "plugins" / f"dra-{NEW_POD}.sock")
    assert old_reg.exists(), "the new instance removed the old one's registration socket"
    # Ready beside the old one (the slices it would publish are there): the DaemonSet then stops the old pod
    await eventually(lambda: old.driver.ready()[0] and new.driver.ready()[0])

    claim = await allocated_claim(old.api, old.node, ["neurondevice3"], name="rolled-claim")
    ref = (claim["metadata"]["uid"], "default", "rolled-claim")
    spec = old.cdi_dir / spec_file_name(ref[0])
    assert (await new.kubelet.prepare(ref)).claims[ref[0]].error == ""
    assert spec.exists()
    assert (await old.kubelet.unprepare(ref)).claims[ref[0]].error == ""  # the old one never prepared it
    assert not spec.exists()
    assert old.driver.driver.checkpoint.load() == {}  # so no restart of either brings it back
    assert (await old.kubelet.prepare(ref)).claims[ref[0]].error == ""

    assert await old.shutdown() == 0
    assert not old_reg.exists()
    assert not (old.dirs / "plugins" / f"dra-{OLD_POD}.sock").exists()
    assert new_reg.exists()
    assert (await new.kubelet.unprepare(ref)).claims[ref[0]].error == ""  # the claim the old one prepared last
    assert not spec.exists()
    assert new.driver.driver.checkpoint.load() == {}


async def _eventually_exists(path: Path) -> None:
    await eventually(path.exists)
