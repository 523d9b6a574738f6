"""Preparing an allocated claim: what the container gets, and what is refused."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_driver import claims
from neuron_dra_driver.checkpoint import Checkpoint, CheckpointError, annotate, claims_from_specs

from neuron_driver import cdi
from neuron_driver.inventory import NodeInventory, scan
from neuron_sim import node as sim

UID = "0d9f3c1e-1111-2222-3333-444455556666"


@cache
def inventory(name: str, lnc: int | None = None) -> NodeInventory:
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="dra-claims-")) / "node"
    sim.create(root, name, lnc=lnc)
    return scan(root, env={})


def claim(*results: tuple[str, str], uid: str = UID, pool: str = "node-a", allocated: bool = True) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "c", "namespace": "ns", "uid": uid}, "status": {}}
    if allocated:
        obj["status"]["allocation"] = {
            "devices": {
                "results": [
                    {"request": request, "driver": "neuron.aws.com", "pool": pool, "device": device}
                    for request, device in results
                ]
                + [{"request": "gpu", "driver": "gpu.example.com", "pool": "x", "device": "gpu0"}]
            }
        }
    return obj


def prepare(obj: dict[str, Any], inv: NodeInventory, unhealthy: dict[int, str] | None = None) -> claims.PreparedClaim:
    return claims.prepare(obj, UID, "node-a", inv, unhealthy or {}, Path("/"))


def test_four_devices_get_their_nodes_and_every_core() -> None:
    inv = inventory("trn1.32xlarge")
    names = [f"neurondevice{d}" for d in (4, 5, 6, 7)]
    prepared = prepare(claim(*[("devs", n) for n in names]), inv)
    assert [d.device for d in prepared.devices] == names
    # one CDI device for the request, on its first device only
    assert [d.cdi_ids for d in prepared.devices] == [(f"neuron.aws.com/claim={UID}-devs",), (), (), ()]
    (device,) = prepared.spec["devices"]
    edits = device["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == [f"/dev/neuron{d}" for d in (4, 5, 6, 7)]
    assert edits["env"] == [
        "NEURON_LOGICAL_NC_CONFIG=1",
        "NEURON_RT_VISIBLE_CORES=" + ",".join(str(c) for d in (4, 5, 6, 7) for c in inv.device(d).logical_cores),  # type: ignore[union-attr]
    ]
    assert prepared.spec["kind"] == "neuron.aws.com/claim"


def test_cores_get_exactly_those_cores_and_their_devices_nodes() -> None:
    inv = inventory("inf2.48xlarge")
    prepared = prepare(claim(("c", "neuroncore1"), ("c", "neuroncore2"), ("c", "neuroncore3")), inv)
    (device,) = prepared.spec["devices"]
    assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == ["/dev/neuron0", "/dev/neuron1"]
    assert "NEURON_RT_VISIBLE_CORES=1,2,3" in device["containerEdits"]["env"]


def test_each_request_is_its_own_cdi_device() -> None:
    prepared = prepare(claim(("a", "neurondevice0"), ("b", "neuroncore8")), inventory("trn2.48xlarge"))
    assert [d["name"] for d in prepared.spec["devices"]] == [f"{UID}-a", f"{UID}-b"]
    assert all(d.cdi_ids for d in prepared.devices)


def test_lnc_is_the_nodes_setting() -> None:
    prepared = prepare(claim(("c", "neurondevice0")), inventory("trn2.48xlarge", 1))
    assert "NEURON_LOGICAL_NC_CONFIG=1" in prepared.spec["devices"][0]["containerEdits"]["env"]


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (claim(("c", "neurondevice0"), allocated=False), "not allocated"),
        (claim(("c", "neurondevice0"), uid="other"), "UID"),
        (claim(("c", "neurondevice0"), pool="node-b"), "pool 'node-b'"),
        (claim(("c", "neurondevice16")), "no such Neuron device"),
        (claim(("c", "neuroncore999")), "no such NeuronCore"),
        (claim(("c", "gpu0")), "not a Neuron device"),
    ],
)
def test_refusals_say_why(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(claims.ClaimRefused, match=message):
        prepare(obj, inventory("trn1.32xlarge"))


def test_unhealthy_devices_refused_with_the_reason() -> None:
    obj = claim(("c", "neurondevice2"), ("c", "neuroncore30"))
    with pytest.raises(claims.ClaimRefused, match=r"neuron2: counter mem_ecc_uncorrected.*neuron15: gone"):
        prepare(obj, inventory("trn1.32xlarge"), {2: "counter mem_ecc_uncorrected +1", 15: "gone", 3: "x"})


def test_device_names_round_trip() -> None:
    from neuron_dra_driver import slices

    assert slices.parse_device_name(slices.device_name(12)) == ("neuron_device", 12)
    assert slices.parse_device_name(slices.core_name(0)) == ("neuron_core", 0)
    for bad in ("neurondevice", "neuroncore01", "neurondevice-1", "gpu0", "neurondevice1x"):
        assert slices.parse_device_name(bad) is None


def test_checkpoint_round_trip_and_atomic(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "p" / "checkpoint.json")
    assert cp.load() == {}
    prepared = prepare(claim(("c", "neurondevice1")), inventory("trn1.32xlarge"))
    cp.save({UID: prepared})
    assert cp.load() == {UID: prepared}
    assert sorted(p.name for p in cp.path.parent.iterdir()) == ["checkpoint.json"]


@pytest.mark.parametrize("text", ["", "{", "[]", '{"version": 9, "claims": []}', '{"version": 1, "claims": [{}]}'])
def test_corrupt_checkpoint_is_a_clear_error(tmp_path: Path, text: str) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.path.write_text(text)
    with pytest.raises(CheckpointError, match=r"checkpoint\.json"):
        cp.load()


def test_corrupt_checkpoint_recovered_from_the_cdi_specs(tmp_path: Path) -> None:
    inv = inventory("trn1.32xlarge")
    prepared = prepare(claim(("c", "neurondevice1")), inv)
    cdi.write_spec(tmp_path / "cdi", claims.spec_file_name(UID), annotate(dict(prepared.spec), prepared))
    cdi.write_spec(tmp_path / "cdi", "unrelated.json", {"kind": "x/y"})
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.path.write_text("{not json")
    recovered, problem = cp.recover(tmp_path / "cdi")
    assert recovered == {UID: prepared}
    assert "recovered from CDI specs" in problem
    assert cp.load() == recovered  # a good checkpoint again
    assert [p.name for p in tmp_path.glob("checkpoint.json.corrupt-*")]  # the bad one is kept
    assert claims_from_specs(tmp_path / "missing") == {}
