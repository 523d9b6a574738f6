"""`make unit` stays pure: a test that starts an external process without the `integration`
marker fails there, naming what it started; marked, it passes and belongs to `make integration`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.integration  # it runs pytest in a subprocess


# as make unit runs it (the Makefile's XDIST), and in one process (JOBS=0)
WORKERS = pytest.mark.parametrize("workers", [["-n", "2", "--dist", "loadfile"], []], ids=["xdist", "one-process"])


def run_unit_stage(tmp_path: Path, body: str, workers: list[str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_probe.py").write_text(body)
    (tmp_path / "conftest.py").write_text((REPO / "conftest.py").read_text())
    (tmp_path / "tests").mkdir()  # what the conftest imports from tests/
    for module in ("scratch.py", "skips.py"):
        (tmp_path / "tests" / module).write_text((REPO / "tests" / module).read_text())
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, "-m", "not integration", str(tmp_path)],
        env=dict(os.environ, NEURON_TEST_STAGE="unit"),
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip


@WORKERS
def test_an_unmarked_test_that_starts_a_process_fails_the_unit_stage(tmp_path: Path, workers: list[str]) -> None:
    done = run_unit_stage(
        tmp_path,
        "import subprocess\n\ndef test_spawns():\n    subprocess.run(['true'], check=True)\n",
        workers,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "started external processes (true) in the unit stage" in done.stdout


@WORKERS
def test_a_marked_one_is_left_to_the_integration_stage_and_a_pure_one_passes(
    tmp_path: Path, workers: list[str]
) -> None:
    done = run_unit_stage(
        tmp_path,
        "import subprocess\nimport pytest\n\n"
        "@pytest.mark.integration\ndef test_spawns():\n    subprocess.run(['true'], check=True)\n\n"
        "def test_pure():\n    assert sum([1, 2]) == 3\n",
        workers,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # xdist's summary leaves out the deselected count: there, one passed and nothing else ran
    summary = r"(?m)^1 passed\b(?!.*failed)" if workers else r"(?m)^1 passed, 1 deselected\b"
    assert re.search(summary, done.stdout), done.stdout
