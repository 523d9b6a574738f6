"""Promises services/Dockerfile makes: one final stage per service, named after its directory,
running the service's own console script on its own default port, as a numeric user."""

from __future__ import annotations

import importlib
import json
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "services/Dockerfile"


def service_stages() -> dict[str, dict[str, str]]:
    """Each `FROM service AS <name>` stage's instructions, keyed by instruction."""
    stages: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in DOCKERFILE.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        instruction, _, argument = line.partition(" ")
        if instruction == "FROM":
            match = re.fullmatch(r"service AS (\S+)", argument)
            current = stages.setdefault(match.group(1), {}) if match else None
        elif current is not None:
            current[instruction] = argument
    return stages


def services() -> list[str]:
    return sorted(p.parent.name for p in (REPO / "services").glob("*/pyproject.toml"))


def test_every_service_has_a_stage_and_nothing_else_does() -> None:
    assert sorted(service_stages()) == services()


def test_each_stage_runs_its_service_on_its_default_port_as_a_numeric_user() -> None:
    for name, stage in service_stages().items():
        project = tomllib.loads((REPO / "services" / name / "pyproject.toml").read_text())["project"]
        [script] = project["scripts"]
        assert json.loads(stage["ENTRYPOINT"]) == [f"/opt/neuron/bin/{script}"], name
        [package] = [p.name for p in (REPO / "services" / name / "src").iterdir() if p.is_dir() and "." not in p.name]
        default_listen = importlib.import_module(f"{package}.config").DEFAULT_LISTEN
        assert stage["EXPOSE"] == default_listen.rsplit(":", 1)[1], name
        assert re.fullmatch(r"\d+:\d+", stage["USER"]), f"{name}: USER {stage['USER']} is not numeric"
