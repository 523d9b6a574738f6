"""debian_inventory.py ROOT OUT: the Debian packages whose files ROOT holds (outside /opt), one per
line as name<TAB>version<TAB>architecture, into OUT. Run by services/rootfs.sh in the build stage
with the base's python3: what the image took from Debian (the interpreter, its standard library,
the shared libraries), for the image's SBOM (tools/sbom.py). Paths are compared with /usr merged
(bookworm's packages list /lib/... while the files live under /usr/lib/...). A file no package
owns is a build error: the SBOM would miss it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DPKG_INFO = Path("/var/lib/dpkg/info")
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


def main(argv: list[str]) -> int:
    root, out = Path(argv[0]), Path(argv[1])
    owned, packages, strays = owners(), set(), []
    for directory, subdirs, files in os.walk(root):
        relative = "/" + os.path.relpath(directory, root).lstrip(".")
        if relative.rstrip("/") in ("/opt", "/tmp"):
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
    if strays:
        print(f"debian_inventory: no package owns {len(strays)} file(s), e.g. {sorted(strays)[:5]}", file=sys.stderr)
        return 1
    query = ["dpkg-query", "-W", "-f=${Package}\\t${Version}\\t${Architecture}\\n", *sorted(packages)]
    rows = subprocess.run(query, check=True, capture_output=True, text=True).stdout
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(sorted(set(rows.splitlines(keepends=True)))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
