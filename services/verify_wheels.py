"""verify_wheels.py LOCK DIR: every wheel in DIR has a digest LOCK lists for its name and version
(services/image-wheels.lock, written by tools/image_wheels.py). Run by services/rootfs.sh before it
installs anything, with the base image's python3 and nothing else: an image holds no third-party
code but what was reviewed into the lock, whatever was put into the build context."""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def allowed(lock_text: str) -> dict[tuple[str, str], set[str]]:
    """(normalized name, version) -> the sha256 digests the lock allows."""
    found: dict[tuple[str, str], set[str]] = {}
    for line in lock_text.splitlines():
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        requirement, *hashes = entry.split()
        name, version = requirement.split("==", 1)
        found.setdefault((normalize(name), version), set()).update(h.removeprefix("--hash=sha256:") for h in hashes)
    return found


def refusals(lock_text: str, wheels: list[Path]) -> list[str]:
    """One line per wheel the lock does not allow; empty when every one is allowed."""
    digests = allowed(lock_text)
    problems = []
    for wheel in sorted(wheels):
        name, version = wheel.name.split("-")[:2]
        expected = digests.get((normalize(name), version))
        if expected is None:
            problems.append(f"{wheel.name}: {name} {version} is not in the lock")
        elif hashlib.sha256(wheel.read_bytes()).hexdigest() not in expected:
            problems.append(f"{wheel.name}: its sha256 is not the one the lock lists")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: verify_wheels.py LOCK DIR", file=sys.stderr)
        return 2
    lock, directory = Path(argv[0]), Path(argv[1])
    wheels = sorted(directory.glob("*.whl"))
    problems = refusals(lock.read_text(), wheels)
    for problem in problems:
        print(f"verify_wheels: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"verify_wheels: {len(wheels)} wheel(s) match {lock.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
