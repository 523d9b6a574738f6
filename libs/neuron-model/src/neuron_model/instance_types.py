"""The Neuron instance types and what each one's hardware looks like.

Sources: the Neuron architecture pages and the driver's `V*_NC_PER_DEVICE` / PCI ids
(`shared/reference/neuron-stack.md` sections 2 and 3; for Trainium3
`shared/reference/ultraserver-and-trn3.md` section 5). The table is what the inventory
falls back on when sysfs cannot say, and what the simulator builds from; topology read
from the driver's `connected_devices` always wins over it, except on a NeuronSwitch
(`TopologyKind.SWITCH`), where every set of devices is connected whatever links are listed.

Trainium3 facts no source states are kept in one place, `TRN3_UNCONFIRMED` below, each marked
there: correct them there alone.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final


class UnknownInstanceTypeError(ValueError):
    pass


GIB = 1024**3


class TopologyKind(enum.StrEnum):
    SINGLE = "single"  # one device, nothing to connect
    RING = "ring"  # inf1/inf2: devices i and i+1 (mod n) are linked
    TORUS_2D = "torus2d"  # trn1.32xlarge, trn1n, trn2.48xlarge: a rows x cols torus
    # Trainium3: the devices are joined by NeuronSwitch, all to all (aws-neuron-sdk trn3-arch.rst:
    # "NeuronLink-v4 and NeuronSwitch-v1 (all-to-all, replacing the 2D torus)"): any set of a
    # node's devices is connected.
    SWITCH = "switch"


@dataclass(frozen=True, slots=True)
class Family:
    """What every instance of one accelerator generation shares."""

    name: str  # inf1, inf2, trn1, trn2, trn3
    arch_type: str  # info/architecture/arch_type
    sysfs_instance_type: str  # info/architecture/instance_type (the family, not the size)
    device_name: str  # info/architecture/device_name
    core_arch: str  # neuron_coreN/info/architecture/arch_type
    physical_cores_per_device: int
    memory_bytes_per_device: int
    pci_device_ids: tuple[int, ...]
    has_serial_number: bool  # info/serial_number exists on v2, v3 and v4 devices only
    supported_lnc: tuple[int, ...]  # logical-core settings the runtime accepts
    default_lnc: int


# -- Trainium3: what no source states, kept here alone ------------------------------------------------
# Every value below is UNCONFIRMED: no source line states it (ultraserver-and-trn3.md section 5). Each
# says what it rests on; correct it here and every service, the simulator and the chart follow.
@dataclass(frozen=True, slots=True)
class Trn3Unconfirmed:
    # unconfirmed: trn3.48xlarge (the driver's PDS platform) has 16 devices. The driver's PDS routing
    # table and core map have 16 devices and 128 cores (v4/neuron_dhal_v4.c), the Gen1 UltraServer is
    # 4 servers x 16 (trn3-arch.rst, which later says 4 per server), "a trn3 instance has 64 Neuron
    # cores" (vllm-neuron docs: 16 x 8 at LNC=2).
    trn3_48xlarge_devices: int = 16
    # unconfirmed: trn3e.24xlarge (the driver's MAX platform) has 4 devices. The driver's MAX routing
    # table has 4 (v4/neuron_dhal_v4.c); Gen2 UltraServers are 36 servers x 4 (trn3-arch.rst).
    trn3e_24xlarge_devices: int = 4
    # unconfirmed: the logical-core settings Trainium3 accepts, and its default; taken as trn2's
    # (8 physical cores; "64 Neuron cores" on 16 devices reads as LNC=2).
    supported_lnc: tuple[int, ...] = (1, 2)
    default_lnc: int = 2
    # unconfirmed: the sockets the devices spread over (only the simulator's PCI tree uses it).
    numa_nodes: int = 2
    # unconfirmed: the modes a trn3.48xlarge (PDS, node_cnt 4) lists in `ultraserver_mode`, as the driver's
    # mode numbers (1 = X4, 4 = X1; share/neuron_driver_shared.h): what the simulator writes.
    pds_modes: tuple[int, ...] = (1, 4)
    # unconfirmed: trn3p.48xlarge (the driver's ULTRASERVER platform) has 16 devices, as the PDS 48xlarge
    # types; the driver names it (v4_platform_map) but no routing table or page here gives its count.
    trn3p_48xlarge_devices: int = 16
    # unconfirmed: the driver's 3xlarge types (ndhal_instance_type_3xl) have one device each: a 3xlarge is
    # 1/16 of a 48xlarge, as trn2.3xlarge is of trn2.48xlarge; the driver only tells them apart by name.
    trn3_3xlarge_devices: int = 1
    # unconfirmed: AWS's chart 1.10 (a third-party copy of its values) lists trn3n.48xlarge and
    # trn3en.24xlarge, names the driver does not have. Read as trn1n.32xlarge is to trn1.32xlarge (the same
    # Neuron hardware, more network): the hardware of the driver's trn3.48xlarge and trn3e.24xlarge.
    chart_names: tuple[tuple[str, str], ...] = (
        ("trn3n.48xlarge", "trn3.48xlarge"),
        ("trn3en.24xlarge", "trn3e.24xlarge"),
    )


TRN3_UNCONFIRMED: Final = Trn3Unconfirmed()

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
        "trn3": Family(
            name="trn3",
            # The driver's sysfs names for Trainium3 (aws-neuron-driver v4/neuron_dhal_v4.c @ 9cc489e,
            # ndhal_register_funcs_trn3: type suffixes "v4", instance "Trn3", device "Trainium3").
            arch_type="NDv4",
            sysfs_instance_type="Trn3",
            device_name="Trainium3",
            core_arch="NCv4",
            physical_cores_per_device=8,  # 8 NeuronCore-v4 (aws-neuron-sdk trainium3.rst)
            memory_bytes_per_device=144 * GIB,  # 144 GiB HBM (aws-neuron-sdk trainium3.rst)
            # TRN3_DEVICE_ID0 and _ID1 (aws-neuron-driver neuron_device.h, neuron-code-sharing-robot @ 4b5e49d)
            pci_device_ids=(0x7564, 0x7565),
            has_serial_number=True,  # v4 registers over v3 (neuron_dhal_v4.c), whose info/ has serial_number
            supported_lnc=TRN3_UNCONFIRMED.supported_lnc,
            default_lnc=TRN3_UNCONFIRMED.default_lnc,
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
    if kind is TopologyKind.SWITCH:
        return {i: tuple(d for d in range(devices) if d != i) for i in range(devices)}
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


_TRN3_48XL = TRN3_UNCONFIRMED.trn3_48xlarge_devices
_TRN3E_24XL = TRN3_UNCONFIRMED.trn3e_24xlarge_devices
_TRN3_NUMA = TRN3_UNCONFIRMED.numa_nodes
_TRN3P_48XL = TRN3_UNCONFIRMED.trn3p_48xlarge_devices


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
            # Trainium3 (the names and platforms: aws-neuron-driver v4/neuron_dhal_v4.c's v4_platform_map).
            # trn3.48xlarge is the PDS platform, whose driver shows reservation_id, node_id and node_cnt
            # (4): a node of an UltraServer. trn3e.24xlarge is MAX (node_cnt 1: no group of nodes).
            _it("trn3.48xlarge", "trn3", _TRN3_48XL, TopologyKind.SWITCH, numa_nodes=_TRN3_NUMA, ultraserver=True),
            _it("trn3e.24xlarge", "trn3", _TRN3E_24XL, TopologyKind.SWITCH, numa_nodes=_TRN3_NUMA),
            # ULTRASERVER platform: an UltraServer's node, as trn3.48xlarge's PDS
            _it("trn3p.48xlarge", "trn3", _TRN3P_48XL, TopologyKind.SWITCH, numa_nodes=_TRN3_NUMA, ultraserver=True),
            # the driver's 3xlarge types (ndhal_instance_type_3xl): one device, nothing to connect
            _it("trn3pd98.3xlarge", "trn3", TRN3_UNCONFIRMED.trn3_3xlarge_devices, TopologyKind.SINGLE),
        )
    }
)

# Every Trainium3 type the driver names (aws-neuron-driver v4/neuron_dhal_v4.c @ 9cc489e: v4_platform_map
# and ndhal_instance_type_3xl; the -dev0/-dev1 names are AWS's own test platforms), which is what a
# Trainium3 node's DMI product name can say, to the table entry of its hardware. The driver groups
# them by platform (MAX, PDS, ULTRASERVER, 3xlarge) and handles each group alike: one entry a group.
TRN3_DRIVER_TYPES: Mapping[str, str] = MappingProxyType(
    {
        "trn3e.24xlarge": "trn3e.24xlarge",  # MAX
        "trn3.48xlarge": "trn3.48xlarge",  # PDS
        "trn3s-es.48xlarge": "trn3.48xlarge",
        "trn3sn.48xlarge": "trn3.48xlarge",
        "trn3sn-es.48xlarge": "trn3.48xlarge",
        "trn3p.48xlarge": "trn3p.48xlarge",  # ULTRASERVER
        "trn3pd98.3xlarge": "trn3pd98.3xlarge",  # 3xlarge
        "trn3s-es.3xlarge": "trn3pd98.3xlarge",
        "trn3sn.3xlarge": "trn3pd98.3xlarge",
        "trn3sn-es.3xlarge": "trn3pd98.3xlarge",
    }
)

# Other names of a table entry's hardware: the driver's names beyond each group's entry, and AWS's
# chart names (TRN3_UNCONFIRMED.chart_names). A node reporting one is that entry, under its own name.
ALIASES: Mapping[str, str] = MappingProxyType(
    {
        **{name: entry for name, entry in TRN3_DRIVER_TYPES.items() if name != entry},
        **dict(TRN3_UNCONFIRMED.chart_names),
    }
)

# Every name a node can be placed by: the chart's placement list must hold all of them.
ALL_NAMES: tuple[str, ...] = (*INSTANCE_TYPES, *ALIASES)


def lookup_instance_type(name: str) -> InstanceType | None:
    """The table entry a name (an entry's own, or an alias of its hardware) stands for; None if unknown."""
    return INSTANCE_TYPES.get(ALIASES.get(name, name))


def get_instance_type(name: str) -> InstanceType:
    it = lookup_instance_type(name)
    if it is None:
        known = ", ".join(ALL_NAMES)
        raise UnknownInstanceTypeError(f"unknown Neuron instance type {name!r}; known types: {known}")
    return it


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
