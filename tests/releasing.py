"""What the release tests share: the services a release publishes, and a clean repository of the release
tool alone to make dirty. tests/release/test_release.py checks the release tool without a release;
tests/e2e/test_release.py makes one to the test cluster's registry and checks it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RELEASE_PY = REPO / "tools" / "release.py"


def services() -> list[str]:
    """Every service a release builds an image of (a directory under services/ with a pyproject.toml)."""
    return sorted(p.parent.name for p in (REPO / "services").glob("*/pyproject.toml"))


def repo_copy(tmp_path: Path) -> Path:
    """A git repository holding tools/release.py alone, committed: the release tool finds its repository from its
    own path, so a copy is a clean tree that a test can make dirty."""
    copy = tmp_path / "repo"
    (copy / "tools").mkdir(parents=True)
    shutil.copy(RELEASE_PY, copy / "tools" / "release.py")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=copy, check=True, capture_output=True)
    return copy
