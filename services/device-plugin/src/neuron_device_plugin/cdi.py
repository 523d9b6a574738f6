"""A Container Device Interface spec for the Neuron device nodes (used with `--cdi`).

Kind `<prefix>/neuron`, one device per /dev/neuronN; Allocate then answers with CDI names
(`aws.amazon.com/neuron=neuron3`) and the runtime applies the spec's edits.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from neuron_sysfs import layout

CDI_VERSION = "0.6.0"


def cdi_kind(prefix: str) -> str:
    return f"{prefix}/neuron"


def cdi_name(prefix: str, device: int) -> str:
    return f"{cdi_kind(prefix)}=neuron{device}"


def spec(prefix: str, devices: Iterable[int], host_dev_root: Path) -> dict[str, object]:
    return {
        "cdiVersion": CDI_VERSION,
        "kind": cdi_kind(prefix),
        "devices": [
            {
                "name": f"neuron{d}",
                "containerEdits": {
                    "deviceNodes": [
                        {
                            "path": f"/dev/neuron{d}",
                            "hostPath": str(layout.HostLayout(host_dev_root).dev_node(d)),
                            "permissions": "rw",
                        }
                    ]
                },
            }
            for d in sorted(devices)
        ],
        "containerEdits": {},
    }


def write_spec(directory: Path, prefix: str, devices: Iterable[int], host_dev_root: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{prefix.replace('/', '_')}-neuron.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(spec(prefix, devices, host_dev_root), indent=2) + "\n")
    os.replace(tmp, path)  # the runtime may read it at any moment
    return path
