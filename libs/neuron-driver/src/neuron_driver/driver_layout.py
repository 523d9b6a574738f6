"""Driver generations, and a check that compares what a node's driver exposes with what the stack reads.

The driver's sysfs grew over its releases (docs/driver-versions.md has the sources):
- before 2.28: `stats/hardware/{sram_ecc_uncorrected, mem_ecc_uncorrected, mem_ecc_repairable_uncorrected}`;
- 2.28.0: `stats/hardware/health_status/` (the firmware's cached health registers);
- 2.30.2: `health_status/unhealthy_components` and `healthcheck_heartbeat` (TRN2 and TRN3), and the
  corrected ECC counts;
- 2.31: "reorganized the Neuron sysfs tree and moved several nodes to new paths" (AWS's Neuron Sysfs
  User Guide, v2.33.0). Which nodes moved, and where to, is in no source stored here, so a 2.31
  driver is checked against the 2.30.2 paths, and every one it lacks is named.

The counter plan (`counters.CounterReader`) follows the directory listing, so a counter that is not
where the stack looks is simply never read. This check is what makes that loud: it names, per
device, every path the stack expected for the node's generation and did not find, with what it
found instead (the directory gone, or a file of that name elsewhere in the device's tree: moved or
renamed). The per-core counters it expects are the hardware-error statuses (`HW_ERROR_STATUS_NAMES`),
which `neuron_health`'s tests hold to the fault table's, so a fault-table counter cannot go unchecked.
"""

from __future__ import annotations

import enum
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from neuron_driver import layout
from neuron_driver.attrs import read_text
from neuron_driver.errors import SysfsError

if TYPE_CHECKING:
    from neuron_driver.inventory import NodeInventory

Version = tuple[int, ...]

# The per-core statuses a hardware fault shows in (NDS_EXT_NC_COUNTER_HW_ERR_*): what the health
# stack reads from each core, and so what the check expects on each.
HW_ERROR_STATUS_NAMES: tuple[str, ...] = (
    "hw_collectives_error",
    "hw_hbm_ue_error",
    "hw_nc_ue_error",
    "hw_dma_abort_error",
    "hw_repairable_hbm_ue_error",
)

# Families whose 2.30.2 driver writes the firmware's verdict ("enabled on both TRN2 and TRN3").
FIRMWARE_VERDICT_FAMILIES = frozenset({"trn2", "trn3"})


@dataclass(frozen=True)
class Generation:
    """One generation of the driver's sysfs tree, as far as the stack reads it."""

    name: str
    since: Version  # the first driver version with this tree
    health_status: bool = False  # stats/hardware/health_status/ and its counters
    firmware_verdict: bool = False  # health_status/{unhealthy_components, healthcheck_heartbeat}
    corrected_counters: bool = False  # stats/hardware/{sram,mem}_ecc_corrected
    live_counters: bool = False  # other_info and status counters live, not as of process exit
    paths_known: bool = True  # False: the driver moved nodes to paths no source here names
    source: str = ""

    def device_paths(self, family: str | None) -> tuple[str, ...]:
        """Paths, relative to a device's directory, the stack reads on a driver of this generation."""
        paths = [f"stats/hardware/{name}" for name in layout.HARDWARE_COUNTERS]
        if self.corrected_counters:
            paths += [f"stats/hardware/{name}" for name in layout.CORRECTED_COUNTERS]
        if self.health_status:
            paths += [f"stats/hardware/{layout.HEALTH_STATUS_DIR}/{n}" for n in layout.HEALTH_STATUS_COUNTERS]
        if self.firmware_verdict and family in FIRMWARE_VERDICT_FAMILIES:
            paths += [
                f"stats/hardware/{layout.HEALTH_STATUS_DIR}/{layout.UNHEALTHY_COMPONENTS_FILE}",
                f"stats/hardware/{layout.HEALTH_STATUS_DIR}/{layout.HEARTBEAT_FILE}",
            ]
        return tuple(paths)


PRE_2_28 = Generation("pre-2.28", (0,), source="aws-neuron-driver 2.24-2.27 neuron_sysfs_metrics.c")
GEN_2_28 = Generation(
    "2.28", (2, 28), health_status=True, source="runtime.rst (driver 2.28.0.0); neuron_sysfs_metrics.c 2.28.0.0"
)
GEN_2_30_2 = Generation(
    "2.30.2",
    (2, 30, 2),
    health_status=True,
    firmware_verdict=True,
    corrected_counters=True,
    live_counters=True,
    source="runtime.rst (driver 2.30.2)",
)
GEN_2_31 = Generation(
    "2.31",
    (2, 31),
    health_status=True,
    firmware_verdict=True,
    corrected_counters=True,
    live_counters=True,
    paths_known=False,
    source="Neuron Sysfs User Guide v2.33.0: 'reorganized the Neuron sysfs tree'; the moved paths are not known",
)
GENERATIONS: tuple[Generation, ...] = (PRE_2_28, GEN_2_28, GEN_2_30_2, GEN_2_31)
BY_NAME = {g.name: g for g in GENERATIONS}
# The trees neuron-sim can write: every generation whose paths are known.
SIMULATED: tuple[Generation, ...] = tuple(g for g in GENERATIONS if g.paths_known)

_VERSION_RE = re.compile(r"^\s*(\d+(?:\.\d+)*)")


def parse_version(text: str) -> Version | None:
    """`2.30.2.0` -> (2, 30, 2, 0); None for text that does not start with a dotted number."""
    match = _VERSION_RE.match(text)
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


def generation_for(version: Version) -> Generation:
    chosen = PRE_2_28
    for gen in GENERATIONS:
        if version >= gen.since:
            chosen = gen
    return chosen


class GenerationSource(enum.StrEnum):
    VERSION = "version"  # sys/module/neuron/version
    LAYOUT = "layout"  # no readable version: told by which directories the tree has


def _from_layout(device_dirs: Sequence[Path]) -> Generation:
    for ddir in device_dirs[:1]:
        hs = layout.health_status_dir(ddir)
        if (hs / layout.UNHEALTHY_COMPONENTS_FILE).exists() or (ddir / "stats/hardware/mem_ecc_corrected").exists():
            return GEN_2_30_2
        if hs.is_dir():
            return GEN_2_28
    return PRE_2_28


def detect(root: Path, device_dirs: Sequence[Path]) -> tuple[Generation, GenerationSource, str | None]:
    """The node's generation, what told it, and the version text (None when unreadable)."""
    try:
        text = read_text(layout.HostLayout(Path(root)).driver_version).strip()
    except SysfsError:
        text = None
    version = parse_version(text) if text else None
    if version is not None:
        return generation_for(version), GenerationSource.VERSION, text
    return _from_layout(device_dirs), GenerationSource.LAYOUT, text


@dataclass(frozen=True, slots=True)
class MissingPath:
    device: int
    core: int | None  # physical core, for a per-core counter
    path: str  # relative to the device's directory
    found_instead: str  # what the device's tree shows instead (the diagnosis)

    def __str__(self) -> str:
        where = f"neuron{self.device}" + (f"/neuron_core{self.core}" if self.core is not None else "")
        return f"{where}: {self.path} not found ({self.found_instead})"


@dataclass(frozen=True)
class LayoutReport:
    root: str
    generation: Generation
    generation_source: GenerationSource
    driver_version: str | None
    devices_checked: int
    missing: tuple[MissingPath, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.missing

    def missing_by_path(self) -> dict[str, list[MissingPath]]:
        grouped: dict[str, list[MissingPath]] = {}
        for m in self.missing:
            grouped.setdefault(m.path, []).append(m)
        return grouped

    def summary(self) -> str:
        """One line: "health counters unreadable: <path> on neuron0-15 (<why>); ..." or "" when all is there."""
        if self.ok:
            return ""
        parts = []
        for path, items in self.missing_by_path().items():
            devices = sorted({m.device for m in items})
            parts.append(f"{path} on {_devices(devices)} ({items[0].found_instead})")
        return f"health counters unreadable on driver {self.driver_version or 'unknown'}: " + "; ".join(parts)

    def lines(self) -> list[str]:
        head = (
            f"driver {self.driver_version or 'version unknown'}: generation {self.generation.name} "
            f"(from {self.generation_source}); {self.devices_checked} device(s) checked"
        )
        out = [head, *(f"note: {n}" for n in self.notes)]
        if self.ok:
            out.append("every path the stack reads is there")
        else:
            out.append(f"{len(self.missing)} path(s) the stack reads are not there:")
            out.extend(f"  {m}" for m in self.missing)
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "root": self.root,
            "generation": self.generation.name,
            "generation_source": str(self.generation_source),
            "driver_version": self.driver_version,
            "devices_checked": self.devices_checked,
            "ok": self.ok,
            "notes": list(self.notes),
            "missing": [
                {"device": m.device, "core": m.core, "path": m.path, "found_instead": m.found_instead}
                for m in self.missing
            ],
        }


def _devices(devices: Sequence[int]) -> str:
    if len(devices) > 1 and devices == list(range(devices[0], devices[-1] + 1)):
        return f"neuron{devices[0]}-{devices[-1]}"
    return ",".join(f"neuron{d}" for d in devices)


def _device_files(ddir: Path) -> dict[str, list[str]]:
    """Every file of the device's own tree (not its cores'), by name -> relative paths."""
    found: dict[str, list[str]] = {}
    for dirpath, dirnames, filenames in os.walk(ddir):
        if dirpath == str(ddir):
            dirnames[:] = [d for d in dirnames if not layout.CORE_DIR_RE.match(d)]
        rel = os.path.relpath(dirpath, ddir)
        for name in filenames:
            found.setdefault(name, []).append(name if rel == "." else f"{rel}/{name}")
    return found


def _diagnose(base: Path, relative: str, files: dict[str, list[str]] | None) -> str:
    """What the tree shows where `relative` should be: the nearest directory that is gone, and
    any file of the same name elsewhere (moved or renamed)."""
    parts = relative.split("/")
    gone = ""
    for depth in range(1, len(parts)):
        if not (base / "/".join(parts[:depth])).is_dir():
            gone = "/".join(parts[:depth])
            break
    name = parts[-1]
    elsewhere = [p for p in (files or {}).get(name, []) if p != relative]
    why = f"directory {gone} gone" if gone else f"directory {'/'.join(parts[:-1])} has no {name}"
    if elsewhere:
        why += f"; moved or renamed? found at {', '.join(elsewhere[:3])}"
    return why


def _status_present(core: Path, name: str) -> bool:
    for candidate in (name, *(old for old, new in layout.LEGACY_STATUS_NAMES.items() if new == name)):
        if layout.status_file(core, candidate, "total").exists():
            return True
    return False


def check_layout(root: str | Path, inventory: NodeInventory) -> LayoutReport:
    """Every path the stack reads for the node's driver generation, on every device, and those not there."""
    root = Path(root)
    device_dirs = [Path(d.sysfs_path) for d in inventory.devices]
    generation, source, version = detect(root, device_dirs)
    family = inventory.instance_type.family.name if inventory.instance_type else None
    notes: list[str] = []
    if not generation.paths_known:
        notes.append(
            f"driver {version} moved sysfs nodes to paths no source here names (docs/driver-versions.md); "
            f"checked against generation 2.30.2's paths"
        )
    if source is GenerationSource.LAYOUT:
        notes.append("no readable sys/module/neuron/version: the generation is told by the tree itself")
    missing: list[MissingPath] = []
    expected = generation.device_paths(family)
    for dev in inventory.devices:
        ddir = Path(dev.sysfs_path)
        files: dict[str, list[str]] | None = None
        for relative in expected:
            if (ddir / relative).is_file():
                continue
            if files is None:
                files = _device_files(ddir)
            missing.append(MissingPath(dev.index, None, relative, _diagnose(ddir, relative, files)))
        for core in range(dev.physical_cores):
            cdir = layout.core_dir(ddir, core)
            for name in HW_ERROR_STATUS_NAMES:
                if not _status_present(cdir, name):
                    relative = f"stats/status/{name}/total"
                    missing.append(MissingPath(dev.index, core, relative, _diagnose(cdir, relative, None)))
    return LayoutReport(str(root), generation, source, version, len(device_dirs), tuple(missing), tuple(notes))


def log_report(report: LayoutReport, logger: logging.Logger, **extra: str) -> None:
    """The report as a node agent logs it at start: one line on the generation, one error a missing path."""
    logger.info(
        "Neuron driver %s: sysfs generation %s (from %s)",
        report.driver_version or "of unknown version",
        report.generation.name,
        report.generation_source,
        extra={"driver_version": report.driver_version or "", "generation": report.generation.name, **extra},
    )
    for note in report.notes:
        logger.warning("driver layout: %s", note, extra=extra)
    for path, items in report.missing_by_path().items():
        logger.error(
            "health counters unreadable: %s not found on %s (%s); the stack does not read it",
            path,
            _devices(sorted({m.device for m in items})),
            items[0].found_instead,
            extra={"path": path, **extra},
        )


def check_at_start(root: str | Path, inventory: NodeInventory, logger: logging.Logger, **extra: str) -> LayoutReport:
    """`check_layout`, logged (`log_report`): what every node agent runs once it has its inventory."""
    report = check_layout(root, inventory)
    log_report(report, logger, **extra)
    return report
