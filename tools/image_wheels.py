"""The third-party wheels the service images install, pinned by hash (issue 24 item 5).

    python tools/image_wheels.py needed        the distributions the packages under libs/ and services/
                                               depend on (tests aside), one per line
    python tools/image_wheels.py lock          download them (with constraints.txt, this machine's pip
                                               settings) and write services/image-wheels.lock: every
                                               wheel as `name==version --hash=sha256:...`
    python tools/image_wheels.py check         the lock names every needed distribution at the version
                                               constraints.txt pins; exit 1 naming what to re-lock

tests/cluster/images.sh downloads exactly the lock's files with `pip download --require-hashes`, and
services/rootfs.sh refuses a wheel in the build context whose digest the lock does not list, so an
image holds no third-party code but what was reviewed into the lock. The lock is for this
platform's wheels (CPython 3.11, x86_64 glibc), the one the images are built for.
"""

from __future__ import annotations

import glob
import hashlib
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "services"))
import verify_wheels  # noqa: E402  the lock's reader, which the image build runs on its own
from verify_wheels import normalize  # noqa: E402

LOCK = REPO / "services" / "image-wheels.lock"
CONSTRAINTS = REPO / "constraints.txt"
SETUPTOOLS = "setuptools==84.2.1"  # the build backend the packages need, as a wheel for offline builds
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def needed() -> list[str]:
    """What the packages under libs/ and services/ depend on, their tests aside, and not on each other."""
    paths = sorted(glob.glob(str(REPO / "libs/*/pyproject.toml")) + glob.glob(str(REPO / "services/*/pyproject.toml")))
    projects = [tomllib.loads(Path(path).read_text())["project"] for path in paths]
    requirements = [r for p in projects for r in p.get("dependencies", [])]
    requirements += [
        r for p in projects for extra, rs in p.get("optional-dependencies", {}).items() if extra != "test" for r in rs
    ]
    own = {normalize(p["name"]) for p in projects}
    names = {m.group(0) for r in requirements if (m := _NAME.match(r))}
    return sorted(n for n in names if normalize(n) not in own)


def pins() -> dict[str, str]:
    """constraints.txt: normalized name -> version."""
    found = {}
    for line in CONSTRAINTS.read_text().splitlines():
        pin = line.split("#", 1)[0].strip()
        if "==" in pin:
            name, version = pin.split("==", 1)
            found[normalize(name)] = version.strip()
    return found


def read_lock(text: str) -> dict[str, str]:
    """normalized name -> the locked version."""
    return {name: version for name, version in verify_wheels.allowed(text)}


def wheel_identity(filename: str) -> tuple[str, str]:
    """(normalized name, version) of a wheel file (PEP 427: name-version-...whl)."""
    name, version = filename.split("-")[:2]
    return normalize(name), version


def lock() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "-d", tmp, "--only-binary=:all:", "-c", str(CONSTRAINTS),
             *needed(), SETUPTOOLS],
            check=True,
        )  # fmt: skip
        lines = []
        for wheel in sorted(Path(tmp).glob("*.whl")):
            name, version = wheel_identity(wheel.name)
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            lines.append(f"{name}=={version} --hash=sha256:{digest}")
    header = (
        "# The wheels the service images install, by hash: written by `python tools/image_wheels.py lock`\n"
        "# (CPython 3.11, x86_64 glibc); checked by tools/image_wheels.py check, used by tests/cluster/images.sh\n"
        "# and services/rootfs.sh. Re-lock after changing constraints.txt or a package's dependencies.\n"
    )
    LOCK.write_text(header + "\n".join(sorted(lines)) + "\n")
    print(f"wrote {LOCK.relative_to(REPO)}: {len(lines)} wheels")


def check() -> list[str]:
    """What is wrong with the lock, one line each; empty when it covers every needed distribution."""
    if not LOCK.exists():
        return [f"{LOCK.relative_to(REPO)} is missing: run python tools/image_wheels.py lock"]
    locked, pinned = read_lock(LOCK.read_text()), pins()
    problems = []
    for name in [*needed(), SETUPTOOLS.partition("==")[0]]:
        key = normalize(name)
        if key not in locked:
            problems.append(f"{name} is needed by the images but not in the lock")
    for key, version in locked.items():
        if key in pinned and pinned[key] != version:
            problems.append(f"{key}: the lock has {version}, constraints.txt pins {pinned[key]}")
    return sorted(set(problems))


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    if command == "needed":
        print("\n".join(needed()))
    elif command == "lock":
        lock()
    elif command == "check":
        problems = check()
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("re-lock with: python tools/image_wheels.py lock", file=sys.stderr)
            return 1
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
