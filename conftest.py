"""Repository-wide test set-up.

- Makes the shared stand-ins under tests/ importable from every test directory.
- Puts test temporaries on tmpfs when there is one: a simulated trn2 node is ~12,000 small
  files, and creating and deleting those on a disk mounted with `discard` made test times
  vary tenfold.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "tests"))


def fast_tmp_root() -> str:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is None and not os.environ.get("NEURON_TEST_KEEP_TMP"):
        config.option.basetemp = tempfile.mkdtemp(prefix="neuron-pytest-", dir=fast_tmp_root())


_created: list[str] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    base = session.config.option.basetemp
    if base and os.path.basename(str(base)).startswith("neuron-pytest-"):
        _created.append(str(base))


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    for path in _created:
        shutil.rmtree(path, ignore_errors=True)
