"""A simulated Neuron node: the driver's sysfs, /dev/neuronN and a kernel log, under a root.

The tree uses the driver's own formats (see `layout` and `shared/reference/neuron-stack.md`
section 3): `core_count` has no trailing newline, `connected_devices` is ``"1, 3, 4\\n"``,
inf1 devices carry the older ``infer_*`` status names and no serial number. Every write is
atomic (temporary file, then rename), as a sysfs read is: a reader never sees half a value.

Character devices (``--char-devices``, root only) use major `SIM_CHAR_MAJOR` (241, in the
240-254 block Linux reserves for local use) and minor N for /dev/neuronN, so a container
runtime can pass them into containers; without it, /dev/neuronN are empty regular files.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_driver import driver_layout, layout
from neuron_driver.files import replace_file
from neuron_driver.kmsg import KERN_ERR, KERN_INFO, format_hw_error, format_record
from neuron_health import faults
from neuron_model import pci
from neuron_model.instance_types import TRN3_UNCONFIRMED, InstanceType, UnknownInstanceTypeError, get_instance_type
from neuron_model.ultraserver import NO_SERVER, Mode, modal_node_id, pair_of, two_node_mode

SIM_CHAR_MAJOR = 241
STATE_DIR = ".neuron-sim"
VANISHED_DIR = ".neuron-sim/vanished"

_OWNED = ("sys", "dev", layout.NEURON_DIR, "proc/sys/kernel/random", STATE_DIR)


class SimError(Exception):
    pass


def write_attr(path: Path, text: str) -> None:
    replace_file(path, text)


def serial_for(instance: str, index: int) -> str:
    return hashlib.sha256(f"{instance}/{index}".encode()).hexdigest()[:16]


def _legacy(name: str) -> str:
    for old, new in layout.LEGACY_STATUS_NAMES.items():
        if new == name:
            return old
    return name


@dataclass(frozen=True)
class UltraServerSpec:
    """A node of a simulated UltraServer, as the driver shows it once its election is over."""

    node_id: int  # among node_count
    server_id: str  # the whole UltraServer's 16 hex digits (on Trainium3 PDS: the reservation's id)
    node_count: int = 4
    modes: tuple[Mode, ...] = (Mode.X4, Mode.X2H, Mode.X2V, Mode.X1)
    # Trainium3 PDS: `reservation_id`, `node_id` and `node_cnt` instead of trn2u's per-size attributes
    reservation: bool = False


def pds_spec(node_id: int, reservation_id: str, node_count: int = 4) -> UltraServerSpec:
    """A trn3.48xlarge node of a PDS reservation (its modes unconfirmed: TRN3_UNCONFIRMED.pds_modes)."""
    modes = tuple(Mode(m) for m in TRN3_UNCONFIRMED.pds_modes)
    return UltraServerSpec(node_id, reservation_id, node_count, modes, reservation=True)


def pair_server_id(server_id: str, mode: Mode, pair: int) -> str:
    """A 2-node group's server id on a 4-node UltraServer: distinct per pair, the same for both nodes."""
    return hashlib.sha256(f"{server_id}/{mode.name}/{pair}".encode()).hexdigest()[:16]


def write_ultraserver(
    root: Path, spec: UltraServerSpec | None, *, busy: bool = False, reservation: bool = False
) -> None:
    """The driver's UltraServer class attributes: `busy` while its election runs; with no spec,
    what a node outside any UltraServer reads (no modes, node id -1, a zero server id). With a
    reservation spec (or `reservation` for busy and none), Trainium3 PDS's attributes
    (`reservation_id`, `node_id`, `node_cnt`; aws-neuron-driver neuron_cdev.c)."""
    directory = layout.HostLayout(Path(root)).class_dir
    if reservation or (spec is not None and spec.reservation):
        modes = "busy" if busy else ",".join(str(int(m)) for m in spec.modes) if spec else ""
        write_attr(directory / "ultraserver_mode", modes + "\n")
        node_text = "busy" if busy else str(spec.node_id) if spec else "-1"
        write_attr(directory / "node_id", node_text + "\n")
        write_attr(directory / "node_cnt", f"{spec.node_count if spec and not busy else -1}\n")
        write_attr(directory / "reservation_id", (spec.server_id if spec and not busy else NO_SERVER) + "\n")
        return
    if busy or spec is None:
        write_attr(directory / "ultraserver_mode", "busy\n" if busy else "\n")
        for size in (4, 2):
            write_attr(directory / f"node_id_{size}", "busy\n" if busy else "-1\n")
            write_attr(directory / f"server_id_{size}", NO_SERVER + "\n")
        return
    write_attr(directory / "ultraserver_mode", ",".join(str(int(m)) for m in spec.modes) + "\n")
    ids: dict[int, tuple[int, str]] = {4: (-1, NO_SERVER), 2: (-1, NO_SERVER)}
    if Mode.X4 in spec.modes and spec.node_count == 4:
        ids[4] = (modal_node_id(spec.node_id, 4, Mode.X4), spec.server_id)
    pair_mode = two_node_mode(spec.modes)
    if pair_mode is not None and spec.node_count in (2, 4):
        server = spec.server_id
        if spec.node_count == 4:
            server = pair_server_id(spec.server_id, pair_mode, pair_of(spec.node_id, pair_mode))
        ids[2] = (modal_node_id(spec.node_id, spec.node_count, pair_mode), server)
    for size, (node, server) in ids.items():
        write_attr(directory / f"node_id_{size}", f"{node}\n")
        write_attr(directory / f"server_id_{size}", server + "\n")


def create_ultraserver(
    base: Path,
    instance_type: str,
    nodes: int = 4,
    server_id: str | None = None,
    node_ids: Iterable[int] | None = None,
    **create_args: Any,
) -> list[Path]:
    """Every node of one simulated UltraServer, under base/node-0 .. node-<nodes-1>, sharing its id.
    With `node_ids`, only those of its nodes, exactly as they would be with the others (a trn2 node
    is ~12,000 files: a test of one node's identity need not write four)."""
    it = get_instance_type(instance_type)
    if not it.ultraserver:
        raise SimError(f"{it.name} is not an UltraServer instance type")
    reservation = it.family.name == "trn3"  # Trainium3 PDS: a reservation of node_cnt (4) nodes
    if nodes not in ((4,) if reservation else (2, 4)):
        raise SimError(f"a {it.name} UltraServer has {'4' if reservation else '2 or 4'} nodes, not {nodes}")
    server_id = server_id or uuid.uuid4().hex[:16]
    if len(server_id) != 16 or server_id.strip("0123456789abcdef") or server_id == NO_SERVER:
        raise SimError(f"--server-id must be 16 lowercase hex digits, not all zero, got {server_id!r}")
    chosen = list(range(nodes) if node_ids is None else node_ids)
    if not set(chosen) <= set(range(nodes)):
        raise SimError(f"node ids {chosen} are not all among the {nodes} nodes of the UltraServer")
    roots = []
    for node_id in chosen:
        root = Path(base) / f"node-{node_id}"
        create(root, instance_type, **create_args)
        spec = pds_spec(node_id, server_id, nodes) if reservation else UltraServerSpec(node_id, server_id, nodes)
        write_ultraserver(root, spec)
        roots.append(root)
    return roots


def create(
    root: Path,
    instance_type: str,
    lnc: int | None = None,
    char_devices: bool = False,
    force: bool = False,
    *,
    driver_version: str | None = None,
) -> InstanceType:
    it = get_instance_type(instance_type)
    if lnc is not None and lnc not in it.family.supported_lnc:
        raise SimError(
            f"--lnc {lnc} is not supported on {it.name} (supported: {', '.join(map(str, it.family.supported_lnc))})"
        )
    generation = generation_of(driver_version)
    root = _fresh_root(root, force)
    # the name asked for, which may be another name of the entry's hardware (instance_types.ALIASES)
    write_attr(layout.HostLayout(root).dmi_product_name, instance_type + "\n")
    write_attr(layout.HostLayout(root).boot_id, str(uuid.uuid4()) + "\n")
    if lnc is not None:
        write_attr(layout.HostLayout(root).lnc_config, f"{lnc}\n")
    if driver_version:
        write_attr(layout.HostLayout(root).driver_version, driver_version + "\n")
    layout.HostLayout(root).class_dir.mkdir(parents=True, exist_ok=True)
    layout.HostLayout(root).dev_dir.mkdir(parents=True, exist_ok=True)
    adjacency = it.adjacency()
    for index in range(it.devices):
        _write_device(root, it, index, adjacency[index], generation)
        _make_dev_node(root, index, char_devices)
    _write_pci_functions(root, it)
    kmsg = layout.HostLayout(root).kmsg
    kmsg.touch()
    append_kmsg(root, "neuron: loading out-of-tree module taints kernel.", KERN_INFO)
    append_kmsg(root, f"neuron: Neuron Driver initialized, {it.devices} device(s) found", KERN_INFO)
    state = {"instance_type": it.name, "lnc": lnc, "char_devices": char_devices, "generation": generation.name}
    write_attr(root / STATE_DIR / "state.json", json.dumps(state, indent=2) + "\n")
    _save_reset_seen(root, {i: _reset_signature(root, i) for i in range(it.devices)})
    return it


# One driver version for each generation the simulator writes (driver_layout.SIMULATED), by the
# generation's name: the node agents' tests run on each, as a matrix. None writes no version file,
# the tree before 2.28.
GENERATION_VERSIONS: dict[str, str | None] = {"pre-2.28": None, "2.28": "2.28.0.0", "2.30.2": "2.30.2.0"}


def generation_of(driver_version: str | None) -> driver_layout.Generation:
    """The sysfs generation a driver version writes; without a version, the tree before 2.28 (the
    simulator's tree before it knew generations, which every existing test reads)."""
    if not driver_version:
        return driver_layout.PRE_2_28
    version = driver_layout.parse_version(driver_version)
    if version is None:
        raise SimError(f"--driver-version must be a dotted version such as 2.30.2.0, got {driver_version!r}")
    generation = driver_layout.generation_for(version)
    if not generation.paths_known:
        known = ", ".join(g.name for g in driver_layout.SIMULATED)
        raise SimError(
            f"driver {driver_version} is generation {generation.name}, which moved sysfs nodes to paths no "
            f"source here names (docs/driver-versions.md); the simulator writes the trees of {known}"
        )
    return generation


def create_non_neuron(root: Path, instance_type: str = "m5.xlarge", force: bool = False) -> None:
    """A node without Neuron devices: an EC2 instance's PCI functions (Amazon's own, vendor 0x1d0f
    included) and no Neuron driver, for checking that nothing takes it for a Neuron node."""
    root = _fresh_root(root, force)
    write_attr(layout.HostLayout(root).dmi_product_name, instance_type + "\n")
    write_attr(layout.HostLayout(root).boot_id, str(uuid.uuid4()) + "\n")
    layout.HostLayout(root).dev_dir.mkdir(parents=True, exist_ok=True)
    _write_pci_functions(root, None)
    layout.HostLayout(root).kmsg.touch()
    state = {"instance_type": instance_type, "neuron": False}
    write_attr(root / STATE_DIR / "state.json", json.dumps(state, indent=2) + "\n")


def _fresh_root(root: Path, force: bool) -> Path:
    root = Path(root)
    if (root / STATE_DIR).exists() or layout.HostLayout(root).devices_dir.exists():
        if not force:
            raise SimError(f"{root} already holds a simulated node; pass --force to replace it")
        destroy(root)
    root.mkdir(parents=True, exist_ok=True)
    return root


def _write_pci_functions(root: Path, it: InstanceType | None) -> None:
    for function in pci.node_functions(it):
        directory = layout.HostLayout(root).pci_devices_dir / function.address
        for name, text in function.sysfs_attributes().items():
            write_attr(directory / name, text)


class _FreshWriter:
    """Writes a tree nobody reads yet: no temporary files, each directory made once. Paths are
    strings: a trn2 node is ~12,000 files, and building a Path for each took a third of the time."""

    def __init__(self) -> None:
        self._made: set[str] = set()

    def __call__(self, path: str, text: str) -> None:
        parent = os.path.dirname(path)
        if parent not in self._made:
            os.makedirs(parent, exist_ok=True)
            self._made.add(parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


@functools.cache
def _core_files(it: InstanceType) -> tuple[tuple[str, str], ...]:
    """Each core directory's files, relative to it, and their first contents: the same for every
    core of a family, so worked out (through `layout`, which readers use too) once."""
    fam = it.family
    c = Path()
    files = [(c / "info" / "architecture" / "arch_type", fam.core_arch + "\n")]
    legacy = fam.name == "inf1"  # older driver builds, as on many inf1 AMIs, use infer_* names
    for status in layout.STATUS_NAMES:
        name = _legacy(status) if legacy else status
        for fld in layout.STATUS_FIELDS:
            files.append((layout.status_file(c, name, fld), "0\n"))
    core_mem = fam.memory_bytes_per_device // fam.physical_cores_per_device
    for location in ("host_mem", "device_mem"):
        for fld in layout.MEM_FIELDS:
            value = core_mem if (location, fld) == ("device_mem", "total") else 0
            files.append((layout.core_mem_total_file(c, location, fld), f"{value}\n"))
    for cat in layout.DEVICE_MEM_CATEGORIES:
        for fld in layout.MEM_FIELDS:
            files.append((layout.core_device_mem_file(c, cat, fld), "0\n"))
    for name in layout.OTHER_INFO:  # counter nodes, as the driver writes them: <name>/total, <name>/present
        files.append((layout.core_other_info_file(c, name) / "total", "0\n"))
        files.append((layout.core_other_info_file(c, name) / "present", "0\n"))
    return tuple((str(path), text) for path, text in files)


def _write_device(
    root: Path,
    it: InstanceType,
    index: int,
    connected: tuple[int, ...],
    generation: driver_layout.Generation = driver_layout.PRE_2_28,
) -> None:
    write = _FreshWriter()
    d = layout.HostLayout(root).device_dir(index)

    def write_attr(path: Path, text: str) -> None:
        write(str(path), text)

    fam = it.family
    write_attr(d / "core_count", str(fam.physical_cores_per_device))  # the driver writes no newline
    write_attr(d / "connected_devices", ", ".join(map(str, connected)) + "\n")
    write_attr(d / layout.RESET_FILE, f"{layout.DEVICE_STATE_READY}\n")  # a device the driver set up
    write_attr(d / "info" / "notify_delay", "0\n")
    if fam.has_serial_number:
        write_attr(d / "info" / "serial_number", serial_for(it.name, index) + "\n")
    arch = d / "info" / "architecture"
    write_attr(arch / "arch_type", fam.arch_type + "\n")
    write_attr(arch / "instance_type", fam.sysfs_instance_type + "\n")
    write_attr(arch / "device_name", fam.device_name + "\n")
    for name in layout.HARDWARE_COUNTERS:
        write_attr(layout.hardware_counter_file(d, name), "0\n")
    # Each generation's files, as the layout check expects them: one list for both.
    for relative in generation.device_paths(fam.name):
        name = relative.rsplit("/", 1)[-1]
        write_attr(d / relative, "\n" if name == layout.UNHEALTHY_COMPONENTS_FILE else "0\n")
    write_attr(layout.power_file(d), f"0,{int(time.time())},0,0,0\n")
    for cat in layout.HOST_MEM_CATEGORIES:
        for fld in layout.MEM_FIELDS:
            write_attr(layout.device_host_mem_file(d, cat, fld), "0\n")
    core_files = _core_files(it)
    for core in range(fam.physical_cores_per_device):
        c = str(layout.core_dir(d, core))
        for relative, text in core_files:
            write(os.path.join(c, relative), text)
    link = layout.HostLayout(root).class_link(index)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(Path("../../devices/virtual/neuron_device") / f"neuron{index}")


def _make_dev_node(root: Path, index: int, char_devices: bool) -> None:
    node = layout.HostLayout(root).dev_node(index)
    if node.exists() or node.is_symlink():
        node.unlink()
    if char_devices:
        try:
            os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(SIM_CHAR_MAJOR, index))
        except PermissionError:
            raise SimError("--char-devices needs root (CAP_MKNOD) to create /dev/neuronN character devices") from None
        os.chmod(node, 0o666)
    else:
        node.touch()


def destroy(root: Path) -> None:
    root = Path(root)
    for rel in _OWNED:
        target = root / rel
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)


def load_state(root: Path) -> dict[str, object]:
    path = Path(root) / STATE_DIR / "state.json"
    try:
        state: dict[str, object] = json.loads(path.read_text())
    except FileNotFoundError:
        raise SimError(f"{root} holds no simulated node (run 'neuron-sim create' first)") from None
    return state


def _instance(root: Path) -> InstanceType:
    try:
        return get_instance_type(str(load_state(root)["instance_type"]))
    except UnknownInstanceTypeError as exc:
        raise SimError(str(exc)) from None


def _device_dir(root: Path, device: int) -> Path:
    d = layout.HostLayout(root).device_dir(device)
    if not d.is_dir():
        raise SimError(f"device {device} does not exist under {root} (vanished or out of range)")
    return d


def counter_path(root: Path, device: int, name: str, core: int | None = None, field: str = "total") -> Path:
    """The file of a named counter: a core's status or other_info, or a device's hardware counter."""
    d = _device_dir(root, device)
    if core is None:
        path = layout.hardware_counter_file(d, name)
        if not path.is_file():
            path = layout.health_status_file(d, name)  # driver 2.28's firmware counters
        if not path.is_file() or name in (layout.UNHEALTHY_COMPONENTS_FILE, layout.HEARTBEAT_FILE):
            known = (*layout.HARDWARE_COUNTERS, *layout.CORRECTED_COUNTERS, *layout.HEALTH_STATUS_COUNTERS)
            raise SimError(
                f"device {device} has no hardware counter {name!r} (known, by driver generation: {', '.join(known)})"
            )
        return path
    c = layout.core_dir(d, core)
    if not c.is_dir():
        raise SimError(f"device {device} has no physical core {core}")
    for candidate in (name, _legacy(name)):
        status = layout.status_file(c, candidate, field)
        if status.exists():
            return status
    other = layout.core_other_info_value_file(c, name)
    if other.is_file():
        return other
    raise SimError(f"core {core} of device {device} has no counter {name!r} (a status name or other_info name)")


def bump_counter(root: Path, device: int, name: str, core: int | None = None, field: str = "total", by: int = 1) -> int:
    path = counter_path(root, device, name, core, field)
    try:
        current = int(path.read_text().strip())
    except ValueError:
        current = 0  # a previously injected garbage value: start again from zero
    new = current + by
    write_attr(path, f"{new}\n")
    if core is not None and field == "total" and path.parent.parent.name == "status":
        present = path.parent / "present"
        if present.exists():
            try:
                write_attr(present, f"{int(present.read_text().strip()) + by}\n")
            except ValueError:
                write_attr(present, f"{by}\n")
    return new


def set_counter_raw(
    root: Path, device: int, name: str, text: str, core: int | None = None, field: str = "total"
) -> None:
    write_attr(counter_path(root, device, name, core, field), text)


def set_memory(
    root: Path, device: int, category: str, present: int, core: int | None = None, location: str = "device_mem"
) -> None:
    d = _device_dir(root, device)
    if core is None:
        if category not in layout.HOST_MEM_CATEGORIES:
            raise SimError(
                f"unknown host memory category {category!r} (known: {', '.join(layout.HOST_MEM_CATEGORIES)})"
            )
        base = layout.device_host_mem_file(d, category, "present").parent
    else:
        c = layout.core_dir(d, core)
        if location == "device_mem":
            if category not in layout.DEVICE_MEM_CATEGORIES:
                raise SimError(
                    f"unknown device memory category {category!r} (known: {', '.join(layout.DEVICE_MEM_CATEGORIES)})"
                )
            base = layout.core_device_mem_file(c, category, "present").parent
        else:
            base = layout.core_mem_total_file(c, "host_mem", "present").parent
    write_attr(base / "present", f"{present}\n")
    peak_file = base / "peak"
    try:
        peak = int(peak_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        peak = 0
    write_attr(peak_file, f"{max(peak, present)}\n")


def set_power(root: Path, device: int, min_power: int, max_power: int, avg_power: int, status: int = 0) -> None:
    d = _device_dir(root, device)
    write_attr(layout.power_file(d), f"{status},{int(time.time())},{min_power},{max_power},{avg_power}\n")


def vanish(root: Path, device: int) -> None:
    """The device disappears from sysfs and /dev, as when the driver drops it."""
    root = Path(root)
    d = _device_dir(root, device)
    stash = root / VANISHED_DIR / d.name
    stash.parent.mkdir(parents=True, exist_ok=True)
    layout.HostLayout(root).class_link(device).unlink(missing_ok=True)
    os.replace(d, stash)
    layout.HostLayout(root).dev_node(device).unlink(missing_ok=True)


def restore(root: Path, device: int) -> None:
    root = Path(root)
    stash = root / VANISHED_DIR / f"neuron{device}"
    if not stash.is_dir():
        raise SimError(f"device {device} has not vanished")
    os.replace(stash, layout.HostLayout(root).device_dir(device))
    layout.HostLayout(root).class_link(device).symlink_to(
        Path("../../devices/virtual/neuron_device") / f"neuron{device}"
    )
    _make_dev_node(root, device, bool(load_state(root).get("char_devices")))


def _last_seq(kmsg: Path) -> int:
    try:
        with kmsg.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            tail = f.read().decode("ascii", "replace")
    except FileNotFoundError:
        return -1
    for line in reversed(tail.splitlines()):
        head = line.split(";", 1)[0].split(",")
        if len(head) >= 4 and head[1].isdigit():
            return int(head[1])
    return -1


def _usec_since_boot() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1000


def append_kmsg(root: Path, message: str, priority: int = KERN_INFO) -> int:
    """Append one record to the simulated kernel log; returns its sequence number."""
    return append_kmsg_many(root, [message], priority)


def append_kmsg_many(root: Path, messages: list[str], priority: int = KERN_INFO) -> int:
    kmsg = layout.HostLayout(Path(root)).kmsg
    seq = _last_seq(kmsg)
    usec = _usec_since_boot()
    lines = []
    for message in messages:
        seq += 1
        lines.append(format_record(priority, seq, usec, message))
    with kmsg.open("a") as f:  # one write: a follower never sees half a record
        f.write("".join(lines))
    return seq


def append_raw_kmsg(root: Path, text: str) -> None:
    """Append text as is (for malformed-record tests)."""
    with (layout.HostLayout(Path(root)).kmsg).open("a") as f:
        f.write(text)


def inject_hw_error(
    root: Path, kind: str, device: int, core: int, action: str = "TERMINATE_INSTANCE", serial: str | None = None
) -> int:
    it = _instance(root)
    if serial is None:
        serial = serial_for(it.name, device) if it.family.has_serial_number else "0000000000000000"
    return append_kmsg(root, format_hw_error(kind, device, core, serial, action), KERN_ERR)


FAULT_SOURCES = ("kernel", "device-counter", "core-counter", "firmware")


def inject_fault(
    root: Path, kind: str, device: int, via: str = "kernel", core: int = 0, transient: bool = False
) -> str:
    """Make a fault of the table show the way `via` says: the runtime's (or the driver's) kernel
    line, or one more on the device counter or core status counter the table names for it.
    `transient`: a firmware verdict entry a device reset ends (`reset_device`); else a defect."""
    if transient and via != "firmware":
        raise SimError("only the firmware's verdict (--via firmware) has a transient state: counters are cumulative")
    fault = faults.BY_KIND.get(kind)
    if fault is None or fault in (faults.UNKNOWN_FATAL, faults.UNKNOWN_NOTICE):
        raise SimError(f"unknown fault kind {kind!r}; one of: {', '.join(f.kind for f in faults.FAULTS)}")
    firmware = [c for c in fault.device_counters if layout.is_firmware_counter(c)]
    if via == "firmware":
        if not firmware:
            raise SimError(f"{kind} does not show through 'firmware' (the firmware's verdict)")
        if firmware[0] == layout.HEARTBEAT_STALE_COUNTER:
            raise SimError(
                "a heartbeat goes stale by standing still: beat it once (inject heartbeat) and let "
                "the watch's stale-after pass"
            )
        component = firmware[0].removeprefix(layout.FIRMWARE_COUNTER_PREFIX)
        path = layout.health_status_file(_device_dir(root, device), layout.UNHEALTHY_COMPONENTS_FILE)
        listed = [c for c in (path.read_text().strip().split(",") if path.exists() else []) if c]
        chosen = listed if component in listed else [*listed, component]
        marked = [component] if transient else []
        return f"unhealthy_components={set_unhealthy_components(root, device, chosen, transient=marked)}"
    if via == "kernel":
        if fault.kernel_names:
            return f"kernel line {inject_hw_error(root, fault.kernel_names[0], device, core)}"
        if kind in DRIVER_LINE_EXAMPLES:
            example = DRIVER_LINE_EXAMPLES[kind].format(device=device)
            return f"kernel line {append_kmsg(root, example, KERN_ERR)}"
        raise SimError(f"{kind} does not show through 'kernel' (it shows through {', '.join(sources_of(fault))})")
    # the firmware's verdict is no file to bump: `via="firmware"` writes it
    counters = [
        c
        for c in (fault.device_counters if via == "device-counter" else fault.core_counters)
        if not layout.is_firmware_counter(c)
    ]
    if via not in FAULT_SOURCES[1:3] or not counters:
        raise SimError(f"{kind} does not show through {via!r} (it shows through {', '.join(sources_of(fault))})")
    name = counters[0]
    value = bump_counter(root, device, name, core if via == "core-counter" else None)
    return f"{name}={value}"


def sources_of(fault: faults.Fault) -> list[str]:
    """The `via`s `inject_fault` takes for a fault (none for a stale heartbeat: time makes it, not a write)."""
    firmware = any(layout.is_firmware_counter(c) and c != layout.HEARTBEAT_STALE_COUNTER for c in fault.device_counters)
    counters = [c for c in fault.device_counters if not layout.is_firmware_counter(c)]
    return [
        via
        for via, has in zip(FAULT_SOURCES, (fault.kernel_pattern, counters, fault.core_counters, firmware), strict=True)
        if has
    ]


def set_unhealthy_components(
    root: Path, device: int, components: Iterable[str], *, transient: Iterable[str] = ()
) -> str:
    """The firmware's verdict on a device (driver 2.30.2, trn2/trn3): its failing subsystems, as the
    driver writes them (comma-separated); none clears it. Each listed subsystem is a persistent defect,
    which a device reset leaves listed, unless it is among `transient` (a state a reset ends)."""
    chosen = [c.strip() for c in components if c.strip()]
    marked = {c.strip() for c in transient if c.strip()}
    if not marked <= set(chosen):
        raise SimError(f"--transient names {', '.join(sorted(marked - set(chosen)))}, which is not listed")
    unknown = [c for c in chosen if c not in layout.UNHEALTHY_COMPONENTS]
    if unknown:
        raise SimError(f"unknown component(s) {', '.join(unknown)}; one of: {', '.join(layout.UNHEALTHY_COMPONENTS)}")
    path = layout.health_status_file(_device_dir(root, device), layout.UNHEALTHY_COMPONENTS_FILE)
    if not path.exists():
        raise SimError(
            f"device {device} has no {layout.UNHEALTHY_COMPONENTS_FILE}: create the node with "
            f"--driver-version 2.30.2 or later on trn2 or trn3"
        )
    text = ",".join(chosen)
    write_attr(path, text + "\n")
    marks = _load_marks(root)
    entry = marks.setdefault(str(device), {})
    entry["transient"] = sorted(marked | (set(entry.get("transient", [])) & set(chosen)))
    _save_marks(root, marks)
    return text


def beat_heartbeat(root: Path, device: int, value: str | None = None) -> str:
    """One beat of the firmware's `healthcheck_heartbeat` (it moves on by one), or `value` written as is.
    A heartbeat nobody beats again goes stale, as a firmware that stopped its health checks does."""
    path = layout.health_status_file(_device_dir(root, device), layout.HEARTBEAT_FILE)
    if not path.exists():
        raise SimError(
            f"device {device} has no {layout.HEARTBEAT_FILE}: create the node with --driver-version 2.30.2 or later"
        )
    if value is None:
        try:
            value = str(int(path.read_text().strip()) + 1)
        except ValueError:
            value = "1"
    write_attr(path, value + "\n")
    return value


def move_node(root: Path, device: int, relative: str, to: str) -> Path:
    """Rename a directory or file of a device's tree (`stats/hardware` -> `stats/hardware_v2`), as a
    driver that moved a node shows it: for checking that nothing reads such a tree as healthy."""
    d = _device_dir(root, device)
    source, target = d / relative, d / to
    if not source.exists():
        raise SimError(f"device {device} has no {relative}")
    if target.exists():
        raise SimError(f"device {device} already has {to}")
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(source, target)
    return target


# What the driver writes, for the table's driver-message faults (`neuron_health.faults`).
DRIVER_LINE_EXAMPLES = {
    "DMA_COMPLETION_TIMEOUT": "neuron:ndma_wait: DMA completion timeout on nd{device:02d} queue 2",
    "RESET_FAILED": "neuron:nr_reset: nd{device}: reset request 7 failed",
    "DMA_INIT_AFTER_RESET_FAILED": "neuron:nr_reset: failed to initialize dma after reset",
}


def reload_driver(root: Path) -> None:
    """As after `rmmod neuron; modprobe neuron`: every error counter starts again from zero."""
    for device_path in sorted(layout.HostLayout(root).devices_dir.glob("neuron*")):
        # health_status/ holds the firmware's own registers and verdict: a reload reads them afresh
        for path in device_path.glob("stats/hardware/*"):
            if path.is_file():
                write_attr(path, "0\n")
        for path in device_path.glob("neuron_core*/stats/status/*/*"):
            write_attr(path, "0\n")


def reboot(root: Path) -> str:
    """A new boot id, as after a reboot; the kernel log starts over. The firmware starts afresh too: what a
    device reset ends (`reset_device`) ends, a defect stays (counters are the driver's: see `reload_driver`)."""
    boot_id = str(uuid.uuid4())
    write_attr(layout.HostLayout(Path(root)).boot_id, boot_id + "\n")
    (layout.HostLayout(Path(root)).kmsg).write_text("")
    marks = _load_marks(root)
    for device, entry in list(marks.items()):
        d = layout.HostLayout(Path(root)).device_dir(int(device))
        verdict = layout.health_status_file(d, layout.UNHEALTHY_COMPONENTS_FILE)
        transient = set(entry.pop("transient", []))
        if transient and verdict.exists():
            listed = [c for c in verdict.read_text().strip().split(",") if c]
            write_attr(verdict, ",".join(c for c in listed if c not in transient) + "\n")
        if entry.get("heartbeat") != "persistent":
            entry.pop("heartbeat", None)
        if not entry:
            del marks[device]
    if marks or (Path(root) / MARKS_FILE).exists():
        _save_marks(root, marks)
    return boot_id


# -- the driver's device reset ---------------------------------------------------------------------
# What a write of /sys/class/neuron_device/neuron<N>/reset does on a real host (aws-neuron-driver
# 2.24.7 neuron_cdev.c `driver_reset_store`, neuron_reset.c `nr_start_ncs`, `nr_reset_thread_fn`):
# the device state goes to RESET, every core's `reset_req_count` goes up by one, the reset thread logs
# "initiating device reset request" and "reset request ... completed", and the state goes to READY.
# The driver's source says nothing of what a reset mends, so what the simulator mends is its own
# model, and says so: a firmware verdict entry marked transient (`set_unhealthy_components(...,
# transient=...)`) and a heartbeat stall not marked persistent end; a defect stays listed; every
# counter stays cumulative (the driver zeroes none of them on a reset).
RESET_REQUEST_ALL = 0xFFFFFFFF  # NEURON_RESET_REQUEST_ALL: the id the driver logs for a sysfs reset
MARKS_FILE = f"{STATE_DIR}/marks.json"  # per device: transient verdict entries, heartbeat stall
RESET_SEEN_FILE = f"{STATE_DIR}/reset-seen.json"  # each reset node as the simulator last left it


def _load_json(root: Path, relative: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((Path(root) / relative).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data


def _load_marks(root: Path) -> dict[str, dict[str, Any]]:
    return _load_json(root, MARKS_FILE)


def _save_marks(root: Path, marks: dict[str, dict[str, Any]]) -> None:
    write_attr(Path(root) / MARKS_FILE, json.dumps(marks, indent=2, sort_keys=True) + "\n")


def _reset_signature(root: Path, device: int) -> list[int] | None:
    try:
        st = layout.HostLayout(Path(root)).reset_node(device).stat()
    except OSError:
        return None
    return [st.st_ino, st.st_mtime_ns, st.st_size]


def _save_reset_seen(root: Path, seen: dict[int, list[int] | None]) -> None:
    write_attr(Path(root) / RESET_SEEN_FILE, json.dumps({str(k): v for k, v in seen.items()}) + "\n")


def stall_heartbeat(root: Path, device: int, persistent: bool = False) -> str:
    """The firmware's health checks stop: `serve_driver`'s heartbeat no longer moves for this device.
    A reset restarts them, unless `persistent` (checks that a reset does not bring back)."""
    _device_dir(root, device)
    marks = _load_marks(root)
    marks.setdefault(str(device), {})["heartbeat"] = "persistent" if persistent else "stalled"
    _save_marks(root, marks)
    return "persistent" if persistent else "stalled"


def resume_heartbeat(root: Path, device: int, mended: bool = False) -> str:
    """The firmware's health checks start again by themselves, no reset asked (what a validation in place
    waits for): `serve_driver` beats the device again. A persistent stall does not resume, unless
    `mended` (the device replaced: what a test's cleanup leaves)."""
    _device_dir(root, device)
    marks = _load_marks(root)
    entry = marks.get(str(device), {})
    if entry.get("heartbeat") == "persistent" and not mended:
        return "persistent: not resumed"
    entry.pop("heartbeat", None)
    if entry:
        marks[str(device)] = entry
    else:
        marks.pop(str(device), None)
    _save_marks(root, marks)
    beat_heartbeat(root, device)
    return "resumed"


def heartbeat_stalled(root: Path, device: int) -> bool:
    return bool(_load_marks(root).get(str(device), {}).get("heartbeat"))


def device_state(root: Path, device: int) -> int:
    """What the device's reset node reads: `layout.DEVICE_STATE_*`."""
    return int(layout.HostLayout(Path(root)).reset_node(device).read_text().strip())


def reset_device(root: Path, device: int) -> list[str]:
    """One device reset, as the driver's reset thread carries it out; returns what it ended."""
    root = Path(root)
    d = _device_dir(root, device)
    node = layout.HostLayout(root).reset_node(device)
    write_attr(node, f"{layout.DEVICE_STATE_RESET}\n")
    for path in sorted(layout.core_other_info_value_file(c, "reset_req_count") for c in d.glob("neuron_core*")):
        try:
            write_attr(path, f"{int(path.read_text().strip()) + 1}\n")
        except ValueError:
            write_attr(path, "1\n")
    append_kmsg(root, f"neuron:nr_reset_thread_fn: nd{device}: initiating device reset request {RESET_REQUEST_ALL}")
    ended: list[str] = []
    marks = _load_marks(root)
    entry = marks.get(str(device), {})
    transient = set(entry.get("transient", []))
    verdict = layout.health_status_file(d, layout.UNHEALTHY_COMPONENTS_FILE)
    if transient and verdict.exists():
        listed = [c for c in verdict.read_text().strip().split(",") if c]
        ended += [f"unhealthy_components:{c}" for c in listed if c in transient]
        write_attr(verdict, ",".join(c for c in listed if c not in transient) + "\n")
        entry["transient"] = []
    heartbeat = layout.health_status_file(d, layout.HEARTBEAT_FILE)
    if entry.get("heartbeat") != "persistent" and heartbeat.exists():
        if entry.pop("heartbeat", None):
            ended.append("healthcheck_heartbeat:stalled")
        beat_heartbeat(root, device)  # the firmware starts its health checks afresh
    if entry:
        marks[str(device)] = entry
    else:
        marks.pop(str(device), None)
    _save_marks(root, marks)
    append_kmsg(root, f"neuron:nr_reset_thread_fn: nd{device}: reset request {RESET_REQUEST_ALL} completed")
    write_attr(node, f"{layout.DEVICE_STATE_READY}\n")
    seen = {int(k): v for k, v in _load_json(root, RESET_SEEN_FILE).items()}
    seen[device] = _reset_signature(root, device)
    _save_reset_seen(root, seen)
    return ended


def apply_reset_requests(root: Path) -> dict[int, list[str]]:
    """Every device whose reset node was written since the simulator last left it is reset (the
    driver's store handler): a real driver ignores what is written, so any write counts."""
    root = Path(root)
    seen = {int(k): v for k, v in _load_json(root, RESET_SEEN_FILE).items()}
    done: dict[int, list[str]] = {}
    for device in range(_instance(root).devices):
        signature = _reset_signature(root, device)
        if signature is not None and signature != seen.get(device):
            done[device] = reset_device(root, device)
    return done


def serve_driver(
    root: Path, interval: float = 0.2, heartbeat_every: float = 0.0, count: int = 0, out: Any = None
) -> int:
    """The driver's side of a simulated node, in a loop: each write of a reset node resets that device
    (`apply_reset_requests`); with `heartbeat_every`, the firmware's heartbeat of every device whose
    checks are not stalled moves on that often. `count`: passes, then return (0: forever)."""
    root = Path(root)
    load_state(root)
    passes, last_beat = 0, 0.0
    while True:
        for device, ended in apply_reset_requests(root).items():
            if out is not None:
                print(f"neuron{device}: reset; ended: {', '.join(ended) or 'nothing'}", file=out, flush=True)
        now = time.monotonic()
        if heartbeat_every > 0 and now - last_beat >= heartbeat_every:
            last_beat = now
            marks = _load_marks(root)
            for device in range(_instance(root).devices):
                beating = not marks.get(str(device), {}).get("heartbeat")
                d = layout.HostLayout(root).device_dir(device)  # a vanished device beats no more
                if beating and layout.health_status_file(d, layout.HEARTBEAT_FILE).exists():
                    beat_heartbeat(root, device)
        passes += 1
        if count and passes >= count:
            return 0
        time.sleep(interval)
