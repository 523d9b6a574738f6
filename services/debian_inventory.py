"""debian_inventory.py ROOT: the dpkg records of the Debian packages whose files ROOT holds (outside
/opt), as ROOT/var/lib/dpkg/status.d/<package>, each that package's stanza of the build stage's
dpkg status. Run by services/rootfs.sh in the build stage with the base's python3.

Why this is ours and not syft's, which writes the SBOM (tools/release.py): the image is built FROM
scratch and copies files out of the base, not packages, so it has no dpkg database, and syft (like
every scanner) finds its Debian packages only in one: without these records syft lists no Debian
package of the image at all (tests/release/test_sbom.py shows it). status.d/ is the layout distroless
images use for the same reason, which syft, grype and trivy read. Which packages to record is what only the build stage
knows: the owners, by dpkg's file lists, of the files copied (the interpreter, its standard library,
the shared libraries, os-release). Paths are compared with /usr merged (bookworm's packages list
/lib/... while the files live under /usr/lib/...). A file no package owns is a build error: the SBOM
would miss it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DPKG_INFO = Path("/var/lib/dpkg/info")
STATUS_D = "var/lib/dpkg/status.d"
MERGED = ("/bin/", "/sbin/", "/lib/", "/lib32/", "/lib64/", "/libx32/")
# Written by the build itself, not taken from a package.
OWN = {"/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/ld.so.cache"}


def merged(path: str) -> str:
    return "/usr" + path if path.startswith(MERGED) else path


def owners() -> dict[str, str]:
    """Every packaged path (with /usr merged) -> its package (name:arch as dpkg names the list)."""
    found: dict[str, str] = {}
    for listing in DPKG_INFO.glob("*.list"):
        package = listing.stem
        for line in listing.read_text(errors="replace").splitlines():
            found.setdefault(merged(line), package)
    return found


def held(root: Path) -> tuple[set[str], list[str]]:
    """(the packages owning ROOT's files, the files no package owns)."""
    owned, packages, strays = owners(), set(), []
    for directory, subdirs, files in os.walk(root):
        relative = "/" + os.path.relpath(directory, root).lstrip(".")
        if relative.rstrip("/") in ("/opt", "/tmp", "/" + STATUS_D):
            subdirs.clear()
            continue
        # files and links to files; a link to a directory (/lib -> usr/lib) is the merged layout, no package's
        for name in files:
            path = merged(os.path.join(relative, name).replace("//", "/"))
            if path in OWN:
                continue
            package = owned.get(path)
            if package is None:
                strays.append(path)
            else:
                packages.add(package)
    return packages, strays


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: debian_inventory.py ROOT", file=sys.stderr)
        return 2
    root = Path(argv[0])
    packages, strays = held(root)
    if strays:
        print(f"debian_inventory: no package owns {len(strays)} file(s), e.g. {sorted(strays)[:5]}", file=sys.stderr)
        return 1
    status = subprocess.run(["dpkg-query", "-s", *sorted(packages)], check=True, capture_output=True, text=True)
    out = root / STATUS_D
    out.mkdir(parents=True, exist_ok=True)
    for stanza in status.stdout.strip().split("\n\n"):
        name = stanza.split("\n", 1)[0].removeprefix("Package: ")
        (out / name).write_text(stanza + "\n")
    print(f"debian_inventory: {len(packages)} Debian package(s) recorded in /{STATUS_D}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
