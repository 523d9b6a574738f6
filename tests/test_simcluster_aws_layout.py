"""AWS's layout as the scheduling bench publishes it (simcluster.dra, issue 58 item 1): whole devices
only, AWS's attribute names, groups that are valid connected sets, and claims as AWS's published
templates write them. No processes: the slices and claims as objects."""

from __future__ import annotations

from typing import Any

import pytest
from simcluster import dra
from simcluster.fleet import NODE_MIX, ULTRASERVER_TYPE, NodeSpec, PodSpec, fleet

from neuron_model.allocator import choose_devices

AWS_ATTRIBUTES = {"deviceId", "instanceType", "neuronDriverVersion", "draDriverVersion", "resourceType"}
TORUS = {"topology_x", "topology_y", "topology4_id", "topology8_id"}
SPECS = [NodeSpec(f"n-{t}-{lnc}", t, lnc) for t, lnc in NODE_MIX] + [n for n in fleet(4, 1, 1) if n.ultraserver]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_whole_devices_only_with_aws_attributes_and_valid_groups(spec: NodeSpec) -> None:
    [published] = dra.aws_node_slices(spec)
    body = published["spec"]
    assert body["pool"] == {"name": spec.name, "generation": 1, "resourceSliceCount": 1}
    assert body["nodeName"] == spec.name
    assert "sharedCounters" not in body
    devices = body["devices"]
    topo = spec.topology
    assert [d["name"] for d in devices] == [f"neurondevice{i}" for i in range(topo.device_count)]
    groups: dict[tuple[int, str], set[int]] = {}
    for d in devices:
        assert "consumesCounters" not in d
        attributes = d["attributes"]
        assert attributes["resourceType"] == {"string": "neuron_device"}
        assert attributes["instanceType"] == {"string": spec.instance_type}
        names = set(attributes) - AWS_ATTRIBUTES
        torus = spec.instance_type.startswith("trn") and spec.instance_type != ULTRASERVER_TYPE
        assert names & TORUS == (TORUS if torus else set()), names
        for name in names - TORUS:
            size = int(name.removeprefix("resource.aws.com/devicegroup").removesuffix("_id"))
            value = attributes[name]["string"]
            assert len(value) == 16, value  # an opaque hash, as AWS's
            groups.setdefault((size, value), set()).add(attributes["deviceId"]["int"])
    assert {size for size, _ in groups} >= {1, 4}
    for (size, _), members in groups.items():
        assert len(members) == size
        assert choose_devices(topo, tuple(members), tuple(members), size).valid, (size, members)


def test_claims_as_aws_templates_write_them() -> None:
    types = sorted({t for t, _ in NODE_MIX})

    def devices(pod: PodSpec) -> dict[str, Any]:
        spec: dict[str, Any] = dra.aws_claim_object(pod, types)["spec"]["devices"]
        return spec

    four = devices(PodSpec("p4", 4, 0))
    [request] = four["requests"]
    assert request["exactly"]["allocationMode"] == "ExactCount"
    assert request["exactly"]["count"] == 4
    assert request["exactly"]["deviceClassName"] == "neuron.aws.com"
    [selector] = request["exactly"]["selectors"]
    assert selector["cel"]["expression"].startswith("device.attributes['neuron.aws.com'].instanceType in [")
    assert four["constraints"] == [{"requests": ["neurons"], "matchAttribute": "resource.aws.com/devicegroup4_id"}]
    assert "constraints" not in devices(PodSpec("p1", 1, 0))
    assert "constraints" not in devices(PodSpec("p16", 16, 0))  # AWS's "xl-trn2" template: all 16, no constraint
    with pytest.raises(ValueError, match="cores"):
        dra.aws_claim_object(PodSpec("c", 0, 2), types)
    [device_class] = dra.aws_device_classes()
    assert device_class["spec"]["selectors"] == [{"cel": {"expression": 'device.driver == "neuron.aws.com"'}}]
