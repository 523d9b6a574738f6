"""One scan of the driver's sysfs into an immutable `NodeInventory`.

Bad input never aborts a scan: a missing or malformed attribute becomes `None` (unknown)
plus a `ScanIssue`; a device whose directory vanishes mid-scan is left out with a
`VANISHED` issue; the rest of the node still loads.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from neuron_driver import layout
from neuron_driver.attrs import ISSUE_LOG, log, read_text
from neuron_driver.errors import IssueKind, ScanIssue, SysfsError
from neuron_driver.lnc import LncSetting, resolve_lnc
from neuron_driver.parse import parse_connected_devices, parse_core_count, parse_int, parse_serial_number
from neuron_driver.ultraserver import read_ultraserver
from neuron_model import pci
from neuron_model.allocator import Topology
from neuron_model.instance_types import (
    InstanceType,
    TopologyKind,
    guess_instance_type,
    lookup_instance_type,
)
from neuron_model.ultraserver import State, UltraServerReading

T = TypeVar("T")


class InstanceTypeSource(enum.StrEnum):
    DMI = "dmi"  # /sys/class/dmi/id/product_name, which EC2 sets to the instance type
    GUESSED = "guessed"  # from the devices' family and count
    UNKNOWN = "unknown"


class TopologySource(enum.StrEnum):
    CONNECTED_DEVICES = "connected_devices"  # every device's own list
    MIXED = "mixed"  # some devices' lists were unreadable and came from the table
    TABLE = "table"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class LogicalCore:
    index: int  # global logical index, as NEURON_RT_VISIBLE_CORES counts
    device: int
    local: int  # logical index within its device
    physical: tuple[int, ...]  # the device's physical neuron_coreN directories behind it


@dataclass(frozen=True, slots=True)
class Device:
    index: int
    sysfs_path: str
    dev_node: str  # host path of /dev/neuronN under the root
    dev_node_present: bool
    physical_cores: int
    logical_cores: tuple[int, ...]  # global indices
    arch_type: str | None
    family_name: str | None  # info/architecture/instance_type: Inf1, Trn1, ...
    device_name: str | None
    serial: str | None
    connected: tuple[int, ...] | None  # None when connected_devices was unreadable
    numa_node: int | None


@dataclass(frozen=True)
class NodeInventory:
    root: str
    instance_type: InstanceType | None
    instance_type_name: str | None
    instance_type_source: InstanceTypeSource
    lnc: LncSetting
    devices: tuple[Device, ...]
    cores: tuple[LogicalCore, ...]
    adjacency: Mapping[int, tuple[int, ...]]
    topology_source: TopologySource
    issues: tuple[ScanIssue, ...] = field(default=())
    ultraserver: UltraServerReading = field(default=UltraServerReading(State.NONE))

    @property
    def logical_cores_per_device(self) -> int:
        return len(self.devices[0].logical_cores) if self.devices else 0

    def device(self, index: int) -> Device | None:
        for dev in self.devices:
            if dev.index == index:
                return dev
        return None

    def core(self, index: int) -> LogicalCore | None:
        for core in self.cores:
            if core.index == index:
                return core
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "instance_type": self.instance_type_name,
            "instance_type_source": str(self.instance_type_source),
            "topology": str(self.instance_type.topology) if self.instance_type else None,
            "topology_source": str(self.topology_source),
            "logical_nc_config": self.lnc.value,
            "logical_nc_config_source": str(self.lnc.source),
            "device_count": len(self.devices),
            "logical_cores_per_device": self.logical_cores_per_device,
            "core_count": len(self.cores),
            "memory_bytes_per_device": (self.instance_type.memory_bytes_per_device if self.instance_type else None),
            "devices": [
                {
                    "index": d.index,
                    "dev_node": d.dev_node,
                    "dev_node_present": d.dev_node_present,
                    "physical_cores": d.physical_cores,
                    "logical_cores": list(d.logical_cores),
                    "arch_type": d.arch_type,
                    "family": d.family_name,
                    "device_name": d.device_name,
                    "serial": d.serial,
                    "numa_node": d.numa_node,
                    "connected_devices": list(self.adjacency.get(d.index, ())),
                }
                for d in self.devices
            ],
            "issues": [{"kind": str(i.kind), "path": i.path, "message": i.message} for i in self.issues],
            "ultraserver": {
                "state": str(self.ultraserver.state),
                "reason": self.ultraserver.reason,
                "modes": [int(m) for m in self.ultraserver.identity.modes] if self.ultraserver.identity else [],
                "groups": {
                    str(size): {"server_id": server, "node_id": self.ultraserver.identity.node_ids[size]}
                    for size, server in sorted(self.ultraserver.identity.server_ids.items())
                }
                if self.ultraserver.identity
                else {},
            },
        }


@dataclass
class _RawDevice:
    index: int
    path: Path
    core_count: int | None
    core_dirs: int
    arch_type: str | None
    family_name: str | None
    device_name: str | None
    serial: str | None
    connected: tuple[int, ...] | None


class _DeviceVanished(Exception):
    pass


def list_device_indices(root: Path) -> tuple[list[int], list[ScanIssue]]:
    """Device indices from the class directory (or the devices directory when the class
    one is absent); class attributes such as `ultraserver_mode` are skipped."""
    for rel in (layout.CLASS_DIR, layout.DEVICES_DIR):
        try:
            names = os.listdir(root / rel)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return [], [ScanIssue(IssueKind.UNREADABLE, str(root / rel), f"cannot be listed: {exc.strerror}")]
        indices = sorted(int(m.group(1)) for n in names if (m := layout.DEVICE_NAME_RE.match(n)))
        return indices, []
    return [], [
        ScanIssue(
            IssueKind.MISSING, str(layout.HostLayout(root).class_dir), "no Neuron driver sysfs (is the driver loaded?)"
        )
    ]


def scan_at_start(root: Path, logger: logging.Logger, **extra: str) -> NodeInventory:
    """`scan(root)`, and what it found logged on `logger` (with `extra`), as a node agent starts."""
    inventory = scan(root)
    logger.info(
        "discovered %d Neuron device(s), %d logical core(s)",
        len(inventory.devices),
        len(inventory.cores),
        extra={"instance_type": inventory.instance_type_name, "logical_nc_config": inventory.lnc.value, **extra},
    )
    return inventory


def scan(root: str | Path = "/", env: Mapping[str, str] | None = None) -> NodeInventory:
    root = Path(root)
    env = os.environ if env is None else env
    indices, issues = list_device_indices(root)

    raws: list[_RawDevice] = []
    for index in indices:
        try:
            raws.append(_read_device(root, index, issues))
        except _DeviceVanished:
            issues.append(
                ScanIssue(
                    IssueKind.VANISHED,
                    str(layout.HostLayout(root).device_dir(index)),
                    "device directory vanished during the scan",
                )
            )

    instance, instance_name, instance_source = _instance_type(root, raws, issues)
    lnc, lnc_issues = resolve_lnc(root, instance.family if instance else None, env)
    issues.extend(lnc_issues)

    numa = _numa_nodes(root, instance.devices if instance else (max(indices) + 1 if indices else 0))
    devices: list[Device] = []
    cores: list[LogicalCore] = []
    for raw in raws:
        physical = _physical_cores(raw, instance, issues)
        per_device = max(physical // lnc.value, 0)
        if physical % lnc.value:
            issues.append(
                ScanIssue(
                    IssueKind.INVALID_CONFIG,
                    str(raw.path / "core_count"),
                    f"{physical} physical cores do not divide by logical NeuronCore config {lnc.value}",
                )
            )
        # Global indices are anchored on the device index, so a vanished device does not
        # renumber the cores of the devices after it.
        globals_ = tuple(raw.index * per_device + j for j in range(per_device))
        for j, g in enumerate(globals_):
            cores.append(LogicalCore(g, raw.index, j, tuple(range(j * lnc.value, (j + 1) * lnc.value))))
        node = layout.HostLayout(root).dev_node(raw.index)
        devices.append(
            Device(
                index=raw.index,
                sysfs_path=str(raw.path),
                dev_node=str(node),
                dev_node_present=node.exists(),
                physical_cores=physical,
                logical_cores=globals_,
                arch_type=raw.arch_type,
                family_name=raw.family_name,
                device_name=raw.device_name,
                serial=raw.serial,
                connected=raw.connected,
                numa_node=numa.get(raw.index),
            )
        )

    adjacency, topo_source = _adjacency(raws, instance, issues)
    for issue in issues:
        ISSUE_LOG.report(issue)
    return NodeInventory(
        root=str(root),
        instance_type=instance,
        instance_type_name=instance_name,
        instance_type_source=instance_source,
        lnc=lnc,
        devices=tuple(devices),
        cores=tuple(cores),
        adjacency=MappingProxyType(adjacency),
        topology_source=topo_source,
        issues=tuple(issues),
        ultraserver=read_ultraserver(root),
    )


class InventoryTracker:
    """The latest inventory, rescanned only when the set of listed devices changes.

    `refresh()` costs one directory listing, cheap enough for every health tick or scrape. It
    compares the *listed* indices (the driver drops a vanished device's class link), so a
    device that is listed but unreadable does not cause a rescan on every call.
    """

    def __init__(self, root: str | Path, inventory: NodeInventory | None = None) -> None:
        self.root = Path(root)
        if inventory is None:
            indices, _ = list_device_indices(self.root)
            inventory = scan(self.root)
            self._listed = tuple(indices)
        else:
            self._listed = tuple(d.index for d in inventory.devices)
        self.inventory = inventory

    def refresh(self) -> bool:
        """Rescan when the devices changed; True when `inventory` is new."""
        indices, _ = list_device_indices(self.root)
        listed = tuple(indices)
        if listed == self._listed:
            return False
        log.info("Neuron devices changed: %s -> %s; rescanning", list(self._listed), list(listed))
        self._listed = listed
        self.inventory = scan(self.root)
        return True


def _attr(path: Path, parse: Callable[[str], T], issues: list[ScanIssue], device_dir: Path) -> T | None:
    try:
        text = read_text(path)
    except SysfsError as exc:
        if exc.issue.kind is IssueKind.MISSING and not device_dir.exists():
            raise _DeviceVanished from None
        issues.append(exc.issue)
        return None
    try:
        return parse(text)
    except ValueError as exc:
        issues.append(ScanIssue(IssueKind.MALFORMED, str(path), str(exc)))
        return None


def _text(value: str) -> str:
    stripped = value.strip()
    if not stripped or not stripped.isprintable():
        raise ValueError(f"expected a name, found {value[:40]!r}")
    return stripped


def _read_device(root: Path, index: int, issues: list[ScanIssue]) -> _RawDevice:
    path = layout.HostLayout(root).device_dir(index)
    if not path.is_dir():
        raise _DeviceVanished
    arch = path / "info" / "architecture"
    core_count = _attr(path / "core_count", parse_core_count, issues, path)
    connected = _attr(path / "connected_devices", parse_connected_devices, issues, path)
    arch_type = _attr(arch / "arch_type", _text, issues, path)
    family_name = _attr(arch / "instance_type", _text, issues, path)
    device_name = _attr(arch / "device_name", _text, issues, path)
    serial_path = path / "info" / "serial_number"
    serial = None
    if serial_path.exists() or arch_type not in (None, "NDv1"):  # v1 devices have no serial
        serial = _attr(serial_path, parse_serial_number, issues, path)
    try:
        core_dirs = sum(1 for n in os.listdir(path) if layout.CORE_DIR_RE.match(n))
    except FileNotFoundError:
        raise _DeviceVanished from None
    return _RawDevice(index, path, core_count, core_dirs, arch_type, family_name, device_name, serial, connected)


def _instance_type(
    root: Path, raws: list[_RawDevice], issues: list[ScanIssue]
) -> tuple[InstanceType | None, str | None, InstanceTypeSource]:
    dmi = layout.HostLayout(root).dmi_product_name
    try:
        name = read_text(dmi).strip()
    except SysfsError:
        name = ""  # not every host exposes DMI; the devices still tell the family
    known = lookup_instance_type(name)  # a table entry, or another name of its hardware
    if known is not None:
        return known, name, InstanceTypeSource.DMI
    families = {r.family_name for r in raws if r.family_name}
    guess = guess_instance_type(next(iter(families)), len(raws)) if len(families) == 1 else None
    if name and raws:
        issues.append(
            ScanIssue(IssueKind.MISMATCH, str(dmi), f"product name {name!r} is not a known Neuron instance type")
        )
    if guess:
        return guess, guess.name, InstanceTypeSource.GUESSED
    return None, name or None, InstanceTypeSource.UNKNOWN


def _physical_cores(raw: _RawDevice, instance: InstanceType | None, issues: list[ScanIssue]) -> int:
    if raw.core_count is not None:
        return raw.core_count
    # core_count was unreadable (already reported): trust the table, then the directories.
    if instance is not None:
        return instance.physical_cores_per_device
    return raw.core_dirs


def _adjacency(
    raws: list[_RawDevice], instance: InstanceType | None, issues: list[ScanIssue]
) -> tuple[dict[int, tuple[int, ...]], TopologySource]:
    table = instance.adjacency() if instance else {}
    # NeuronSwitch joins every device to every other whatever `connected_devices` lists (today's driver
    # lists trn2's torus for Trainium3, a TODO in its source), and the allocator does not use the listed
    # links there: a different list is no mismatch worth an issue per device.
    check = instance is None or instance.topology is not TopologyKind.SWITCH
    result: dict[int, tuple[int, ...]] = {}
    from_sysfs = from_table = 0
    for raw in raws:
        if raw.connected is not None:
            result[raw.index] = tuple(sorted(raw.connected))
            from_sysfs += 1
            expected = table.get(raw.index)
            if check and expected is not None and tuple(sorted(expected)) != result[raw.index]:
                issues.append(
                    ScanIssue(
                        IssueKind.MISMATCH,
                        str(raw.path / "connected_devices"),
                        f"driver lists {list(result[raw.index])}, the {instance.name if instance else ''} "
                        f"table expects {list(expected)}; using the driver's",
                    )
                )
        elif raw.index in table:
            result[raw.index] = table[raw.index]
            from_table += 1
    if not raws:
        return result, TopologySource.NONE
    if from_table and from_sysfs:
        return result, TopologySource.MIXED
    if from_table:
        return result, TopologySource.TABLE
    return result, TopologySource.CONNECTED_DEVICES if from_sysfs else TopologySource.NONE


def _numa_nodes(root: Path, device_count: int) -> dict[int, int]:
    """NUMA node per device index, when the host exposes it.

    The driver's class devices are virtual (no parent link), so the device's PCI function
    is found by order: the driver probes Neuron PCI functions in bus order and numbers them
    from 0. Only used when the counts agree; otherwise unknown. Amazon's NIC and NVMe
    controller share the vendor id, so a Neuron function is told by its device id too.
    """
    pci_dir = layout.HostLayout(root).pci_devices_dir
    try:
        entries = sorted(os.listdir(pci_dir))
    except OSError:
        return {}
    nodes: list[int | None] = []
    for bdf in entries:
        try:
            vendor = int(read_text(pci_dir / bdf / "vendor").strip(), 16)
            device = int(read_text(pci_dir / bdf / "device").strip(), 16)
        except (SysfsError, ValueError):
            continue
        if not pci.is_neuron_function(vendor, device):
            continue
        try:
            node = parse_int(read_text(pci_dir / bdf / "numa_node"))
        except (SysfsError, ValueError):
            node = -1
        nodes.append(node if node >= 0 else None)
    if len(nodes) != device_count:
        return {}
    return {i: n for i, n in enumerate(nodes) if n is not None}


def topology_from(inventory: NodeInventory) -> Topology:
    """The topology of a scanned node: the driver's `connected_devices` win over the table."""
    cores_per_device = max(inventory.logical_cores_per_device, 1)
    it = inventory.instance_type
    if it is not None:
        return Topology(it.topology, it.devices, dict(inventory.adjacency), cores_per_device, it.torus_shape)
    count = max((d.index for d in inventory.devices), default=-1) + 1
    # Unknown instance type: only one device or all of them are known to be valid groups.
    return Topology(TopologyKind.SINGLE, count, dict(inventory.adjacency), cores_per_device, None)
