"""Which package may import which: the libraries are layered by concept, no library imports a
service, no service imports another, and the scheduler extender, which never reads a host, imports
nothing that does. Every project package a module imports is also a declared dependency of its
distribution, so an image built from the declared dependencies has it."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# package -> the project packages it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "neuron_model": set(),
    "neuron_driver": {"neuron_model"},
    "neuron_common": {"neuron_model", "kubelet_api"},
    "kubelet_api": set(),
    "neuron_health": {"neuron_model", "neuron_driver", "neuron_common"},
    "neuron_sim": {"neuron_model", "neuron_driver", "neuron_health"},
    "neuron_device_plugin": {"neuron_model", "neuron_driver", "neuron_health", "neuron_common", "kubelet_api"},
    "neuron_dra_driver": {"neuron_model", "neuron_driver", "neuron_health", "neuron_common", "kubelet_api"},
    "neuron_node_metrics": {"neuron_model", "neuron_driver", "neuron_health", "neuron_common", "kubelet_api"},
    # kubelet_api: the device reset asks the kubelet's PodResources API whether a pod holds the device
    "neuron_problem_detector": {"neuron_model", "neuron_driver", "neuron_health", "neuron_common", "kubelet_api"},
    # placement and the report only: no sysfs, no kernel log, no simulator
    "neuron_scheduler_extender": {"neuron_model", "neuron_common"},
    # the fault table's ladder, and the API server: no sysfs, no kernel log, no simulator
    "neuron_remediation": {"neuron_model", "neuron_health", "neuron_common"},
}


def distributions() -> dict[str, Path]:
    """import name -> the directory of its distribution (libs/* and services/*)."""
    found: dict[str, Path] = {}
    for pyproject in sorted([*REPO.glob("libs/*/pyproject.toml"), *REPO.glob("services/*/pyproject.toml")]):
        for package in (pyproject.parent / "src").iterdir():
            if (package / "__init__.py").exists():
                found[package.name] = pyproject.parent
    return found


def imported_packages(source_dir: Path, base: Path = REPO) -> dict[str, set[str]]:
    """project package -> the files importing it, for every module under `source_dir`."""
    projects = set(ALLOWED)
    seen: dict[str, set[str]] = {}
    for path in source_dir.rglob("*.py"):
        if "_pb2" in path.name:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in projects:
                    seen.setdefault(top, set()).add(str(path.relative_to(base)))
    return seen


def test_every_project_package_has_a_rule() -> None:
    assert set(distributions()) == set(ALLOWED)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_follow_the_layers(package: str) -> None:
    where = distributions()[package]
    imports = imported_packages(where / "src" / package)
    forbidden = {p: files for p, files in imports.items() if p != package and p not in ALLOWED[package]}
    assert not forbidden, f"{package} may not import {sorted(forbidden)}: {forbidden}"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_are_declared_dependencies(package: str) -> None:
    dists = distributions()
    where = dists[package]
    project = tomllib.loads((where / "pyproject.toml").read_text())["project"]
    # an extra counts (neuron_common's PodResources poller needs `neuron-common[podresources]`)
    extras = [d for name, deps in project.get("optional-dependencies", {}).items() if name != "test" for d in deps]
    declared = [*project["dependencies"], *extras]
    names = {d.split("[")[0].split(">")[0].split("=")[0].strip().replace("-", "_") for d in declared}
    used = set(imported_packages(where / "src" / package)) - {package}
    # a distribution's name is its import name with dashes
    missing = {p for p in used if dists[p].name.replace("-", "_") not in names}
    assert not missing, f"{where.name} imports {sorted(missing)} without declaring it in pyproject.toml"


def test_the_layering_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The checker itself: an extender module importing the driver reader is found, a relative
    import and a standard-library import are not."""
    (tmp_path / "m.py").write_text(
        "import os\nfrom . import x\nif True:\n    from neuron_driver.layout import HostLayout\n"
    )
    assert imported_packages(tmp_path, base=tmp_path) == {"neuron_driver": {"m.py"}}
    assert "neuron_driver" not in ALLOWED["neuron_scheduler_extender"]
