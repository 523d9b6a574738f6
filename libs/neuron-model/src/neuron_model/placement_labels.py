"""Where a node sits in EC2's network, as the labels EKS puts on it, and the names AWS's Neuron DRA
driver publishes them under (its "Neuron DRA Driver Attributes Reference"): a claim can then keep
its devices on nodes under one network node (`matchAttribute: neuron.aws.com/networkNodeLayer3`)
or in one capacity block, on either driver."""

from __future__ import annotations

from collections.abc import Mapping

CAPACITY_BLOCK_LABEL = "topology.k8s.aws/capacity-block-id"
# EKS's network node labels, layer 1 the farthest from the node, layer 3 the nearest (a Kueue
# Topology lists them in this order, docs/scheduling.md#kueue)
NETWORK_NODE_LAYER_LABELS = tuple(f"topology.k8s.aws/network-node-layer-{n}" for n in (1, 2, 3))

# label -> DRA attribute (a string)
ATTRIBUTE_OF_LABEL: Mapping[str, str] = {
    **{label: f"networkNodeLayer{n}" for n, label in enumerate(NETWORK_NODE_LAYER_LABELS, 1)},
    CAPACITY_BLOCK_LABEL: "capacityBlockId",
}

# A DRA string attribute holds at most 64 characters; a label value at most 63, so a valid label fits.
MAX_ATTRIBUTE_LENGTH = 64


def placement_attributes(labels: Mapping[str, str]) -> dict[str, str]:
    """The DRA attributes a node's labels give; labels absent or empty give none (a node outside EKS)."""
    return {
        attribute: labels[label][:MAX_ATTRIBUTE_LENGTH]
        for label, attribute in ATTRIBUTE_OF_LABEL.items()
        if isinstance(labels.get(label), str) and labels[label]
    }
