"""Preparing an allocated claim: what the container gets, and what is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sim_nodes
from neuron_dra_driver import claims
from neuron_dra_driver.checkpoint import (
    CHECKPOINT_ANNOTATION,
    Checkpoint,
    CheckpointError,
    annotate,
    claims_from_specs,
)

from neuron_driver import cdi
from neuron_driver.inventory import NodeInventory, scan
from neuron_model.ultraserver import Mode, State, UltraServerReading
from neuron_sim import node as sim

UID = "0d9f3c1e-1111-2222-3333-444455556666"


def inventory(name: str, lnc: int | None = None) -> NodeInventory:
    return sim_nodes.inventory(name, lnc)  # written once a run, shared with other modules


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
    return claims.prepare(obj, UID, "node-a", inv, unhealthy or {}, Path("/"), None, inv.ultraserver)


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


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        '{"version": 9, "claims": []}',
        '{"version": 1, "claims": [{}]}',
        '{"version": 1, "claims": [null]}',
        '{"version": 1, "claims": {"a": {}}}',
    ],
)
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


def test_a_cdi_spec_whose_annotation_is_not_a_claim_is_skipped(tmp_path: Path) -> None:
    for i, recorded in enumerate(("[]", "null", '"x"')):
        spec = {"kind": claims.CLAIM_KIND, "annotations": {CHECKPOINT_ANNOTATION: recorded}}
        cdi.write_spec(tmp_path, claims.spec_file_name(f"{UID}{i}"), spec)
    assert claims_from_specs(tmp_path) == {}


def test_checkpoint_keeps_each_claims_cdi_spec(tmp_path: Path) -> None:
    """A reboot empties /var/run/cdi: the checkpoint must be able to write the spec again."""
    cp = Checkpoint(tmp_path / "checkpoint.json")
    prepared = prepare(claim(("c", "neurondevice1")), inventory("trn1.32xlarge"))
    cp.save({UID: prepared})
    assert cp.load()[UID].spec == prepared.spec
    assert prepared.spec


# --- AWS's opaque NeuronConfig ---------------------------------------------------------------


def configured(obj: dict[str, Any], *configs: tuple[dict[str, Any], list[str] | None, str]) -> dict[str, Any]:
    """`obj` with opaque configs (parameters, requests or None for all, source) in its allocation."""
    obj["status"]["allocation"]["devices"]["config"] = [
        {"source": source, **({"requests": requests} if requests else {}),
         "opaque": {"driver": "neuron.aws.com", "parameters": parameters}}
        for parameters, requests, source in configs
    ]  # fmt: skip
    return obj


def lnc(value: object, api_version: str = "neuron.aws.com/v1", **more: object) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "NeuronConfig", "logicalNeuronCore": value, **more}


def ultra(nodes: object, **more: object) -> dict[str, Any]:
    return {"apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig", "ultraserverMode": nodes, **more}


def env_of(prepared: claims.PreparedClaim, index: int = 0) -> dict[str, str]:
    pairs = prepared.spec["devices"][index]["containerEdits"]["env"]
    return dict(p.split("=", 1) for p in pairs)


def test_aws_neuron_config_sets_the_claims_logical_core_setting_on_a_whole_device() -> None:
    # AWS's all-neurons-lnc-1 on a trn2 node at its default LNC 2: the device's 8 physical cores
    inv = inventory("trn2.48xlarge")
    assert inv.lnc.value == 2
    prepared = prepare(configured(claim(("c", "neurondevice1")), (lnc(1), None, "FromClaim")), inv)
    assert env_of(prepared) == {"NEURON_LOGICAL_NC_CONFIG": "1", "NEURON_RT_VISIBLE_CORES": "8,9,10,11,12,13,14,15"}
    # without the config, the node's setting: 4 logical cores
    plain = prepare(claim(("c", "neurondevice1")), inv)
    assert env_of(plain) == {"NEURON_LOGICAL_NC_CONFIG": "2", "NEURON_RT_VISIBLE_CORES": "4,5,6,7"}


def test_neuron_config_regroups_single_cores() -> None:
    # LNC 2 node, logical core 5 = device 1's physical cores 2 and 3 -> at LNC 1: 8+2, 8+3
    at2 = inventory("trn2.48xlarge")
    prepared = prepare(configured(claim(("c", "neuroncore5")), (lnc(1), None, "FromClaim")), at2)
    assert env_of(prepared)["NEURON_RT_VISIBLE_CORES"] == "10,11"
    # LNC 1 node, cores 2 and 3 (a pair) -> at LNC 2: logical core 1
    at1 = inventory("trn2.48xlarge", 1)
    pair = prepare(configured(claim(("c", "neuroncore2"), ("c", "neuroncore3")), (lnc(2), None, "FromClaim")), at1)
    assert env_of(pair) == {"NEURON_LOGICAL_NC_CONFIG": "2", "NEURON_RT_VISIBLE_CORES": "1"}
    # the earlier beta group is accepted as well
    beta = configured(claim(("c", "neurondevice0")), (lnc(1, "neuron.aws.com/v1alphav1"), None, "FromClass"))
    assert env_of(prepare(beta, at2))["NEURON_LOGICAL_NC_CONFIG"] == "1"


def test_the_claims_config_wins_over_its_class_and_applies_only_to_the_requests_it_names() -> None:
    inv = inventory("trn2.48xlarge")
    obj = configured(
        claim(("a", "neurondevice0"), ("b", "neurondevice1")),
        (lnc(2), None, "FromClass"),
        (lnc(1), ["a"], "FromClaim"),
    )
    prepared = prepare(obj, inv)
    assert env_of(prepared, 0)["NEURON_LOGICAL_NC_CONFIG"] == "1"  # request a: the claim's own
    assert env_of(prepared, 1)["NEURON_LOGICAL_NC_CONFIG"] == "2"  # request b: the class's
    other_driver = claim(("c", "neurondevice0"))
    other_driver["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "opaque": {"driver": "gpu.example.com", "parameters": {"anything": True}}}
    ]
    assert env_of(prepare(other_driver, inv))["NEURON_LOGICAL_NC_CONFIG"] == "2"


@pytest.mark.parametrize(
    ("instance", "node_lnc", "results", "parameters", "message"),
    [
        ("trn2.48xlarge", None, [("c", "neurondevice0")], lnc(3), r"logicalNeuronCore must be 1 or 2, not 3"),
        ("trn2.48xlarge", None, [("c", "neurondevice0")], lnc("1"), r"logicalNeuronCore must be 1 or 2, not '1'"),
        ("trn2.48xlarge", None, [("c", "neurondevice0")], lnc(1, "example.com/v1"), r"apiVersion 'example.com/v1'"),
        ("trn2.48xlarge", None, [("c", "neurondevice0")], {**lnc(1), "kind": "GpuConfig"}, r"kind 'GpuConfig'"),
        ("trn2.48xlarge", None, [("c", "neurondevice0")], lnc(1, lnc2=True), r"unknown field\(s\) lnc2"),
        ("trn2.48xlarge", None, [("c", "neurondevice0")], "lnc=1", r"parameters must be an object"),
        (
            "trn2.48xlarge", None, [("c", "neurondevice0")], ultra(4),
            r"ultraserverMode 4: this node's UltraServer identity is none: it is not an UltraServer node",
        ),
        ("trn2u.48xlarge", None, [("c", "neurondevice0")], ultra(3), r"ultraserverMode must be 2 or 4, not 3"),
        ("trn2u.48xlarge", None, [("c", "neurondevice0")], ultra(4, size=4), r"unknown field\(s\) size for Ultra"),
        ("trn2u.48xlarge", None, [("c", "neurondevice0")], {**ultra(4), "kind": ["x"]}, r"kind \['x'\] is not"),
        ("trn1.32xlarge", None, [("c", "neurondevice0")], lnc(2), r"logicalNeuronCore 2 is not supported on trn1"),
        ("trn2.48xlarge", 1, [("c", "neuroncore1")], lnc(2), r"split a logical core \(physical cores \[0, 1\]"),
    ],
)  # fmt: skip
def test_an_invalid_neuron_config_is_refused_naming_the_field(
    instance: str, node_lnc: int | None, results: list[tuple[str, str]], parameters: object, message: str
) -> None:
    obj = configured(claim(*results), (parameters, None, "FromClaim"))  # type: ignore[arg-type]
    with pytest.raises(claims.ClaimRefused, match=message):
        prepare(obj, inventory(instance, node_lnc))


def test_a_tainted_device_is_prepared_only_for_a_claim_that_tolerates_its_taint() -> None:
    from neuron_dra_driver.slices import Taint

    inv = inventory("trn1.32xlarge")
    taint = Taint("NC_UNCORRECTABLE_ERROR")
    unhealthy = {2: "kernel NC_UNCORRECTABLE_ERROR"}
    plain = claim(("c", "neurondevice2"))
    with pytest.raises(claims.ClaimRefused, match="neuron2: kernel NC_UNCORRECTABLE_ERROR"):
        claims.prepare(plain, UID, "node-a", inv, unhealthy, Path("/"), {2: taint})
    tolerant = claim(("c", "neurondevice2"), ("c", "neuroncore5"))
    for result in tolerant["status"]["allocation"]["devices"]["results"]:
        result["tolerations"] = [{"key": "neuron.aws.com/unhealthy", "operator": "Exists"}]
    prepared = claims.prepare(tolerant, UID, "node-a", inv, unhealthy, Path("/"), {2: taint})
    assert [d.device for d in prepared.devices] == ["neurondevice2", "neuroncore5"]
    # an unhealthy device with no taint (taints off) is refused whatever the claim tolerates
    with pytest.raises(claims.ClaimRefused, match="unhealthy"):
        claims.prepare(tolerant, UID, "node-a", inv, unhealthy, Path("/"))


# --- UltraServerConfig (issue 26 item 3) ----------------------------------------------------------------------

US = "00c0ffee12345678"


def ultraserver_node(tmp_path: Path, node_id: int, nodes: int = 4) -> NodeInventory:
    (root,) = sim.create_ultraserver(tmp_path, "trn2u.48xlarge", nodes=nodes, server_id=US, node_ids=[node_id])
    return scan(root, env={})


def test_ultraserver_config_gives_the_runtime_the_nodes_group_of_that_size(tmp_path: Path) -> None:
    """AWS's us-and-lnc-config idea: UltraServerConfig and NeuronConfig on one request, each setting its own."""
    inv = ultraserver_node(tmp_path, 3)
    both = configured(claim(("c", "neurondevice0")), (ultra(4), None, "FromClaim"), (lnc(1), None, "FromClaim"))
    env = env_of(prepare(both, inv))
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "1"
    assert {k: v for k, v in env.items() if "ULTRASERVER" in k} == {
        "NEURON_RT_ULTRASERVER_MODE": "1",  # X4
        "NEURON_RT_ULTRASERVER_SERVER_ID": US,
        "NEURON_RT_ULTRASERVER_NODE_ID": "3",
    }
    pair = env_of(prepare(configured(claim(("c", "neurondevice0")), (ultra(2), None, "FromClaim")), inv))
    # the driver's 2-node ids follow X2H where supported: 4-node id 3 is node 1 of the pair {1, 3}
    assert pair["NEURON_RT_ULTRASERVER_MODE"] == "2"
    assert pair["NEURON_RT_ULTRASERVER_NODE_ID"] == "1"
    assert pair["NEURON_RT_ULTRASERVER_SERVER_ID"] == sim.pair_server_id(US, Mode.X2H, 1)
    plain = env_of(prepare(claim(("c", "neurondevice0")), inv))
    assert not [k for k in plain if "ULTRASERVER" in k]  # no config, no UltraServer variables


def test_ultraserver_config_is_refused_while_the_identity_is_pending_or_the_group_missing(tmp_path: Path) -> None:
    inv = ultraserver_node(tmp_path, 0, nodes=2)
    four = configured(claim(("c", "neurondevice0")), (ultra(4), None, "FromClaim"))
    with pytest.raises(claims.ClaimRefused, match=r"this node is in no group of 4 nodes"):
        prepare(four, inv)
    pending = UltraServerReading(State.PENDING, reason="ultraserver_mode: busy")
    two = configured(claim(("c", "neurondevice0")), (ultra(2), None, "FromClaim"))
    with pytest.raises(claims.ClaimRefused, match=r"is not known yet .*ultraserver_mode: busy"):
        claims.prepare(two, UID, "node-a", inv, {}, Path("/"), None, pending)
    assert (
        env_of(claims.prepare(two, UID, "node-a", inv, {}, Path("/"), None, inv.ultraserver))[
            "NEURON_RT_ULTRASERVER_SERVER_ID"
        ]
        == US
    )  # a 2-node UltraServer's pair is the whole UltraServer


def test_the_whole_node_device_gets_every_device_and_the_ultraserver_variables(tmp_path: Path) -> None:
    """AWS's trn2u template: one `neuron_node` device with UltraServerConfig mode 4 gives the
    container every device of the node, every core, and the node's identity in its group of 4."""
    inv = ultraserver_node(tmp_path, 2)
    obj = configured(claim(("neurons", "neuronnode")), (ultra(4), ["neurons"], "FromClaim"))
    prepared = prepare(obj, inv)
    (device,) = prepared.spec["devices"]
    assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == [f"/dev/neuron{d}" for d in range(16)]
    env = env_of(prepared)
    assert env["NEURON_RT_VISIBLE_CORES"] == ",".join(str(c.index) for c in inv.cores)
    assert (env["NEURON_RT_ULTRASERVER_MODE"], env["NEURON_RT_ULTRASERVER_NODE_ID"]) == ("1", "2")
    assert env["NEURON_RT_ULTRASERVER_SERVER_ID"] == US
    with pytest.raises(claims.ClaimRefused, match="unhealthy: neuron5: HBM_UNCORRECTABLE_ERROR"):
        prepare(obj, inv, {5: "HBM_UNCORRECTABLE_ERROR"})
    with pytest.raises(claims.ClaimRefused, match="not an UltraServer node"):
        prepare(claim(("c", "neuronnode")), inventory("trn2.48xlarge"))


def test_a_trainium3_whole_node_claim_gets_its_reservation_as_the_4_node_group(tmp_path: Path) -> None:
    """trn3.48xlarge (PDS): AWS's whole-node template gives every device and the reservation's identity;
    a 2-node UltraServerConfig is refused (a reservation groups node_cnt = 4 nodes)."""
    inv = scan(sim.create_ultraserver(tmp_path, "trn3.48xlarge", server_id=US, node_ids=[1])[0], env={})
    obj = configured(claim(("neurons", "neuronnode")), (ultra(4), ["neurons"], "FromClaim"))
    prepared = prepare(obj, inv)
    (device,) = prepared.spec["devices"]
    assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == [f"/dev/neuron{d}" for d in range(16)]
    env = env_of(prepared)
    assert {k: v for k, v in env.items() if "ULTRASERVER" in k} == {
        "NEURON_RT_ULTRASERVER_MODE": "1",
        "NEURON_RT_ULTRASERVER_SERVER_ID": US,
        "NEURON_RT_ULTRASERVER_NODE_ID": "1",
    }
    with pytest.raises(claims.ClaimRefused, match=r"this node is in no group of 2 nodes"):
        prepare(configured(claim(("c", "neurondevice0")), (ultra(2), None, "FromClaim")), inv)


# --- cores as consumable capacity: the driver picks a share's cores --------------------------


def shares(*results: tuple[str, str, str | None], uid: str = UID) -> dict[str, Any]:
    """A claim allocated shares of devices: (request, device, cores consumed or None for no capacity)."""
    obj = claim(uid=uid)
    obj["status"]["allocation"]["devices"]["results"] = [
        {"request": request, "driver": "neuron.aws.com", "pool": "node-a", "device": device, "shareID": f"s{i}"}
        | ({"consumedCapacity": {"cores": cores}} if cores is not None else {})
        for i, (request, device, cores) in enumerate(results)
    ]
    return obj


def prepare_held(obj: dict[str, Any], inv: NodeInventory, held: set[int], uid: str = UID) -> claims.PreparedClaim:
    return claims.prepare(obj, uid, "node-a", inv, {}, Path("/"), None, inv.ultraserver, held=held)


def test_a_share_gets_the_lowest_cores_of_its_device_that_no_other_claim_holds() -> None:
    inv = inventory("trn2.48xlarge", 1)  # 8 logical cores a device
    first = prepare_held(shares(("c", "neurondevice3", "3")), inv, set())
    assert env_of(first)["NEURON_RT_VISIBLE_CORES"] == "24,25,26"
    assert first.devices[0].cores == (24, 25, 26)
    held = claims.held_cores([first], inv)
    second = prepare_held(shares(("c", "neurondevice3", "5"), uid="u2"), inv, held, uid="u2")
    assert env_of(second)["NEURON_RT_VISIBLE_CORES"] == "27,28,29,30,31"
    (device,) = second.spec["devices"]
    assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == ["/dev/neuron3"]
    # the device is full now: a third share is refused, saying why, not given a held core
    with pytest.raises(claims.ClaimRefused, match=r"neurondevice3: the claim's share is 1 core\(s\) but only 0 of"):
        prepare_held(shares(("c", "neurondevice3", "1"), uid="u3"), inv, claims.held_cores([first, second], inv), "u3")


def test_a_result_consuming_all_of_a_device_or_no_capacity_is_the_whole_device() -> None:
    inv = inventory("trn2.48xlarge", 1)
    for cores in ("8", None):
        prepared = prepare_held(shares(("c", "neurondevice0", cores)), inv, set())
        assert env_of(prepared)["NEURON_RT_VISIBLE_CORES"] == "0,1,2,3,4,5,6,7"
        assert prepared.devices[0].cores == ()


def test_two_shares_of_one_claim_on_the_same_device_get_different_cores() -> None:
    inv = inventory("inf2.48xlarge")  # 2 cores a device
    prepared = prepare_held(shares(("a", "neurondevice5", "1"), ("b", "neurondevice5", "1")), inv, set())
    assert [d.cores for d in prepared.devices] == [(10,), (11,)]


@pytest.mark.parametrize(
    ("cores", "message"),
    [("two", r"cores='two' is not a whole number"), ("0", r"cores=0, the device has 8"), ("9", r"cores=9")],
)
def test_a_malformed_consumed_capacity_is_refused_saying_so(cores: str, message: str) -> None:
    with pytest.raises(claims.ClaimRefused, match=message):
        prepare_held(shares(("c", "neurondevice1", cores)), inventory("trn2.48xlarge", 1), set())


def test_held_cores_count_every_kind_of_holding_and_survive_the_checkpoint(tmp_path: Path) -> None:
    inv = inventory("inf2.48xlarge")
    whole = prepare(claim(("c", "neurondevice0")), inv)
    core = claims.prepare(claim(("c", "neuroncore5"), uid="u2"), "u2", "node-a", inv, {}, Path("/"))
    share = prepare_held(shares(("c", "neurondevice4", "1"), uid="u3"), inv, set(), uid="u3")
    arc = claims.prepare(claim(("c", "neurongroup2-10"), uid="u4"), "u4", "node-a", inv, {}, Path("/"))
    assert claims.held_cores([whole, core, share, arc], inv) == {0, 1, 5, 8, 20, 21, 22, 23}
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.save({"u3": share})
    assert cp.load()["u3"].devices[0].cores == (8,)
    # a checkpoint written before shares existed has no "cores": it reads as before
    raw = share.to_json()
    del raw["devices"][0]["cores"]
    assert claims.PreparedClaim.from_json(raw).devices[0].cores == ()


def test_a_whole_device_core_or_arc_overlapping_another_claims_share_is_refused_saying_to_drain() -> None:
    """The scheduler does not count shares allocated before the layout changed (coresAsCapacity turned
    off, or auto across 1.36 -> 1.37): a claim then given the same silicon is refused, not prepared."""
    inv = inventory("inf2.48xlarge")  # 2 cores a device
    share = prepare_held(shares(("c", "neurondevice1", "1")), inv, set())
    assert share.devices[0].cores == (2,)
    shared = claims.share_cores([share])
    for obj, name in (
        (claim(("c", "neurondevice1"), uid="u2"), "neurondevice1"),
        (claim(("c", "neuroncore2"), uid="u2"), "neuroncore2"),
        (claim(("c", "neurongroup2-0"), uid="u2"), "neurongroup2-0"),
    ):
        with pytest.raises(claims.ClaimRefused, match=rf"{name}: cores 2 are held by another claim's share.*drain"):
            claims.prepare(obj, "u2", "node-a", inv, {}, Path("/"), shared=shared)
    # the other core of the device is free of shares: a claim for it is prepared
    other = claims.prepare(claim(("c", "neuroncore3"), uid="u2"), "u2", "node-a", inv, {}, Path("/"), shared=shared)
    assert env_of(other)["NEURON_RT_VISIBLE_CORES"] == "3"


def lnc2(obj: dict[str, Any]) -> dict[str, Any]:
    return configured(obj, (lnc(2), None, "FromClaim"))


def test_a_share_counted_in_a_larger_logical_core_gets_aligned_pairs_and_an_odd_one_is_refused() -> None:
    """At node LNC 1 a request with logicalNeuronCore 2 needs physical pairs: core 0 held leaves (2,3),
    not (1,2), which would split a logical core with the claim holding 0."""
    inv = inventory("trn2.48xlarge", 1)
    first = prepare_held(shares(("c", "neurondevice0", "1")), inv, set())
    assert first.devices[0].cores == (0,)
    second = prepare_held(
        lnc2(shares(("c", "neurondevice0", "2"), uid="u2")), inv, claims.held_cores([first], inv), "u2"
    )
    assert second.devices[0].cores == (2, 3)
    assert env_of(second) == {"NEURON_RT_VISIBLE_CORES": "1", "NEURON_LOGICAL_NC_CONFIG": "2"}
    with pytest.raises(claims.ClaimRefused, match=r"neurondevice0: a share of 3 core\(s\).*multiple of 2 cores"):
        prepare_held(lnc2(shares(("c", "neurondevice0", "3"), uid="u3")), inv, set(), "u3")


def test_admin_access_is_held_to_nothing_and_holds_nothing() -> None:
    """The scheduler counts an adminAccess result against nothing: an admin's pod reaches a device full
    of shares, and while it runs the device's shares are still prepared."""
    inv = inventory("inf2.48xlarge")  # 2 cores a device
    a = prepare_held(shares(("c", "neurondevice1", "1")), inv, set())
    b = prepare_held(shares(("c", "neurondevice1", "1"), uid="u2"), inv, claims.held_cores([a], inv), "u2")
    admin_share, admin_whole = shares(("c", "neurondevice1", "1"), uid="u3"), claim(("c", "neurondevice1"), uid="u4")
    for obj in (admin_share, admin_whole):
        obj["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    held, shared = claims.held_cores([a, b], inv), claims.share_cores([a, b])
    assert prepare_held(admin_share, inv, held, uid="u3").devices[0].cores == (2,)
    watcher = claims.prepare(admin_whole, "u4", "node-a", inv, {}, Path("/"), held=held, shared=shared)
    assert env_of(watcher)["NEURON_RT_VISIBLE_CORES"] == "2,3"
    assert watcher.devices[0].admin_access
    assert claims.held_cores([watcher], inv) == set()
    assert claims.share_cores([watcher]) == set()
    assert claims.PreparedClaim.from_json(watcher.to_json()).devices[0].admin_access


def test_a_share_prepared_again_keeps_its_cores_while_they_are_free() -> None:
    """A running container's cores were fixed when it started: preparing its claim again (its CDI spec
    lost) must not move it onto cores the next claim would then be given."""
    inv = inventory("trn1.32xlarge")  # 2 cores a device
    known = prepare_held(shares(("c", "neurondevice0", "1")), inv, {0})
    assert known.devices[0].cores == (1,)
    kept = {d.share_key(): d.cores for d in known.devices}
    again = claims.prepare(shares(("c", "neurondevice0", "1")), UID, "node-a", inv, {}, Path("/"), kept=kept)
    assert again.devices[0].cores == (1,)
    # its old cores taken by now: it gets free ones rather than a held core
    moved = claims.prepare(shares(("c", "neurondevice0", "1")), UID, "node-a", inv, {}, Path("/"), held={1}, kept=kept)
    assert moved.devices[0].cores == (0,)


def test_the_share_id_is_kept_through_the_checkpoint() -> None:
    prepared = prepare_held(shares(("c", "neurondevice0", "1")), inventory("inf2.48xlarge"), set())
    assert prepared.devices[0].share_id == "s0"
    assert claims.PreparedClaim.from_json(prepared.to_json()).devices[0].share_id == "s0"
