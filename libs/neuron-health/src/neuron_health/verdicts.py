"""Per-device health verdicts on a host directory: the problem detector writes, the device
plugin reads, so a device the detector finds broken stops being allocated.

Format: one file per unhealthy device, `<dir>/neuron<N>.json`:

    {"device": 3, "healthy": false, "reason": "NeuronHasError_NC_UNCORRECTABLE_ERROR",
     "message": "...", "boot_id": "<host boot id>", "since": "2026-11-22T04:00:00Z"}

A device with no file is healthy as far as the detector knows. Files are replaced
atomically. A verdict from another boot (its boot_id differs from the host's) is ignored:
after a reboot the detector decides afresh.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path

from neuron_driver import layout
from neuron_driver.files import replace_file

log = logging.getLogger(__name__)


_NAME = re.compile(r"^neuron(\d+)\.json$")


def boot_id(host_root: Path) -> str | None:
    try:
        return layout.HostLayout(host_root).boot_id.read_text().strip() or None
    except OSError:
        return None


def write_verdict(
    directory: Path, device: int, reason: str, message: str, boot: str | None, since: float | None = None
) -> None:
    """`since`: when the device became unhealthy (seconds since the epoch; None: now)."""
    directory.mkdir(parents=True, exist_ok=True)
    body = {
        "device": device,
        "healthy": False,
        "reason": reason,
        "message": message,
        "boot_id": boot,
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since)),
    }
    # not synced: a verdict names its boot, so after a crash and reboot it no longer counts anyway
    replace_file(directory / f"neuron{device}.json", json.dumps(body) + "\n")


def clear_verdict(directory: Path, device: int) -> None:
    (directory / f"neuron{device}.json").unlink(missing_ok=True)


def read_verdicts(directory: Path, host_root: Path) -> dict[int, str]:
    """Device -> reason for every current-boot unhealthy verdict; unreadable files are skipped."""
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    current_boot = boot_id(host_root)
    result: dict[int, str] = {}
    for name in names:
        match = _NAME.match(name)
        if match is None:
            continue
        try:
            body = json.loads((directory / name).read_text())
            device = int(body["device"])
            healthy = bool(body["healthy"])
            reason = str(body.get("reason", "unhealthy"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("skipping unreadable verdict %s: %s", directory / name, exc)
            continue
        if device != int(match.group(1)):
            log.warning("skipping verdict %s: it names device %d", directory / name, device)
            continue
        if current_boot is not None and body.get("boot_id") not in (None, current_boot):
            continue
        if not healthy:
            result[device] = reason
    return result


def clear_all(directory: Path) -> int:
    """Remove every verdict, whatever boot it is from (the detector's start on a new boot)."""
    try:
        names = [n for n in os.listdir(directory) if _NAME.match(n)]
    except OSError:
        return 0
    for name in names:
        (directory / name).unlink(missing_ok=True)
    return len(names)
