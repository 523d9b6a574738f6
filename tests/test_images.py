"""Promises services/Dockerfile makes: one final stage per service, named after its directory,
running the service's own console script on its own default port, as a numeric user."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import tomllib
from pathlib import Path

import pytest
from releasing import services

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


def _image_requirements():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("image_requirements", REPO / "services/image_requirements.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _project(root: Path, where: str, name: str, dependencies: list[str], **optional: list[str]) -> None:
    directory = root / where
    directory.mkdir(parents=True)
    extras = "".join(f"{extra} = {json.dumps(deps)}\n" for extra, deps in optional.items())
    (directory / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\ndependencies = {json.dumps(dependencies)}\n'
        + (f"[project.optional-dependencies]\n{extras}" if extras else "")
    )


def test_an_images_third_party_list_follows_its_libraries_and_the_extras_it_asks_for(tmp_path: Path) -> None:
    """The image's dependency layer holds what this list names, so it must name what pip would
    install for the service (services/rootfs.sh fails a build where the two differ)."""
    requirements = _image_requirements()
    _project(tmp_path, "libs/model", "neuron-model", ["pyyaml>=6"])
    _project(
        tmp_path, "libs/common", "neuron_common", ["aiohttp", "Neuron.Model"], podresources=["grpcio", "kubelet-api"]
    )
    _project(tmp_path, "libs/kubelet-api", "kubelet-api", ["protobuf"])
    _project(tmp_path, "services/plain", "plain", ["orjson", "neuron-common"])
    _project(tmp_path, "services/polling", "polling", ["neuron-common[podresources]", "neuron-model"])
    _project(tmp_path, "services/wrong", "wrong", ["neuron-common[nosuch]"])
    assert requirements.third_party("plain", tmp_path) == ["aiohttp", "orjson", "pyyaml>=6"]
    assert requirements.third_party("polling", tmp_path) == ["aiohttp", "grpcio", "protobuf", "pyyaml>=6"]
    with pytest.raises(SystemExit, match=r"wrong asks for neuron-common\[nosuch\], which it lacks"):
        requirements.third_party("wrong", tmp_path)
    with pytest.raises(SystemExit, match=r"no services/absent/pyproject\.toml"):
        requirements.third_party("absent", tmp_path)


def test_the_kubelets_grpc_client_is_in_the_images_that_ask_podresources() -> None:
    """neuron-common's `podresources` extra carries grpcio and protobuf (about 20 MB): node-metrics
    polls PodResources, and the problem detector asks it before a device reset (issue 56), so both
    images hold it; the scheduler extender, which never asks the kubelet, does not."""
    requirements = _image_requirements()
    detector = requirements.third_party("node-problem-detector")
    assert "kubernetes" in detector
    assert {"grpcio", "protobuf"} <= set(detector)
    assert {"grpcio", "protobuf"} <= set(requirements.third_party("node-metrics"))
    assert not {"grpcio", "protobuf"} & set(requirements.third_party("scheduler-extender"))


def test_every_file_a_build_copies_is_among_the_inputs_that_decide_a_rebuild() -> None:
    """images.sh skips a service's build when the files it hashes are unchanged: a COPY of a path
    outside them would leave an image stale. Every COPY source must lie under one of the hashed paths."""
    images_sh = (REPO / "tests/cluster/images.sh").read_text()
    (find_line,) = re.findall(r"^\s*find (.+?) -type f", images_sh, re.MULTILINE)
    hashed = find_line.split()
    assert "services/Dockerfile" in hashed
    sources = []
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    assert sources, "no COPY line found in the Dockerfile"
    for source in sources:
        path = source.rstrip("/").split("${", 1)[0].rstrip("/")
        assert any(path == h or path.startswith(h + "/") for h in hashed), f"COPY {source} is not hashed"


def test_the_content_builds_timestamp_is_the_last_commit_to_any_of_its_inputs() -> None:
    """images.sh stamps the content build with the time of the last commit to the paths it is made of, so
    that a commit elsewhere builds the same images: every hashed input must lie under those paths, or be
    made from them in build/ (the wheels from services/image-wheels.lock, the requirements from each pyproject)."""
    images_sh = (REPO / "tests/cluster/images.sh").read_text()
    (find_line,) = re.findall(r"^\s*find (.+?) -type f", images_sh, re.MULTILINE)
    (log_line,) = re.findall(r"^inputs_time=\$\(git log -1 --format=%ct -- (.+)\)$", images_sh, re.MULTILINE)
    committed = log_line.split()
    for hashed in find_line.split():
        assert hashed.startswith("build/") or any(hashed == c or hashed.startswith(c + "/") for c in committed), (
            f"{hashed} is hashed but a commit to it would not change the build's timestamp"
        )
