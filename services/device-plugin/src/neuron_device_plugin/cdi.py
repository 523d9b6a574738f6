"""The node's CDI spec for the device plugin (used with `--cdi`).

Kind `<prefix>/neuron`, one device per /dev/neuronN; Allocate then answers with CDI names
(`aws.amazon.com/neuron=neuron3`) and the runtime applies the spec's edits. The spec itself is
built by `neuron_driver.cdi`, shared with the DRA driver. `SpecKeeper` keeps it true to the
devices the plugin knows for as long as it runs, not only at its start.
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


def spec_file_name(prefix: str) -> str:
    return f"{prefix.replace('/', '_')}-neuron.json"


def write_spec(directory: Path, prefix: str, devices: Iterable[int], host_dev_root: Path) -> Path:
    return cdi.write_spec(directory, spec_file_name(prefix), spec(prefix, devices, host_dev_root))


class SpecKeeper:
    """The spec on disk for the devices the plugin knows, checked before each Allocate answers with
    their names: written again when the known devices changed since it was written (a driver reload
    that shows more devices) or when the file is gone (the spec directory is a tmpfs, and anything
    on the host may empty it). The runtime resolves the names only when it creates the container,
    after Allocate: a name the spec lacks then fails the pod with an error that names no cause."""

    def __init__(self, directory: Path, prefix: str, host_dev_root: Path) -> None:
        self.directory = directory
        self.prefix = prefix
        self.host_dev_root = host_dev_root
        self._written: frozenset[int] | None = None

    @property
    def path(self) -> Path:
        return self.directory / spec_file_name(self.prefix)

    def ensure(self, devices: Iterable[int]) -> bool:
        """True when it wrote the spec (OSError when it could not); False when the file on disk
        already holds exactly these devices."""
        wanted = frozenset(devices)
        if wanted == self._written and self.path.exists():
            return False
        write_spec(self.directory, self.prefix, wanted, self.host_dev_root)
        self._written = wanted
        return True
