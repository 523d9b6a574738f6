"""Repository-wide test set-up.

- Makes the shared stand-ins under tests/ importable from every test directory.
- Stages: a test that starts an external process (kube-apiserver, Prometheus, helm, podman, a
  service as its own process, ...) is an `integration` test; `make unit` runs the others and
  fails any of them that starts a process after all (NEURON_TEST_STAGE=unit), so the unit stage
  stays pure and in-process. NEURON_TEST_SPAWN_REPORT=<file> lists, per test, what it started.
- Puts every test temporary (`tempfile`'s and pytest's own) on tmpfs when there is one
  (tests/scratch.py says why).
- With CI=true, fails every skip but the few tests/skips.py lists, each with the machine condition
  it stands for; a missing tool fails the test wherever it runs (tests/skips.py's `require`).
- Turns off hypothesis's per-example deadline: it is a timed assertion, and `make test` runs the
  unit and integration stages beside the cluster stage on a shared machine. Speed is measured in
  `make bench`, not asserted in tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent / "tests"))

import scratch  # tests/, on the path only from the line above

# With CI=true a skip fails the run unless tests/skips.py allows it (a machine condition, not a tool)
pytest_plugins = ["skips"]

settings.register_profile("neuron", deadline=None)
settings.load_profile("neuron")


def pytest_configure(config: pytest.Config) -> None:
    scratch.use_for_temporaries()
    if config.option.basetemp is None and not os.environ.get("NEURON_TEST_KEEP_TMP"):
        config.option.basetemp = tempfile.mkdtemp(prefix="neuron-pytest-")


_created: list[str] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    base = session.config.option.basetemp
    if base and os.path.basename(str(base)).startswith("neuron-pytest-"):
        _created.append(str(base))


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    for path in _created:
        shutil.rmtree(path, ignore_errors=True)


# --- stages: who starts external processes ----------------------------------------------------

_spawned: list[str] = []
_report: dict[str, list[str]] = {}
_original_popen_init = subprocess.Popen.__init__


def _recording_init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    _spawned.append(os.path.basename(str(argv[0])) if argv else "?")
    _original_popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _recording_init  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    _spawned.clear()
    yield
    if _spawned and os.environ.get("NEURON_TEST_SPAWN_REPORT"):
        _report[item.nodeid] = sorted(set(_spawned))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if (
        os.environ.get("NEURON_TEST_STAGE") == "unit"
        and _spawned
        and report.passed
        and item.get_closest_marker("integration") is None
    ):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started external processes ({', '.join(sorted(set(_spawned)))}) in the unit stage: "
            "mark it `integration` (pytestmark = pytest.mark.integration) or keep it in-process"
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("NEURON_TEST_SPAWN_REPORT")
    if path:
        Path(path).write_text(json.dumps(_report, indent=1, sort_keys=True))
