"""The third-party wheels the service images install, pinned by hash (issue 24 item 5).

    python tools/image_wheels.py needed        the distributions the packages under libs/ and services/
                                               depend on (tests aside), one per line
    python tools/image_wheels.py lock          resolve them with constraints.txt and write
                                               services/image-wheels.lock with `uv pip compile
                                               --generate-hashes` (uv, pinned in constraints.txt)
    python tools/image_wheels.py check         the lock names every needed distribution at the version
                                               constraints.txt pins; exit 1 naming what to re-lock

tests/cluster/images.sh downloads exactly the lock's files with `pip download --require-hashes`, and
services/rootfs.sh refuses a wheel in the build context whose digest the lock does not list, so an
image holds no third-party code but what was reviewed into the lock.

The lock is resolved for the images' platform, not this machine's: CPython 3.11 on x86_64 glibc 2.36
(Debian bookworm, the images' base), which uv targets with --python-version and --python-platform;
that is why uv and not pip-tools' pip-compile, which resolves for the interpreter it runs on. Like
pip-compile, uv lists the hash of every file the index serves for each pinned version (every
platform's wheel and the sdist: 1,273 hashes for 32 distributions, where the hand-written lock had
the 32 wheels the images install), not only this platform's: the lock admits the files published
for exactly these versions, and pip (--only-binary) picks this platform's wheel among them.
"""

from __future__ import annotations

import glob
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "services"))
import verify_wheels  # noqa: E402  the lock's reader, which the image build runs on its own
from verify_wheels import normalize  # noqa: E402

LOCK = REPO / "services" / "image-wheels.lock"
CONSTRAINTS = REPO / "constraints.txt"
SETUPTOOLS = "setuptools==84.2.1"  # the build backend the packages need, as a wheel for offline builds
# The images' interpreter and platform (the base's python3 and glibc: tests/cluster/images.sh's bookworm).
PYTHON_VERSION, PYTHON_PLATFORM = "3.11", "x86_64-manylinux_2_36"
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


def lock() -> None:
    uv = Path(sys.executable).parent / "uv"  # make setup installs it into the venv (requirements-dev.txt)
    # on stdout, not -o LOCK: uv keeps the hashes an existing output file lists, so a re-lock would carry
    # over whatever an earlier lock held instead of what the index serves now
    compiled = subprocess.run(
        [uv, "pip", "compile", "--quiet", "--generate-hashes", "--no-annotate", "--only-binary", ":all:",
         "--python-version", PYTHON_VERSION, "--python-platform", PYTHON_PLATFORM, "-c", CONSTRAINTS,
         "--custom-compile-command", "python tools/image_wheels.py lock", "-"],
        input="".join(f"{r}\n" for r in [*needed(), SETUPTOOLS]), capture_output=True, text=True, check=False,
    )  # fmt: skip
    if compiled.returncode != 0:
        raise SystemExit(f"uv pip compile failed:\n{compiled.stderr}")
    LOCK.write_text(compiled.stdout)
    print(f"wrote {LOCK.relative_to(REPO)}: {len(read_lock(compiled.stdout))} distributions")


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
