"""Container Device Interface specs for Neuron device nodes, shared by the device plugin (one
spec for the node) and the DRA driver (one spec per prepared claim).

A spec is `{cdiVersion, kind, devices[{name, containerEdits}]}`; a container gets a device by
its fully qualified name `<kind>=<name>` and the runtime applies its edits. Specs are written
atomically (a temporary file, then a rename): the runtime may read the directory at any moment.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from neuron_driver import layout
from neuron_driver.files import replace_file

CDI_VERSION = "0.6.0"


def qualified_name(kind: str, name: str) -> str:
    return f"{kind}={name}"


def device_nodes(devices: Iterable[int], host_dev_root: Path) -> list[dict[str, str]]:
    """`/dev/neuronN` in the container for each device, from the host's node under `host_dev_root`."""
    return [
        {"path": f"/dev/neuron{d}", "hostPath": str(layout.HostLayout(host_dev_root).dev_node(d)), "permissions": "rw"}
        for d in sorted(set(devices))
    ]


def container_edits(
    devices: Iterable[int], host_dev_root: Path, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    edits: dict[str, Any] = {"deviceNodes": device_nodes(devices, host_dev_root)}
    if env:
        edits["env"] = [f"{k}={v}" for k, v in sorted(env.items())]
    return edits


def spec(kind: str, devices: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A spec of `kind` with one CDI device per entry (name -> its containerEdits)."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": [{"name": name, "containerEdits": dict(edits)} for name, edits in devices.items()],
        "containerEdits": {},
    }


def spec_file_name(kind: str, suffix: str = "") -> str:
    base = kind.replace("/", "_")
    return f"{base}-{suffix}.json" if suffix else f"{base}.json"


def write_spec(directory: Path, file_name: str, content: Mapping[str, Any]) -> Path:
    path = directory / file_name
    replace_file(path, json.dumps(content, indent=2) + "\n")  # /var/run/cdi is a tmpfs: nothing to sync
    return path


def remove_spec(directory: Path, file_name: str) -> bool:
    """Removes a spec; False when it was not there (unprepare is idempotent)."""
    try:
        (directory / file_name).unlink()
    except FileNotFoundError:
        return False
    return True
