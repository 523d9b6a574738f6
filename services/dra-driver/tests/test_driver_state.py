"""The driver's claim state (memory, checkpoint, CDI specs) without an API server: a stand-in
answers the claim GETs, and writes are made to fail where a full or read-only disk would."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import sim_nodes
from neuron_dra_driver.checkpoint import Checkpoint
from neuron_dra_driver.claims import ClaimRef, spec_file_name
from neuron_dra_driver.driver import Driver
from neuron_dra_driver.metrics import DriverMetrics

from neuron_common.kube import ApiError

UID = "0d9f3c1e-1111-2222-3333-444455556666"
REF = ClaimRef(UID, "ns", "c")


class Claims:
    """The API server as the driver reads claims from it."""

    def __init__(self, *objs: dict[str, Any]) -> None:
        self.down = False
        self.objs = {f"/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/{o['metadata']['name']}": o for o in objs}

    async def get(self, path: str) -> dict[str, Any]:
        if self.down:
            raise ApiError(0, "connection refused")
        if path not in self.objs:
            raise ApiError(404, f"{path} not found")
        return self.objs[path]

    def put(self, obj: dict[str, Any]) -> None:
        self.objs[f"/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/{obj['metadata']['name']}"] = obj

    def delete(self, name: str) -> None:
        del self.objs[f"/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/{name}"]


def allocated(device: str) -> dict[str, Any]:
    result = {"request": "neuron", "driver": "neuron.aws.com", "pool": "node-a", "device": device}
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": UID},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def driver(tmp_path: Path, api: Claims) -> Driver:
    inv = sim_nodes.inventory("trn1.32xlarge", None)
    return Driver(
        node_name="node-a",
        api=api,
        inventory=lambda: inv,
        unhealthy=dict,
        checkpoint_file=tmp_path / "state" / "checkpoint.json",
        cdi_dir=tmp_path / "cdi",
        host_dev_root=Path("/"),
        metrics=DriverMetrics(),
    )


async def test_an_unprepare_whose_checkpoint_write_failed_is_saved_when_the_kubelet_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = driver(tmp_path, Claims(allocated("neurondevice1")))
    d.load()
    assert not isinstance((await d.prepare([REF]))[UID], str)
    assert UID in d.checkpoint.load()
    save = Checkpoint.save

    def full_disk(self: Checkpoint, claims: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Checkpoint, "save", full_disk)
    assert (await d.unprepare([REF]))[UID]  # an error: the kubelet retries
    monkeypatch.setattr(Checkpoint, "save", save)
    assert (await d.unprepare([REF])) == {UID: ""}
    assert d.checkpoint.load() == {}  # the retry took the claim out of the checkpoint
    # so a restart neither reports it prepared nor writes its CDI spec again
    again = driver(tmp_path, Claims())
    again.load()
    assert again.prepared == {}
    assert not (tmp_path / "cdi" / spec_file_name(UID)).exists()


async def test_a_claim_prepared_again_whose_write_failed_is_still_unprepared_from_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim in the checkpoint without a copy of its CDI spec (an older checkpoint, or one rebuilt
    from the specs) whose spec file is gone is prepared again; if that write fails, the claim is
    still in the checkpoint, so the kubelet's unprepare must take it out of there."""
    d = driver(tmp_path, Claims(allocated("neurondevice1")))
    d.load()
    assert not isinstance((await d.prepare([REF]))[UID], str)
    d.prepared[UID] = dataclasses.replace(d.prepared[UID], spec={})
    d.checkpoint.save(d.prepared)
    (tmp_path / "cdi" / spec_file_name(UID)).unlink()
    save = Checkpoint.save

    def full_disk(self: Checkpoint, claims: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Checkpoint, "save", full_disk)
    assert isinstance((await d.prepare([REF]))[UID], str)  # an error: the kubelet retries or gives up
    monkeypatch.setattr(Checkpoint, "save", save)
    assert (await d.unprepare([REF])) == {UID: ""}
    assert d.checkpoint.load() == {}


def share(name: str, uid: str, device: str, cores: int | None, pool: str = "node-a") -> dict[str, Any]:
    """Claim `name` allocated a share of `cores` cores of `device` (None: the whole device)."""
    result = {"request": "neuron", "driver": "neuron.aws.com", "pool": pool, "device": device, "shareID": uid}
    if cores is not None:
        result["consumedCapacity"] = {"cores": str(cores)}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


async def test_a_claim_gone_from_the_api_server_stops_holding_its_cores_once_they_refuse_another(
    tmp_path: Path,
) -> None:
    """An entry the kubelet never unprepared (its own state lost while the checkpoint survived) would
    hold its cores against every later claim: when they refuse one, the driver asks the API server about
    the holders and forgets those gone, recreated or allocated elsewhere; the rest keep their cores."""
    api = Claims(share("x", "u-x", "neurondevice0", 1), share("y", "u-y", "neurondevice0", 1))
    d = driver(tmp_path, api)  # trn1.32xlarge: 2 cores a device
    d.load()
    refs = {n: ClaimRef(f"u-{n}", "ns", n) for n in "xyzw"}
    prepared = await d.prepare([refs["x"], refs["y"]])
    assert [p.devices[0].cores for p in prepared.values() if not isinstance(p, str)] == [(0,), (1,)]
    # x is deleted without an unprepare; y is recreated (another UID): both are stale
    api.delete("x")
    api.put(share("y", "u-y2", "neurondevice3", None))
    api.put(share("z", "u-z", "neurondevice0", None))  # the whole device
    (answer,) = (await d.prepare([refs["z"]])).values()
    assert not isinstance(answer, str), answer
    assert set(d.checkpoint.load()) == {"u-z"}
    assert d.metrics.stale_claims_forgotten._value.get() == 2
    assert not (tmp_path / "cdi" / spec_file_name("u-x")).exists()


async def test_holders_still_allocated_here_or_not_asked_about_keep_their_cores(tmp_path: Path) -> None:
    api = Claims(share("x", "u-x", "neurondevice0", 1), share("y", "u-y", "neurondevice0", 1))
    d = driver(tmp_path, api)
    d.load()
    await d.prepare([ClaimRef("u-x", "ns", "x"), ClaimRef("u-y", "ns", "y")])
    api.put(share("w", "u-w", "neurondevice0", 1))
    (refused,) = (await d.prepare([ClaimRef("u-w", "ns", "w")])).values()
    assert isinstance(refused, str)
    assert "only 0 of the device's 2 are free" in refused
    # the API server down: nothing is known to be stale, so nothing is forgotten
    api.delete("x")
    api.down = True
    assert isinstance((await d.prepare([ClaimRef("u-w", "ns", "w")]))["u-w"], str)
    assert set(d.checkpoint.load()) == {"u-x", "u-y"}
    assert d.metrics.stale_claims_forgotten._value.get() == 0
    # back up: x is gone, so w gets its core; y, allocated here, keeps its own
    api.down = False
    (answer,) = (await d.prepare([ClaimRef("u-w", "ns", "w")])).values()
    assert not isinstance(answer, str)
    assert answer.devices[0].cores == (0,)
    assert set(d.checkpoint.load()) == {"u-y", "u-w"}
