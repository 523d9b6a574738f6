"""The Neuron instance types and what each one's hardware looks like.

Sources: the Neuron architecture pages and the driver's `V*_NC_PER_DEVICE` / PCI ids
(`shared/reference/neuron-stack.md` sections 2 and 3). The table is what the inventory
falls back on when sysfs cannot say, and what the simulator builds from; topology read
from the driver's `connected_devices` always wins over it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


class UnknownInstanceTypeError(ValueError):
    pass


GIB = 1024**3


class TopologyKind(enum.StrEnum):
    SINGLE = "single"  # one device, nothing to connect
    RING = "ring"  # inf1/inf2: devices i and i+1 (mod n) are linked
    TORUS_2D = "torus2d"  # trn1.32xlarge, trn1n, trn2.48xlarge: a rows x cols torus


@dataclass(frozen=True, slots=True)
class Family:
    """What every instance of one accelerator generation shares."""

    name: str  # inf1, inf2, trn1, trn2
    arch_type: str  # info/architecture/arch_type
    sysfs_instance_type: str  # info/architecture/instance_type (the family, not the size)
    device_name: str  # info/architecture/device_name
    core_arch: str  # neuron_coreN/info/architecture/arch_type
    physical_cores_per_device: int
    memory_bytes_per_device: int
    pci_device_ids: tuple[int, ...]
    has_serial_number: bool  # info/serial_number exists on v2/v3 devices only
    supported_lnc: tuple[int, ...]  # logical-core settings the runtime accepts
    default_lnc: int


FAMILIES: Mapping[str, Family] = MappingProxyType(
    {
        "inf1": Family(
            name="inf1",
            arch_type="NDv1",
            sysfs_instance_type="Inf1",
            device_name="Inferentia",
            core_arch="NCv1",
            physical_cores_per_device=4,
            memory_bytes_per_device=8 * GIB,
            pci_device_ids=(0x7064, 0x7065, 0x7066, 0x7067),
            has_serial_number=False,
            supported_lnc=(1,),
            default_lnc=1,
        ),
        "inf2": Family(
            name="inf2",
            arch_type="NDv3",  # sic: the driver reports inf2 as NDv3 although its cores are NCv2
            sysfs_instance_type="Inf2",
            device_name="Inferentia2",
            core_arch="NCv2",
            physical_cores_per_device=2,
            memory_bytes_per_device=32 * GIB,
            pci_device_ids=(0x7264,),
            has_serial_number=True,
            supported_lnc=(1,),
            default_lnc=1,
        ),
        "trn1": Family(
            name="trn1",
            arch_type="NDv2",
            sysfs_instance_type="Trn1",
            device_name="Trainium1",
            core_arch="NCv2",
            physical_cores_per_device=2,
            memory_bytes_per_device=32 * GIB,
            pci_device_ids=(0x7164,),
            has_serial_number=True,
            supported_lnc=(1,),
            default_lnc=1,
        ),
        "trn2": Family(
            name="trn2",
            arch_type="NDv3",
            sysfs_instance_type="Trn2",
            device_name="Trainium2",
            core_arch="NCv3",
            physical_cores_per_device=8,
            memory_bytes_per_device=96 * GIB,
            pci_device_ids=(0x7364,),
            has_serial_number=True,
            supported_lnc=(1, 2),
            default_lnc=2,
        ),
    }
)


@dataclass(frozen=True, slots=True)
class InstanceType:
    name: str
    family: Family
    devices: int
    topology: TopologyKind
    torus_shape: tuple[int, int] | None = None  # (rows, cols) for TORUS_2D
    numa_nodes: int = 1  # sockets the devices are spread over (for the simulator's PCI tree)
    ultraserver: bool = False  # a node of an UltraServer (its devices also link to other nodes')

    @property
    def physical_cores_per_device(self) -> int:
        return self.family.physical_cores_per_device

    @property
    def memory_bytes_per_device(self) -> int:
        return self.family.memory_bytes_per_device

    @property
    def pci_device_id(self) -> int:
        return self.family.pci_device_ids[0]

    def logical_cores_per_device(self, lnc: int) -> int:
        return self.family.physical_cores_per_device // lnc

    def adjacency(self) -> dict[int, tuple[int, ...]]:
        """The links the table expects, as `connected_devices` would list them."""
        return expected_adjacency(self.topology, self.devices, self.torus_shape)


def expected_adjacency(
    kind: TopologyKind, devices: int, torus_shape: tuple[int, int] | None
) -> dict[int, tuple[int, ...]]:
    if kind is TopologyKind.SINGLE or devices <= 1:
        return {i: () for i in range(devices)}
    if kind is TopologyKind.RING:
        return {i: tuple(sorted({(i - 1) % devices, (i + 1) % devices} - {i})) for i in range(devices)}
    if torus_shape is None:
        raise ValueError("a 2D torus needs its shape")
    rows, cols = torus_shape
    result: dict[int, tuple[int, ...]] = {}
    for i in range(devices):
        r, c = divmod(i, cols)
        neighbours = {
            ((r - 1) % rows) * cols + c,
            ((r + 1) % rows) * cols + c,
            r * cols + (c - 1) % cols,
            r * cols + (c + 1) % cols,
        } - {i}
        result[i] = tuple(sorted(neighbours))
    return result


def _it(
    name: str,
    family: str,
    devices: int,
    topology: TopologyKind,
    shape: tuple[int, int] | None = None,
    numa_nodes: int = 1,
    ultraserver: bool = False,
) -> InstanceType:
    return InstanceType(name, FAMILIES[family], devices, topology, shape, numa_nodes, ultraserver)


INSTANCE_TYPES: Mapping[str, InstanceType] = MappingProxyType(
    {
        it.name: it
        for it in (
            _it("inf1.xlarge", "inf1", 1, TopologyKind.SINGLE),
            _it("inf1.2xlarge", "inf1", 1, TopologyKind.SINGLE),
            _it("inf1.6xlarge", "inf1", 4, TopologyKind.RING),
            _it("inf1.24xlarge", "inf1", 16, TopologyKind.RING, numa_nodes=2),
            _it("inf2.xlarge", "inf2", 1, TopologyKind.SINGLE),
            _it("inf2.8xlarge", "inf2", 1, TopologyKind.SINGLE),
            _it("inf2.24xlarge", "inf2", 6, TopologyKind.RING),
            _it("inf2.48xlarge", "inf2", 12, TopologyKind.RING, numa_nodes=2),
            _it("trn1.2xlarge", "trn1", 1, TopologyKind.SINGLE),
            _it("trn1.32xlarge", "trn1", 16, TopologyKind.TORUS_2D, (4, 4), numa_nodes=2),
            _it("trn1n.32xlarge", "trn1", 16, TopologyKind.TORUS_2D, (4, 4), numa_nodes=2),
            _it("trn2.3xlarge", "trn2", 1, TopologyKind.SINGLE),
            _it("trn2.48xlarge", "trn2", 16, TopologyKind.TORUS_2D, (4, 4), numa_nodes=2),
            _it("trn2u.48xlarge", "trn2", 16, TopologyKind.TORUS_2D, (4, 4), numa_nodes=2, ultraserver=True),
        )
    }
)


def get_instance_type(name: str) -> InstanceType:
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        known = ", ".join(INSTANCE_TYPES)
        raise UnknownInstanceTypeError(f"unknown Neuron instance type {name!r}; known types: {known}") from None


def guess_instance_type(sysfs_family: str | None, device_count: int) -> InstanceType | None:
    """The table entry for a family and device count, when exactly one size fits.

    Used when the host does not expose the instance type itself (no DMI product name).
    Sizes that share a device count (inf1.xlarge and inf1.2xlarge) are told apart only by
    their CPUs, which do not matter here; the first listed is returned.
    """
    for it in INSTANCE_TYPES.values():
        if it.family.sysfs_instance_type == sysfs_family and it.devices == device_count:
            return it
    return None
