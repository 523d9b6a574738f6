"""Where tests and benches keep their temporary files: on tmpfs when the machine has one with room.

A simulated trn2 node is about 12,000 small files. Creating them on this project's CI disk (ext4
mounted with `discard`) took three times the CPU it takes on tmpfs, most of it system time, in a
`make test` that is CPU-bound; and removing trees left on that disk took minutes. The pytest session
(the root conftest.py) and bench/run.py send every `tempfile` temporary of their process here; etcd's
data, Prometheus's, the simulated nodes' and the stand-ins' sockets follow without naming it.

tmpfs runs out of inodes long before bytes (a default /dev/shm has one inode per page of half the
RAM), and a container's /dev/shm is often 64 MiB: a run that fills it fails every test after with
ENOSPC. So /dev/shm is used only when it has room for a whole `make test` (the four stages beside
each other peaked near MIN_FREE_INODES), and tests remove a passing test's `tmp_path` as it ends
(pyproject.toml's tmp_path_retention_policy)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

_SHM = "/dev/shm"
MIN_FREE_BYTES = 4 << 30
MIN_FREE_INODES = 1_000_000


def roomy(path: str, statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> bool:
    """Whether `path` is a writable directory with MIN_FREE_BYTES and MIN_FREE_INODES free."""
    if not (os.path.isdir(path) and os.access(path, os.W_OK)):
        return False
    try:
        stats = statvfs(path)
    except OSError:
        return False
    # f_files is 0 on file systems without an inode limit
    inodes_ok = stats.f_files == 0 or stats.f_favail >= MIN_FREE_INODES
    return stats.f_bavail * stats.f_frsize >= MIN_FREE_BYTES and inodes_ok


ROOT = _SHM if roomy(_SHM) else tempfile.gettempdir()


def use_for_temporaries() -> None:
    """Every `tempfile` directory and file this process makes from now on goes under ROOT."""
    tempfile.tempdir = ROOT
