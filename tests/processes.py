"""Child processes the tests start: running a module to its end (`run_module`), and stopping one
(SIGTERM, a grace period, then SIGKILL)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any


def run_module(
    module: str, *args: str, env: Mapping[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """`python -m module args` to its end, with `env` over this process's environment; its output as text."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )


def stop(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace)
