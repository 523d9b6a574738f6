"""Where tests/chart/build-tools.sh put the chart checks' tools (ct, kubectl-validate, OpenAPI
documents, CRDs): one build-and-read for the chart tests and the e2e tests alike."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

BUILD_TOOLS = Path(__file__).resolve().parent / "chart" / "build-tools.sh"


@functools.cache
def chart_tools() -> dict[str, str]:
    """The keys of the cache's paths.env (CT, CT_ETC, KUBECTL_VALIDATE, OPENAPI_NEWEST, ...)."""
    result = subprocess.run([str(BUILD_TOOLS)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AssertionError(f"{BUILD_TOOLS} failed (make setup builds these tools):\n{result.stderr}")
    paths = Path(result.stdout.strip().splitlines()[-1]) / "paths.env"
    return dict(line.split("=", 1) for line in paths.read_text().splitlines() if "=" in line)
