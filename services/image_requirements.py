"""The third-party requirements of a service's image: its pyproject.toml dependencies and, through
every library of libs/ it depends on (with the extras it asks for), theirs, as pip reads them.

tests/cluster/images.sh writes them to build/image-deps/<service>.txt before it builds, so that the
image's dependency layer (services/Dockerfile) depends on this list alone and a change to the
project's own code rebuilds only the layer of its code. services/rootfs.sh checks the other half: a
package that the code layer would install and the list missed fails the build.

    python services/image_requirements.py SERVICE       the list, on stdout
    python services/image_requirements.py --write DIR   one DIR/<service>.txt per service
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "services"))
from verify_wheels import normalize  # noqa: E402  the one spelling of a distribution's name

# PEP 508's name and extras, then the rest (version, marker) as written
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?\s*(.*)$")


def _project(pyproject: Path) -> dict[str, object]:
    project: dict[str, object] = tomllib.loads(pyproject.read_text())["project"]
    return project


def local_projects(repo: Path = REPO) -> dict[str, dict[str, object]]:
    """The libraries of libs/, by canonical project name."""
    return {normalize(str(p["name"])): p for p in map(_project, sorted(repo.glob("libs/*/pyproject.toml")))}


def third_party(service: str, repo: Path = REPO) -> list[str]:
    """The service's third-party requirement lines, sorted, each once."""
    pyproject = repo / "services" / service / "pyproject.toml"
    if not pyproject.is_file():
        raise SystemExit(f"image_requirements: no services/{service}/pyproject.toml")
    libraries = local_projects(repo)
    found: set[str] = set()
    seen: set[tuple[str, str]] = set()

    def visit(requirements: list[str], needed_by: str) -> None:
        for line in requirements:
            match = REQUIREMENT.match(line)
            if match is None:
                raise SystemExit(f"image_requirements: {needed_by}: cannot read the requirement {line!r}")
            name, extras, rest = normalize(match[1]), match[2] or "", match[3].strip()
            if name not in libraries:
                found.add(line.strip())
                continue
            if rest:
                raise SystemExit(f"image_requirements: {needed_by}: the library {line!r} takes no version or marker")
            library = libraries[name]
            optional: dict[str, list[str]] = library.get("optional-dependencies", {})  # type: ignore[assignment]
            for extra in ["", *(e.strip() for e in extras.split(",") if e.strip())]:
                if (name, extra) in seen:
                    continue
                seen.add((name, extra))
                if extra and extra not in optional:
                    raise SystemExit(f"image_requirements: {needed_by} asks for {name}[{extra}], which it lacks")
                dependencies: list[str] = library.get("dependencies", []) if not extra else optional[extra]  # type: ignore[assignment]
                visit(dependencies, name)

    visit(_project(pyproject).get("dependencies", []), service)  # type: ignore[arg-type]
    return sorted(found, key=str.lower)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--write":
        out = Path(argv[1])
        out.mkdir(parents=True, exist_ok=True)
        for pyproject in sorted(REPO.glob("services/*/pyproject.toml")):
            service = pyproject.parent.name
            text = "".join(f"{line}\n" for line in third_party(service))
            target = out / f"{service}.txt"
            if not target.is_file() or target.read_text() != text:  # an unchanged file keeps its layer
                target.write_text(text)
        return 0
    if len(argv) == 1 and not argv[0].startswith("-"):
        sys.stdout.writelines(f"{line}\n" for line in third_party(argv[0]))
        return 0
    print("usage: image_requirements.py SERVICE | --write DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
