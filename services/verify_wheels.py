"""verify_wheels.py LOCK DIR: every wheel in DIR has a digest LOCK lists for its name and version
(services/image-wheels.lock, requirements with hashes as `uv pip compile --generate-hashes` writes
them, run by tools/image_wheels.py lock). Run by services/rootfs.sh before it installs anything, with
the base image's python3 and nothing else: an image holds no third-party code but what was reviewed
into the lock, whatever was put into the build context."""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def allowed(lock_text: str) -> dict[tuple[str, str], set[str]]:
    """(normalized name, version) -> the sha256 digests the lock allows. The lock is pip's requirements
    format: `name==version --hash=sha256:...`, an entry continued over lines by a trailing backslash, a
    comment from a `#` at a line's start or after a space. Anything else in it is an error, not skipped:
    this reader decides what an image may hold."""
    found: dict[tuple[str, str], set[str]] = {}
    for line in lock_text.replace("\\\n", " ").splitlines():
        entry = re.sub(r"(^|\s)#.*", "", line).strip()
        if not entry:
            continue
        requirement, *options = entry.split()
        name, equals, version = requirement.partition("==")
        hashes = [o.removeprefix("--hash=sha256:") for o in options]
        if not equals or not name or not hashes or not all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes):
            raise ValueError(f"the lock's entry {entry[:80]!r} is not name==version --hash=sha256:<digest>...")
        found.setdefault((normalize(name), version), set()).update(hashes)
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
    try:
        problems = refusals(lock.read_text(), wheels)
    except ValueError as e:
        print(f"verify_wheels: {lock}: {e}", file=sys.stderr)
        return 1
    for problem in problems:
        print(f"verify_wheels: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"verify_wheels: {len(wheels)} wheel(s) match {lock.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
