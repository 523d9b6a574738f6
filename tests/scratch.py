"""Where tests and benches keep their temporary files: on tmpfs when the machine has one.

A simulated trn2 node is about 12,000 small files. Creating them on this project's CI disk (ext4
mounted with `discard`) took three times the CPU it takes on tmpfs, most of it system time, in a
`make test` that is CPU-bound; and removing trees left on that disk took minutes. The pytest session
(the root conftest.py) and bench/run.py send every `tempfile` temporary of their process here; etcd's
data, Prometheus's, the simulated nodes' and the stand-ins' sockets follow without naming it."""

from __future__ import annotations

import os
import tempfile

_SHM = "/dev/shm"
ROOT = _SHM if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK) else tempfile.gettempdir()


def use_for_temporaries() -> None:
    """Every `tempfile` directory and file this process makes from now on goes under ROOT."""
    tempfile.tempdir = ROOT
