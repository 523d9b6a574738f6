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

UID = "0d9f3c1e-1111-2222-3333-444455556666"
REF = ClaimRef(UID, "ns", "c")


class Claims:
    """The API server as the driver reads claims from it."""

    def __init__(self, *objs: dict[str, Any]) -> None:
        self.objs = {f"/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/{o['metadata']['name']}": o for o in objs}

    async def get(self, path: str) -> dict[str, Any]:
        return self.objs[path]


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
