from __future__ import annotations

from kubelet_api.podresources_client import Holding
from neuron_model import resources
from neuron_node_metrics.attribution import Owner, attribute

RES = [resources.neuron(), resources.neuroncore(), resources.neurondevice()]
CORES = {0: (0, 1), 1: (2, 3), 2: (4, 5)}


def h(pod: str, resource: str, device_id: str, container: str = "c", ns: str = "ns") -> Holding:
    return Holding(ns, pod, container, f"aws.amazon.com/{resource}", device_id)


def test_a_device_holding_covers_its_cores_and_the_device() -> None:
    a = attribute([h("p", "neuron", "neuron1")], RES, CORES, max_owners=10)
    assert a.cores == {2: Owner("ns", "p", "c"), 3: Owner("ns", "p", "c")}
    assert a.devices == {1: Owner("ns", "p", "c")}
    assert a.allocated == {"aws.amazon.com/neuron": 1}


def test_core_holdings_and_shared_devices() -> None:
    a = attribute([h("p", "neuroncore", "neuroncore4"), h("q", "neuroncore", "neuroncore5")], RES, CORES, max_owners=10)
    assert a.cores == {4: Owner("ns", "p", "c"), 5: Owner("ns", "q", "c")}
    assert a.devices == {}  # two holders: the device's own series stay unattributed
    b = attribute([h("p", "neuroncore", "neuroncore4"), h("p", "neuroncore", "neuroncore5")], RES, CORES, max_owners=10)
    assert b.devices == {2: Owner("ns", "p", "c")}


def test_foreign_resources_and_bad_ids_are_ignored() -> None:
    holdings = [
        Holding("ns", "p", "c", "nvidia.com/gpu", "GPU-1"),
        h("p", "neuroncore", "neuron1"),  # a device ID under the core resource
        h("p", "neuron", "garbage"),
    ]
    a = attribute(holdings, RES, CORES, max_owners=10)
    assert (a.cores, a.devices, a.allocated) == ({}, {}, {})


def test_cap_on_owners_and_label_length() -> None:
    holdings = [h(f"pod{i}", "neuroncore", f"neuroncore{i}") for i in range(6)]
    a = attribute(holdings, RES, CORES, max_owners=4)
    assert len(a.cores) == 4
    assert a.dropped == 2
    long = attribute([h("x" * 300, "neuron", "neuron0")], RES, CORES, max_owners=4, max_label_length=63)
    assert long.devices[0].pod == "x" * 63


def dra(pod: str, device: str, claim: str = "claim-a", driver: str = "neuron.aws.com") -> Holding:
    return Holding("ns", pod, "c", driver, device, claim, "node-a")


def test_devices_held_through_a_dra_claim_carry_the_pod_and_the_claim() -> None:
    a = attribute([dra("p", "neurondevice1"), dra("q", "neuroncore4", "claim-b")], RES, CORES, max_owners=10)
    assert a.cores == {
        2: Owner("ns", "p", "c", "claim-a"),
        3: Owner("ns", "p", "c", "claim-a"),
        4: Owner("ns", "q", "c", "claim-b"),
    }
    assert a.devices == {1: Owner("ns", "p", "c", "claim-a"), 2: Owner("ns", "q", "c", "claim-b")}
    assert a.allocated == {}  # DRA holdings are not the device plugin's extended resources
    # another driver's devices, and names this driver never publishes, are ignored
    other = attribute(
        [dra("p", "neurondevice1", driver="gpu.example.com"), dra("p", "neuron1"), dra("p", "neuroncore01")],
        RES,
        CORES,
        max_owners=10,
    )
    assert (other.cores, other.devices) == ({}, {})


def test_a_device_shared_by_capacity_leaves_its_cores_unattributed_rather_than_misattributed() -> None:
    """DRA's cores as capacity: two claims each hold a share of neurondevice1 by its name; which cores each
    got is the driver's choice, which PodResources does not tell, so no core of it names either pod."""
    a = attribute(
        [dra("p", "neurondevice1"), dra("q", "neurondevice1", "claim-b"), dra("r", "neurondevice0", "claim-c")],
        RES,
        CORES,
        max_owners=10,
    )
    assert a.cores == {0: Owner("ns", "r", "c", "claim-c"), 1: Owner("ns", "r", "c", "claim-c")}
    assert a.devices == {0: Owner("ns", "r", "c", "claim-c")}
    # one claim used by two containers is no share: its cores keep an owner
    both = attribute(
        [dra("p", "neurondevice1"), Holding("ns", "p", "d", "neuron.aws.com", "neurondevice1", "claim-a", "node-a")],
        RES,
        CORES,
        max_owners=10,
    )
    assert set(both.cores) == {2, 3}


def test_flatten_reads_the_kubelets_dynamic_resources() -> None:
    from kubelet_api.podresources.v1 import api_pb2 as pr
    from kubelet_api.podresources_client import flatten

    response = pr.ListPodResourcesResponse(
        pod_resources=[
            pr.PodResources(
                name="p",
                namespace="ns",
                containers=[
                    pr.ContainerResources(
                        name="c",
                        devices=[pr.ContainerDevices(resource_name="aws.amazon.com/neuron", device_ids=["neuron0"])],
                        dynamic_resources=[
                            pr.DynamicResource(
                                claim_name="claim-a",
                                claim_namespace="ns",
                                claim_resources=[
                                    pr.ClaimResource(
                                        driver_name="neuron.aws.com", pool_name="node-a", device_name="neuroncore5"
                                    )
                                ],
                            )
                        ],
                    )
                ],
            )
        ]
    )
    assert flatten(response) == [
        Holding("ns", "p", "c", "aws.amazon.com/neuron", "neuron0"),
        Holding("ns", "p", "c", "neuron.aws.com", "neuroncore5", "claim-a", "node-a"),
    ]


def test_a_ring_arc_held_through_dra_labels_each_of_its_devices() -> None:
    cores = {d: (2 * d, 2 * d + 1) for d in range(6)}
    a = attribute([dra("p", "neurongroup3-5")], RES, cores, max_owners=10, ring=6)
    owner = Owner("ns", "p", "c", "claim-a")
    assert a.devices == {5: owner, 0: owner, 1: owner}  # the arc wraps round the ring
    assert set(a.cores) == {10, 11, 0, 1, 2, 3}
    # not a ring (or not known to be): an arc name is not attributed
    assert attribute([dra("p", "neurongroup3-5")], RES, cores, max_owners=10).cores == {}
