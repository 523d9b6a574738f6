"""The PCI functions of an EC2 node, as `/sys/bus/pci/devices/<address>/` shows them.

node-feature-discovery's `pci.device` feature reads `class`, `vendor`, `device`,
`subsystem_vendor` and `subsystem_device` of every function there (a function missing one is
skipped); the chart's NodeFeatureRule matches vendor 0x1d0f and the Neuron device ids of
`instance_types.FAMILIES`. Amazon's own non-Neuron functions (the ENA NIC, the EBS NVMe
controller, the VGA stub) carry vendor 0x1d0f too: a Neuron function is the vendor AND one of
the Neuron device ids, never the vendor alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_model.instance_types import FAMILIES, InstanceType

# Base class 0x08 "system peripheral", subclass 0x80 "other", programming interface 0: lspci lists
# Neuron functions as "System peripheral: Amazon.com, Inc. Device 7164". The driver source and the
# reference do not record the class; nothing here or in the chart matches on it.
NEURON_PCI_CLASS = 0x088000
INTEL_PCI_VENDOR = 0x8086
NEURON_PCI_VENDOR = 0x1D0F  # Amazon.com, Inc.: Neuron devices and Amazon's other Nitro functions


@dataclass(frozen=True, slots=True)
class PciFunction:
    address: str  # domain:bus:device.function, the directory name under /sys/bus/pci/devices
    vendor: int
    device: int
    class_code: int  # 24 bits: base class, subclass, programming interface
    subsystem_vendor: int
    subsystem_device: int
    numa_node: int = -1  # what the kernel writes when the platform reports no NUMA affinity

    def sysfs_attributes(self) -> dict[str, str]:
        """File name -> content, in the kernel's formats (pci-sysfs.c)."""
        return {
            "vendor": f"0x{self.vendor:04x}\n",
            "device": f"0x{self.device:04x}\n",
            "class": f"0x{self.class_code:06x}\n",
            "subsystem_vendor": f"0x{self.subsystem_vendor:04x}\n",
            "subsystem_device": f"0x{self.subsystem_device:04x}\n",
            "numa_node": f"{self.numa_node}\n",
        }


# What every Nitro instance has on bus 0, Neuron or not (the emulated 440FX chipset, the VGA stub,
# the EBS NVMe controller and the ENA NIC).
NITRO_FUNCTIONS: tuple[PciFunction, ...] = (
    PciFunction("0000:00:00.0", INTEL_PCI_VENDOR, 0x1237, 0x060000, 0x1D0F, 0x1237),  # host bridge
    PciFunction("0000:00:01.0", INTEL_PCI_VENDOR, 0x7000, 0x060100, 0x1D0F, 0x7000),  # ISA bridge
    PciFunction("0000:00:03.0", NEURON_PCI_VENDOR, 0x1111, 0x030000, 0x1D0F, 0x1111),  # VGA
    PciFunction("0000:00:04.0", NEURON_PCI_VENDOR, 0x8061, 0x010802, 0x1D0F, 0x8061),  # EBS NVMe
    PciFunction("0000:00:05.0", NEURON_PCI_VENDOR, 0xEC20, 0x020000, 0x1D0F, 0xEC20),  # ENA
)


def neuron_device_ids() -> tuple[int, ...]:
    """Every Neuron PCI device id, of every family, ascending."""
    return tuple(sorted({i for family in FAMILIES.values() for i in family.pci_device_ids}))


def is_neuron_function(vendor: int, device: int) -> bool:
    return vendor == NEURON_PCI_VENDOR and device in neuron_device_ids()


def neuron_functions(it: InstanceType) -> tuple[PciFunction, ...]:
    """The instance's Neuron functions in bus order, which is the order the driver numbers them from 0;
    spread evenly over its NUMA nodes."""
    per_node = max(it.devices // it.numa_nodes, 1)
    return tuple(
        PciFunction(
            address=f"0000:{0x10 + index:02x}:1e.0",
            vendor=NEURON_PCI_VENDOR,
            device=it.pci_device_id,
            class_code=NEURON_PCI_CLASS,
            # chosen: Amazon functions name Amazon as their subsystem vendor, with the device id again
            subsystem_vendor=NEURON_PCI_VENDOR,
            subsystem_device=it.pci_device_id,
            numa_node=min(index // per_node, it.numa_nodes - 1),
        )
        for index in range(it.devices)
    )


def node_functions(it: InstanceType | None) -> tuple[PciFunction, ...]:
    """Every PCI function of a node: a Neuron instance's, or (None) a node without Neuron devices."""
    return NITRO_FUNCTIONS + (neuron_functions(it) if it is not None else ())
