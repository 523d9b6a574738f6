"""Files the services write on the host, each replaced whole: a reader (the kubelet, the container
runtime, another service, the same service after a restart) finds the old content or the new, never
half of either."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def replace_file(path: Path, text: str, *, durable: bool = False) -> None:
    """Write `text` to `path` through a dot file beside it, renamed over it. No reader takes the dot
    file for the real one: its name ends in `.tmp`, where the CDI readers take `*.json` and `*.yaml`
    and the verdict reader `neuron<N>.json`. `durable`: the content survives a node crash,
    for state a reboot must find: the file is synced before the rename, so a crash cannot leave an
    empty file under the name, and the directory after it, so the rename itself is on disk. A write
    that fails leaves the old file as it was and no dot file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # the pid: two processes replacing one file (the simulator's writers) never share a dot file
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
