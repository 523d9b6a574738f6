"""The extended resources the stack advertises and the device IDs it gives them, and the DRA
driver's name and device names.

One place for the naming, because the device plugin and the DRA driver write these names and the
exporter reads them back out of the kubelet's PodResources API.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

DEFAULT_PREFIX = "aws.amazon.com"


class Kind(enum.StrEnum):
    DEVICE = "device"  # whole Neuron devices
    CORE = "core"  # logical NeuronCores


@dataclass(frozen=True, slots=True)
class Resource:
    name: str  # the part after the prefix: neuron, neuroncore, neurondevice
    kind: Kind
    prefix: str = DEFAULT_PREFIX

    @property
    def full_name(self) -> str:
        return f"{self.prefix}/{self.name}"


def neuron(prefix: str = DEFAULT_PREFIX) -> Resource:
    return Resource("neuron", Kind.DEVICE, prefix)


def neuroncore(prefix: str = DEFAULT_PREFIX) -> Resource:
    return Resource("neuroncore", Kind.CORE, prefix)


def neurondevice(prefix: str = DEFAULT_PREFIX) -> Resource:
    """Deprecated alias of `neuron` (removed upstream in Neuron 2.20), for old manifests."""
    return Resource("neurondevice", Kind.DEVICE, prefix)


def device_id(index: int) -> str:
    return f"neuron{index}"


def core_id(global_index: int) -> str:
    return f"neuroncore{global_index}"


_ID_RE = re.compile(r"^(neuroncore|neuron)(\d+)$")


def parse_id(value: str) -> tuple[Kind, int] | None:
    """`neuron3` -> (DEVICE, 3); `neuroncore12` -> (CORE, 12); anything else -> None."""
    match = _ID_RE.match(value)
    if match is None:
        return None
    return (Kind.CORE if match.group(1) == "neuroncore" else Kind.DEVICE), int(match.group(2))


# --- DRA: the driver's name and the names of the devices it publishes ------------------------

DRA_DRIVER = "neuron.aws.com"  # the AWS driver's name too, so its DeviceClasses and claims work unchanged
_DRA_NAME_RE = re.compile(r"^(neurondevice|neuroncore)(0|[1-9][0-9]*)$")


def dra_device_name(index: int) -> str:
    """A whole Neuron device in the driver's ResourceSlices."""
    return f"neurondevice{index}"


def dra_core_name(global_index: int) -> str:
    """A logical NeuronCore in the driver's ResourceSlices (its NEURON_RT_VISIBLE_CORES index)."""
    return f"neuroncore{global_index}"


# The whole node as one device, on UltraServer nodes: what AWS's trn2u claims ask for (one device whose
# resourceType is `neuron_node`). AWS does not publish its device's name; ours is this one.
DRA_NODE_NAME = "neuronnode"


_DRA_GROUP_RE = re.compile(r"^neurongroup([1-9][0-9]*)-(0|[1-9][0-9]*)$")


def dra_group_name(size: int, first: int) -> str:
    """An arc of `size` connected devices of a ring starting at device `first` (wrapping round),
    published as one device so that a claim can ask for any arc, overlapping ones included."""
    return f"neurongroup{size}-{first}"


def parse_dra_group(value: str) -> tuple[int, int] | None:
    """`neurongroup4-10` -> (4, 10): the arc's size and first device; anything else -> None."""
    match = _DRA_GROUP_RE.match(value)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def ring_arc(first: int, size: int, ring: int) -> tuple[int, ...]:
    """The devices of the arc of `size` starting at `first` on a ring of `ring` devices."""
    return tuple((first + i) % ring for i in range(size))


def parse_dra_name(value: str) -> tuple[Kind, int] | None:
    """`neurondevice3` -> (DEVICE, 3); `neuroncore12` -> (CORE, 12); anything else -> None."""
    match = _DRA_NAME_RE.match(value)
    if match is None:
        return None
    return (Kind.DEVICE if match.group(1) == "neurondevice" else Kind.CORE), int(match.group(2))


def is_valid_prefix(prefix: str) -> bool:
    # the kubelet rejects names that are not <dns-subdomain>/<name> or that use kubernetes.io
    return bool(re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", prefix)) and "kubernetes.io" not in prefix
