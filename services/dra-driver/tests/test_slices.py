"""The ResourceSlices, over every instance type and logical-core setting in the table."""

from __future__ import annotations

import re
from dataclasses import replace
from itertools import combinations
from pathlib import Path

import pytest
import sim_nodes
from hypothesis import given, settings
from hypothesis import strategies as st
from neuron_dra_driver import slices

from neuron_driver.inventory import NodeInventory, scan, topology_from
from neuron_model import resources
from neuron_model.instance_types import GIB, INSTANCE_TYPES, TopologyKind
from neuron_model.placement_labels import ATTRIBUTE_OF_LABEL, placement_attributes
from neuron_model.ultraserver import State, UltraServerReading
from neuron_sim import node as sim

SETTINGS = [(name, lnc) for name, it in INSTANCE_TYPES.items() for lnc in it.family.supported_lnc]
IDS = [f"{name}-lnc{lnc}" for name, lnc in SETTINGS]
QUALIFIED = re.compile(r"^(?:[a-z0-9.-]{1,63}/)?[A-Za-z_][A-Za-z0-9_]{0,31}$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def inventory(name: str, lnc: int) -> NodeInventory:
    return sim_nodes.inventory(name, lnc)  # written once a run, shared with other modules


def model(name: str, lnc: int, unhealthy: frozenset[int] = frozenset(), **kw: object) -> slices.NodeDevices:
    return slices.NodeDevices("node-a", inventory(name, lnc), unhealthy, **kw)  # type: ignore[arg-type]


def all_devices(objs: list[dict], groups: bool = False) -> list[dict]:  # type: ignore[type-arg]
    """The devices and cores published (and the ring arcs and the whole node, with `groups`)."""
    return [
        d
        for s in objs
        for d in s["spec"].get("devices") or []
        if groups or d["attributes"]["resourceType"]["string"] not in (slices.GROUP_KIND, slices.NODE_KIND)
    ]


@pytest.mark.parametrize(("name", "lnc"), SETTINGS, ids=IDS)
def test_one_device_per_neuron_device_and_one_per_core(name: str, lnc: int) -> None:
    inv = inventory(name, lnc)
    listed = all_devices(slices.build(model(name, lnc), 1))
    names = [d["name"] for d in listed]
    assert names == [f"neurondevice{d.index}" for d in inv.devices] + [f"neuroncore{c.index}" for c in inv.cores]
    for d in listed[: len(inv.devices)]:
        a = d["attributes"]
        assert a["resourceType"] == {"string": "neuron_device"}
        assert a["instanceType"] == {"string": name}
        assert a["logicalNeuronCore"] == {"int": lnc}
        assert a["coreCount"] == {"int": len(inv.device(a["deviceId"]["int"]).logical_cores)}  # type: ignore[union-attr]
        # the HBM as a whole-GiB attribute, never a capacity the allocator checks for every candidate
        assert a[slices.MEMORY_ATTRIBUTE]["int"] * GIB == INSTANCE_TYPES[name].memory_bytes_per_device
        assert "capacity" not in d
    for d in listed[len(inv.devices) :]:
        core = inv.core(d["attributes"]["coreId"]["int"])
        assert core is not None
        assert d["attributes"]["deviceId"] == {"int": core.device}
        assert d["attributes"]["resourceType"] == {"string": "neuron_core"}


@pytest.mark.parametrize(("name", "lnc"), SETTINGS, ids=IDS)
def test_within_the_api_limits(name: str, lnc: int) -> None:
    objs = slices.build(model(name, lnc, driver_version="2.24.7.0"), 3)
    assert len({s["metadata"]["name"] for s in objs}) == len(objs)
    for s in objs:
        spec = s["spec"]
        assert spec["pool"] == {"name": "node-a", "generation": 3, "resourceSliceCount": len(objs)}
        assert spec["nodeName"] == "node-a"
        assert spec["driver"] == "neuron.aws.com"
        assert ("devices" in spec) != ("sharedCounters" in spec)
        assert len(spec.get("devices", [])) <= 64
        assert len(spec.get("sharedCounters", [])) <= 8
        for counter_set in spec.get("sharedCounters", []):
            assert DNS_LABEL.match(counter_set["name"])
            assert len(counter_set["counters"]) <= 32
            assert all(DNS_LABEL.match(c) for c in counter_set["counters"])
        for d in spec.get("devices", []):
            assert DNS_LABEL.match(d["name"])
            assert len(d["attributes"]) + len(d.get("capacity", {})) <= 32
            assert all(QUALIFIED.match(k) for k in d["attributes"])
            assert all(len(v["string"]) <= 64 for v in d["attributes"].values() if "string" in v)
            assert len(d.get("consumesCounters", [])) <= 2


@pytest.mark.parametrize(("name", "lnc"), SETTINGS, ids=IDS)
def test_every_group_id_names_a_valid_connected_group(name: str, lnc: int) -> None:
    inv = inventory(name, lnc)
    topo = topology_from(inv)
    listed = all_devices(slices.build(model(name, lnc), 1))
    if topo.kind is TopologyKind.SWITCH:
        return  # test_a_switch_publishes_one_group_per_size_that_any_k_devices_satisfy
    for size in topo.group_sizes:
        attribute = slices.group_attribute(size)
        for kind in ("neuron_device", "neuron_core"):
            members: dict[str, set[int]] = {}
            for d in listed:
                if d["attributes"]["resourceType"]["string"] == kind and attribute in d["attributes"]:
                    members.setdefault(d["attributes"][attribute]["string"], set()).add(
                        d["attributes"]["deviceId"]["int"]
                    )
            for group in members.values():
                assert len(group) == size
                assert frozenset(group) in topo.groups(size)
                assert topo.connected(sum(1 << d for d in group))
            if topo.kind is TopologyKind.RING:
                # the arcs that do not overlap: one per k devices, the remainder unreachable
                assert len(members) == topo.device_count // size
            else:
                # the torus' groups of one size partition the devices: every one is reachable
                assert len(members) == len(topo.groups(size))
    # no group size the topology does not have is published
    published = {k for d in listed for k in d["attributes"] if k.startswith(slices.GROUP_DOMAIN)}
    assert published == {slices.group_attribute(s) for s in topo.group_sizes}


@pytest.mark.parametrize("name", sorted(n for n, it in INSTANCE_TYPES.items() if it.topology is TopologyKind.SWITCH))
def test_a_switch_publishes_one_group_per_size_that_any_k_devices_satisfy(name: str) -> None:
    """Trainium3: every set of devices is connected, so matchAttribute on devicegroup<k>_id must let
    any k devices through: one id per size >= 2 shared by every device, each device its own of size 1;
    the sizes AWS's driver names on trn (powers of two up to the node, and the node), no arcs."""
    inv = inventory(name, 2)
    topo = topology_from(inv)
    n = topo.device_count
    listed = all_devices(slices.build(model(name, 2), 1))
    sizes = sorted({n, *(k for k in (1, 2, 4, 8, 16, 32) if k <= n)})
    published = {k for d in listed for k in d["attributes"] if k.startswith(slices.GROUP_DOMAIN)}
    assert published == {slices.group_attribute(s) for s in sizes}
    assert {d["attributes"]["resourceType"]["string"] for d in listed} <= {
        "neuron_device",
        "neuron_core",
        "neuron_node",
    }
    for kind in ("neuron_device", "neuron_core"):
        of_kind = [d["attributes"] for d in listed if d["attributes"]["resourceType"]["string"] == kind]
        assert {a["deviceId"]["int"] for a in of_kind} == set(range(n))
        for a in of_kind:
            assert a[slices.group_attribute(1)] == {"string": str(a["deviceId"]["int"])}
        for size in sizes[1:]:
            assert {a[slices.group_attribute(size)]["string"] for a in of_kind} == {"0"}
            # the scheduler may pick any `size` of them: all are connected on the switch
            assert all(topo.connected(sum(1 << d for d in group)) for group in combinations(range(n), size))
    assert not [d for d in listed if d["attributes"]["resourceType"]["string"] == "neuron_device_group"]


def test_torus_publishes_the_aws_driver_names() -> None:
    listed = all_devices(slices.build(model("trn1.32xlarge", 1), 1))
    assert {k for k in listed[0]["attributes"] if k.startswith("resource.aws.com/")} == {
        f"resource.aws.com/devicegroup{k}_id" for k in (1, 4, 8, 16)
    }


@pytest.mark.parametrize(("name", "lnc"), SETTINGS, ids=IDS)
def test_counters_keep_a_device_and_its_cores_apart(name: str, lnc: int) -> None:
    inv = inventory(name, lnc)
    objs = slices.build(model(name, lnc), 1)
    available = {
        (cs["name"], counter): int(v["value"])
        for s in objs
        for cs in s["spec"].get("sharedCounters", [])
        for counter, v in cs["counters"].items()
    }
    consumed_by_cores: dict[tuple[str, str], int] = {}
    for d in all_devices(objs):
        (consumption,) = d["consumesCounters"]
        ((counter, value),) = consumption["counters"].items()
        key = (consumption["counterSet"], counter)
        assert key in available
        if d["attributes"]["resourceType"]["string"] == "neuron_device":
            assert int(value["value"]) == available[key]  # a whole device takes every core
            assert counter == d["name"]
        else:
            consumed_by_cores[key] = consumed_by_cores.get(key, 0) + int(value["value"])
    assert consumed_by_cores == available  # all the cores together take exactly the device
    assert len(available) == len(inv.devices)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_an_unhealthy_device_leaves_with_its_cores_and_counter(data: st.DataObject) -> None:
    name, lnc = data.draw(st.sampled_from(SETTINGS))
    inv = inventory(name, lnc)
    indices = [d.index for d in inv.devices]
    unhealthy = frozenset(data.draw(st.sets(st.sampled_from(indices))))
    objs = slices.build(model(name, lnc, unhealthy), 2)
    listed = all_devices(objs)
    left = {d["attributes"]["deviceId"]["int"] for d in listed}
    assert left == set(indices) - unhealthy
    counters = {c for s in objs for cs in s["spec"].get("sharedCounters", []) for c in cs["counters"]}
    assert counters == {f"neurondevice{d}" for d in left}
    assert slices.published_counts(objs) == {
        "device": len(left),
        "core": sum(len(d.logical_cores) for d in inv.devices if d.index in left),
        # ring arcs and the whole UltraServer node: devices made of several
        "group": len(
            [d for d in all_devices(objs, groups=True) if d["name"].startswith(("neurongroup", "neuronnode"))]
        ),
        "tainted": 0,
    }
    # group ids do not move when a device leaves: a claim never gets a set with a hole
    healthy = slices.group_ids(topology_from(inv))
    for d in listed:
        for size, ids in healthy.items():
            if d["attributes"]["deviceId"]["int"] in ids:
                assert d["attributes"][slices.group_attribute(size)] == {
                    "string": str(ids[d["attributes"]["deviceId"]["int"]])
                }


def test_without_cores_only_devices_and_no_counters() -> None:
    objs = slices.build(model("trn2.48xlarge", 2, publish_cores=False), 1)
    assert all("sharedCounters" not in s["spec"] for s in objs)
    assert [d["name"] for d in all_devices(objs)] == [f"neurondevice{i}" for i in range(16)]
    assert all("consumesCounters" not in d for d in all_devices(objs))


def test_every_device_unhealthy_still_publishes_an_empty_pool() -> None:
    objs = slices.build(model("inf2.xlarge", 1, frozenset({0})), 4)
    assert [s["spec"].get("devices") for s in objs] == [[]]
    assert objs[0]["spec"]["pool"]["resourceSliceCount"] == 1


def test_driver_version_only_when_known() -> None:
    with_version = all_devices(slices.build(model("inf2.24xlarge", 1, driver_version="2.24.7.0"), 1))
    without = all_devices(slices.build(model("inf2.24xlarge", 1), 1))
    assert with_version[0]["attributes"]["neuronDriverVersion"] == {"string": "2.24.7.0"}
    assert "neuronDriverVersion" not in without[0]["attributes"]


def test_content_ignores_the_generation_only() -> None:
    a = slices.build(model("inf2.24xlarge", 1), 1)
    assert slices.content(a) == slices.content(slices.build(model("inf2.24xlarge", 1), 7))
    assert slices.content(a) != slices.content(slices.build(model("inf2.24xlarge", 1, frozenset({2})), 1))


def test_slice_names_stay_valid_for_the_longest_node_names() -> None:
    assert slices.slice_name("node-a", 2) == "node-a-neuron.aws.com-2"
    long_a, long_b = "a" * 240 + ".example.com", "a" * 240 + ".example.org"
    name_a, name_b = slices.slice_name(long_a, 10), slices.slice_name(long_b, 10)
    assert len(name_a) <= 253
    assert name_a != name_b
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name_a)


# --- device taints ---------------------------------------------------------------------------


def test_a_tainted_device_stays_with_its_cores_and_counter() -> None:
    taint = slices.Taint("NC_UNCORRECTABLE_ERROR", "NoExecute")
    objs = slices.build(model("trn1.32xlarge", 1, taints={3: taint}), 1)
    devices = {d["name"]: d for d in all_devices(objs)}
    assert len(devices) == 16 + 32
    expected = [{"key": "neuron.aws.com/unhealthy", "value": "NC_UNCORRECTABLE_ERROR", "effect": "NoExecute"}]
    assert {n for n, d in devices.items() if d.get("taints")} == {"neurondevice3", "neuroncore6", "neuroncore7"}
    assert devices["neurondevice3"]["taints"] == expected
    assert devices["neuroncore7"]["taints"] == expected
    counters = {c for s in objs for cs in s["spec"].get("sharedCounters", []) for c in cs["counters"]}
    assert "neurondevice3" in counters
    assert slices.published_counts(objs) == {"device": 16, "core": 32, "group": 0, "tainted": 3}
    # an API server that drops taints: the same node with the device left out instead
    plain = slices.build(model("trn1.32xlarge", 1, taints={3: taint}).without_taints(), 1)
    assert "neurondevice3" not in {d["name"] for d in all_devices(plain)}
    assert not slices.tainted(plain)


@given(st.text(max_size=100))
def test_taint_values_are_always_valid_label_values(text: str) -> None:
    value = slices.taint_value(text)
    assert re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?", value), value


def test_taint_for_each_cause_and_severity() -> None:
    from neuron_dra_driver import taints

    from neuron_health.device_health import Verdict
    from neuron_health.faults import Severity

    effects = taints.Effects(until_reboot="NoSchedule", replace_instance="NoExecute")
    replace = Verdict(False, "kernel X", True, "NC_UNCORRECTABLE_ERROR", Severity.REPLACE_INSTANCE)
    reboot = Verdict(False, "counter y", True, "HBM_REPAIRABLE", Severity.UNTIL_REBOOT)
    absent = Verdict(False, "device vanished from sysfs", False, absent=True)
    detector = Verdict(False, "problem detector: DMA_ERROR", False, external=True)
    assert taints.taint_for(replace, effects) == slices.Taint("NC_UNCORRECTABLE_ERROR", "NoExecute")
    assert taints.taint_for(reboot, effects) == slices.Taint("HBM_REPAIRABLE", "NoSchedule")
    assert taints.taint_for(absent, effects) == slices.Taint("DeviceAbsent", "NoSchedule")
    assert taints.taint_for(detector, effects) == slices.Taint("ProblemDetector", "NoSchedule")
    # a stalled heartbeat is validated in place, never drained: NoSchedule whatever the until-reboot effect
    stalled = Verdict(False, "heartbeat", True, "HEALTHCHECK_HEARTBEAT_STALE", Severity.UNTIL_REBOOT)
    evicting = taints.Effects(until_reboot="NoExecute", replace_instance="NoExecute")
    assert taints.taint_for(stalled, evicting) == slices.Taint("HEALTHCHECK_HEARTBEAT_STALE", "NoSchedule")
    assert taints.taint_for(reboot, evicting).effect == "NoExecute"
    # the detector's verdict names a fault of the table: its kind and severity, as if seen here
    named = Verdict(
        False, "problem detector: x", False, "NC_UNCORRECTABLE_ERROR", Severity.REPLACE_INSTANCE, external=True
    )
    assert taints.taint_for(named, effects) == slices.Taint("NC_UNCORRECTABLE_ERROR", "NoExecute")


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "neuron.aws.com/unhealthy", "operator": "Exists"}, True),
        ({"key": "neuron.aws.com/unhealthy", "operator": "Equal", "value": "DMA_ERROR"}, True),
        ({"key": "neuron.aws.com/unhealthy", "value": "DMA_ERROR", "effect": "NoSchedule"}, True),
        ({"key": "neuron.aws.com/unhealthy", "operator": "Equal", "value": "OTHER"}, False),
        ({"key": "neuron.aws.com/unhealthy", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"operator": "Exists"}, True),
        ({"key": "example.com/other", "operator": "Exists"}, False),
        ({"operator": "Equal", "value": "DMA_ERROR"}, False),
    ],
)
def test_tolerations_match_as_the_scheduler_matches_them(toleration: dict[str, str], tolerated: bool) -> None:
    from neuron_dra_driver import taints

    assert taints.tolerates([toleration], slices.Taint("DMA_ERROR", "NoSchedule")) is tolerated


# --- ring arcs as devices --------------------------------------------------------------------

RINGS = [(name, lnc) for name, lnc in SETTINGS if INSTANCE_TYPES[name].topology is TopologyKind.RING]


@pytest.mark.parametrize(("name", "lnc"), RINGS, ids=[f"{n}-lnc{lnc}" for n, lnc in RINGS])
def test_every_arc_of_a_ring_is_one_device_consuming_its_members_counters(name: str, lnc: int) -> None:
    inv = inventory(name, lnc)
    topo = topology_from(inv)
    objs = slices.build(model(name, lnc), 1)
    arcs = [d for d in all_devices(objs, groups=True) if d["attributes"]["resourceType"]["string"] == slices.GROUP_KIND]
    expected = {frozenset(g) for size in topo.group_sizes if size >= 2 for g in topo.groups(size)}
    published = set()
    for arc in arcs:
        size, first = resources.parse_dra_group(arc["name"]) or (0, 0)
        members = resources.ring_arc(first, size, topo.device_count)
        assert arc["attributes"]["deviceCount"] == {"int": size}
        assert arc["attributes"]["firstDeviceId"] == {"int": first}
        consumed = {c: int(v["value"]) for cc in arc["consumesCounters"] for c, v in cc["counters"].items()}
        # all of every member's counter: no member device or core can be allocated beside the arc
        assert consumed == {f"neurondevice{d}": len(inv.device(d).logical_cores) for d in members}  # type: ignore[union-attr]
        published.add(frozenset(members))
    assert published == expected
    assert len(arcs) == len(expected)
    # a member left out takes its arcs with it; none without the shared counters
    without_2 = {d["name"] for d in all_devices(slices.build(model(name, lnc, frozenset({2})), 1), groups=True)}
    assert not [
        a["name"]
        for a in arcs
        if 2 in resources.ring_arc(*reversed(resources.parse_dra_group(a["name"]) or (0, 0)), topo.device_count)
        and a["name"] in without_2
    ]
    assert not [
        d
        for d in all_devices(slices.build(model(name, lnc, publish_cores=False), 1), groups=True)
        if d["name"].startswith("neurongroup")
    ]


def test_a_torus_publishes_no_arcs() -> None:
    objs = slices.build(model("trn1.32xlarge", 1), 1)
    assert not [d for d in all_devices(objs, groups=True) if d["name"].startswith("neurongroup")]


def test_the_aws_drivers_position_attributes_on_a_torus() -> None:
    """topology_x/topology_y (row, column), topology4_id (row), topology8_id (pair of rows), as AWS's
    driver publishes them on trn nodes that are not UltraServer nodes; devices and cores alike."""
    listed = all_devices(slices.build(model("trn1.32xlarge", 1), 1))
    by_name = {d["name"]: d["attributes"] for d in listed}
    assert {k: by_name["neurondevice6"][k] for k in ("topology_x", "topology_y", "topology4_id", "topology8_id")} == {
        "topology_x": {"int": 1},
        "topology_y": {"int": 2},
        "topology4_id": {"int": 1},
        "topology8_id": {"int": 0},
    }
    assert by_name["neuroncore13"]["topology8_id"] == {"int": 0}  # core 13 is on device 6
    assert by_name["neurondevice11"]["topology8_id"] == {"int": 1}
    # rows of four are the connected groups of four: topology4_id agrees with devicegroup4_id's grouping
    for d in listed:
        a = d["attributes"]
        if a["resourceType"] == {"string": "neuron_device"}:
            assert a["topology4_id"]["int"] == int(a["resource.aws.com/devicegroup4_id"]["string"]) // 4
    # a ring, and an UltraServer node, publish none
    for name in ("inf2.48xlarge", "trn2u.48xlarge"):
        lnc = INSTANCE_TYPES[name].family.default_lnc
        assert not [d for d in all_devices(slices.build(model(name, lnc), 1)) if "topology_x" in d["attributes"]]


def test_the_nodes_placement_labels_are_the_aws_drivers_attributes_on_every_device() -> None:
    labels = {
        "topology.k8s.aws/network-node-layer-1": "nn-1a2b",
        "topology.k8s.aws/network-node-layer-2": "nn-3c4d",
        "topology.k8s.aws/network-node-layer-3": "nn-5e6f",
        "topology.k8s.aws/capacity-block-id": "cr-0123456789abcdef0",
        "kubernetes.io/hostname": "not-a-placement-label",
    }
    placed = model("inf2.48xlarge", 1, placement=placement_attributes(labels))
    listed = all_devices(slices.build(placed, 1), groups=True)
    kinds = {d["attributes"]["resourceType"]["string"] for d in listed}
    assert kinds == {"neuron_device", "neuron_core", "neuron_device_group"}
    for d in listed:
        a = d["attributes"]
        assert {k: a[k] for k in a if k.startswith(("networkNode", "capacityBlock"))} == {
            "networkNodeLayer1": {"string": "nn-1a2b"},
            "networkNodeLayer2": {"string": "nn-3c4d"},
            "networkNodeLayer3": {"string": "nn-5e6f"},
            "capacityBlockId": {"string": "cr-0123456789abcdef0"},
        }
        assert len(a) <= 32  # the API's limit of attributes and capacities per device, placement included
    unplaced = all_devices(slices.build(model("inf2.48xlarge", 1), 1))
    assert not [k for d in unplaced for k in d["attributes"] if k.startswith(("networkNode", "capacityBlock"))]


@given(st.dictionaries(st.sampled_from(sorted(ATTRIBUTE_OF_LABEL)), st.text(max_size=100)))
def test_placement_attributes_are_valid_string_attributes_for_any_label_values(labels: dict[str, str]) -> None:
    attributes = placement_attributes(labels)
    assert set(attributes) <= set(ATTRIBUTE_OF_LABEL.values())
    for name, value in attributes.items():
        assert QUALIFIED.match(name)
        assert 0 < len(value) <= 64


def test_a_slice_the_api_server_stored_with_null_devices_reads_as_none() -> None:
    """Kubernetes 1.34 stores the counter slice, its shared counters dropped, with `devices: null`."""
    stored = [{"metadata": {"name": "s"}, "spec": {"devices": None}}]
    assert not slices.counted(stored)
    assert not slices.tainted(stored)


def ultraserver_model(tmp: Path, **kw: object) -> slices.NodeDevices:
    (root,) = sim.create_ultraserver(tmp, "trn2u.48xlarge", server_id="00c0ffee12345678", node_ids=[1])
    inv = scan(root, env={})
    return slices.NodeDevices("node-a", inv, ultraserver=inv.ultraserver, **kw)  # type: ignore[arg-type]


def whole_nodes(objs: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    return [d for s in objs for d in s["spec"].get("devices") or [] if d["name"] == "neuronnode"]


def test_an_ultraserver_node_is_also_one_device_consuming_every_counter(tmp_path: Path) -> None:
    """What AWS's trn2u ResourceClaimTemplates select: one device of resourceType neuron_node, which
    takes every device's whole counter (no device or core can be allocated beside it), carrying the
    node's UltraServer identity once the driver's election is over."""
    model = ultraserver_model(tmp_path)
    (node,) = whole_nodes(slices.build(model, 1))
    inv = model.inventory
    a = node["attributes"]
    assert a["resourceType"] == {"string": "neuron_node"}
    assert (a["deviceCount"], a["coreCount"]) == ({"int": 16}, {"int": len(inv.cores)})
    assert a["ultraserverMode"] == {"string": "1_2_4"}
    assert (a["ultraserverServerId4"], a["ultraserverNodeId4"]) == ({"string": "00c0ffee12345678"}, {"int": 1})
    assert a["ultraserverNodeId2"] == {"int": 0}
    consumed = {c: int(v["value"]) for cc in node["consumesCounters"] for c, v in cc["counters"].items()}
    assert consumed == {f"neurondevice{d.index}": len(d.logical_cores) for d in inv.devices}
    # a device out of the pool takes the whole node with it; a tainted one taints it
    assert not whole_nodes(slices.build(replace(model, unhealthy=(3,)), 1))
    taint = slices.Taint("HBM_UNCORRECTABLE_ERROR")
    (tainted,) = whole_nodes(slices.build(replace(model, taints={3: taint}), 1))
    assert tainted["taints"] == [taint.to_api()]
    # no identity yet: the device, without the identity's attributes (never a guess)
    pending = replace(model, ultraserver=UltraServerReading(State.PENDING, reason="busy"))
    (anonymous,) = whole_nodes(slices.build(pending, 1))
    assert not [k for k in anonymous["attributes"] if k.startswith("ultraserver")]
    # not on a node outside an UltraServer instance type, nor without the shared counters
    assert not whole_nodes(slices.build(model_of("trn2.48xlarge"), 1))
    assert not whole_nodes(slices.build(replace(model, publish_cores=False), 1))


def model_of(name: str) -> slices.NodeDevices:
    return model(name, INSTANCE_TYPES[name].family.supported_lnc[0])


def test_a_trainium3_reservation_node_is_one_device_with_its_reservation_as_the_4_node_group(tmp_path: Path) -> None:
    """trn3.48xlarge (PDS): the driver's reservation_id and node_id are the 4-node group's ids."""
    (root,) = sim.create_ultraserver(tmp_path, "trn3.48xlarge", server_id="00c0ffee12345678", node_ids=[2])
    inv = scan(root, env={})
    model = slices.NodeDevices("node-a", inv, ultraserver=inv.ultraserver)
    (node,) = whole_nodes(slices.build(model, 1))
    a = node["attributes"]
    assert (a["deviceCount"], a["coreCount"]) == ({"int": 16}, {"int": len(inv.cores)})
    assert (a["ultraserverServerId4"], a["ultraserverNodeId4"]) == ({"string": "00c0ffee12345678"}, {"int": 2})
    assert "ultraserverServerId2" not in a
    assert a["ultraserverMode"] == {"string": "1_4"}
    # not torus positions: a switch has no rows or columns
    assert not [k for d in all_devices(slices.build(model, 1)) for k in d["attributes"] if k.startswith("topology")]
    # trn3e.24xlarge (MAX) is not a node of a group of nodes: no whole-node device
    assert not whole_nodes(slices.build(model_of("trn3e.24xlarge"), 1))


@pytest.mark.parametrize(("name", "lnc"), SETTINGS, ids=IDS)
def test_cores_as_capacity_publish_each_device_once_shareable_with_its_cores_as_capacity(name: str, lnc: int) -> None:
    inv = inventory(name, lnc)
    objs = slices.build(model(name, lnc, cores_as_capacity=True), 1)
    listed = [d for s in objs for d in s["spec"].get("devices") or []]
    # no core devices, no arcs, no whole node, no counters: nothing but the devices themselves
    assert [d["name"] for d in listed] == [f"neurondevice{d.index}" for d in inv.devices]
    assert all("sharedCounters" not in s["spec"] for s in objs)
    for d in listed:
        cores = str(len(inv.device(d["attributes"]["deviceId"]["int"]).logical_cores))  # type: ignore[union-attr]
        assert d["allowMultipleAllocations"] is True
        assert "consumesCounters" not in d
        # a claim asking no capacity (whole devices, AWS's templates) takes all of it
        assert d["capacity"] == {
            "cores": {
                "value": cores,
                "requestPolicy": {"default": cores, "validRange": {"min": "1", "max": cores, "step": "1"}},
            }
        }
    assert slices.shareable(objs)
    assert not slices.counted(objs)
    assert slices.published_counts(objs) == {
        "device": len(inv.devices),
        "core": len(inv.cores),
        "group": 0,
        "tainted": 0,
    }


def test_cores_as_capacity_needs_cores_published() -> None:
    objs = slices.build(model("inf2.48xlarge", 1, cores_as_capacity=True, publish_cores=False), 1)
    assert not slices.shareable(objs)
    assert all("capacity" not in d and "allowMultipleAllocations" not in d for d in all_devices(objs))
