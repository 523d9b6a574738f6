"""The node's CDI spec for the device plugin (used with `--cdi`).

Kind `<prefix>/neuron`, one device per /dev/neuronN; Allocate then answers with CDI names
(`aws.amazon.com/neuron=neuron3`) and the runtime applies the spec's edits. The spec itself is
built by `neuron_driver.cdi`, shared with the DRA driver.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from neuron_driver import cdi


def cdi_kind(prefix: str) -> str:
    return f"{prefix}/neuron"


def cdi_name(prefix: str, device: int) -> str:
    return cdi.qualified_name(cdi_kind(prefix), f"neuron{device}")


def spec(prefix: str, devices: Iterable[int], host_dev_root: Path) -> dict[str, object]:
    return cdi.spec(cdi_kind(prefix), {f"neuron{d}": cdi.container_edits([d], host_dev_root) for d in sorted(devices)})


def write_spec(directory: Path, prefix: str, devices: Iterable[int], host_dev_root: Path) -> Path:
    return cdi.write_spec(directory, f"{prefix.replace('/', '_')}-neuron.json", spec(prefix, devices, host_dev_root))
