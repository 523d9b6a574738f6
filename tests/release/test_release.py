"""`make release` (tools/release.py) before it builds anything: what it accepts and refuses as VERSION and
REGISTRY, how it rewrites the chart's values, and the refusals of a dirty tree (in a repository of its own) and
of a registry that does not answer. A real release, to the test cluster's registry, and what a user does with it
(`helm pull`, `helm show`, the signatures, the SBOMs, the labels, the same version refused) are
tests/e2e/test_release.py's: one release a `make test`, installed there too, not a second one here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from loading import load
from releasing import RELEASE_PY, repo_copy, services

REPO = Path(__file__).resolve().parents[2]
CHART_NAME = "neuron-helm-chart"

pytestmark = [pytest.mark.integration]


release = load("release", RELEASE_PY)


def run(*args: str | Path, cwd: Path = REPO, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}")
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, check=False, cwd=cwd, env=env, timeout=timeout
    )


def release_cli(*args: str, release_py: Path = RELEASE_PY, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return run(sys.executable, release_py, *args, cwd=cwd)


# --- what the release checks before it does anything (no podman, no registry) ----------------------------------


@pytest.mark.parametrize("version", ["1.2.3", "0.1.0", "1.2.3-rc.1", "1.2.3-e2e.1732412345", "10.20.30+build.7"])
def test_a_semantic_version_is_accepted(version: str) -> None:
    assert release.check_version(version) == version


@pytest.mark.parametrize(
    ("version", "says"),
    [
        ("", "VERSION is not set"),
        ("v1.2.3", "no leading 'v'"),
        ("1.2", "not a semantic version"),
        ("01.2.3", "not a semantic version"),
        ("1.2.3-", "not a semantic version"),
        ("latest", "not a semantic version"),
    ],
)
def test_a_bad_version_is_refused_with_what_a_good_one_looks_like(version: str, says: str) -> None:
    with pytest.raises(release.ReleaseError, match=says):
        release.check_version(version)


@pytest.mark.parametrize(
    "registry",
    [
        "127.0.0.1:5000",
        "localhost:5000",
        "[::1]:5000",
        "ghcr.io/my-org",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com",
        "harbor.example.com/ml-platform",
    ],
)
def test_a_registry_host_with_a_port_and_path_is_accepted(registry: str) -> None:
    assert release.check_registry(registry + "/") == registry


@pytest.mark.parametrize(
    ("registry", "says"),
    [
        ("", "REGISTRY is not set"),
        ("oci://ghcr.io/my-org", "has a scheme"),
        ("http://127.0.0.1:5000", "has a scheme"),
        ("ghcr.io/My-Org", "lowercase path"),
        ("127.0.0.1:99999", "host\\[:port\\]"),
        ("ghcr.io//x", "host\\[:port\\]"),
        ("-bad.example.com", "host\\[:port\\]"),
    ],
)
def test_a_bad_registry_is_refused_with_examples(registry: str, says: str) -> None:
    with pytest.raises(release.ReleaseError, match=says):
        release.check_registry(registry)


@pytest.mark.parametrize(
    ("registry", "loopback"),
    [
        ("127.0.0.1:5000", True),
        ("127.1.2.3:5000/x", True),
        ("localhost:5000", True),
        ("[::1]:5000", True),
        ("10.0.0.1:5000", False),
        ("localhost.example.com", False),
        ("ghcr.io/my-org", False),
    ],
)
def test_only_loopback_registries_get_plain_http(registry: str, loopback: bool) -> None:
    assert release.is_loopback(registry) is loopback


def test_build_metadata_becomes_an_underscore_in_image_tags_as_helm_does_for_charts() -> None:
    assert release.image_tag("1.2.3+build.7") == "1.2.3_build.7"
    assert release.image_tag("1.2.3-rc.1") == "1.2.3-rc.1"


def test_make_release_without_version_says_how_to_call_it() -> None:
    result = run("make", "-s", "release", "REGISTRY=127.0.0.1:5000", "VERSION=")
    assert result.returncode != 0
    assert "VERSION is not set: make release REGISTRY=" in result.stderr


def test_every_service_image_block_in_values_is_found_and_every_service_has_one() -> None:
    values = yaml.safe_load((REPO / "charts" / CHART_NAME / "values.yaml").read_text())
    blocks = release.image_blocks(values)
    assert sorted(set(blocks.values())) == services()
    assert blocks[("devicePlugin", "image")] == "device-plugin"
    assert blocks[("tests", "image")] == "node-problem-detector"  # the helm test pods run the detector's image


def test_released_values_change_only_the_image_scalars_and_keep_every_comment() -> None:
    text = (REPO / "charts" / CHART_NAME / "values.yaml").read_text()
    pushed = {
        svc: release.PushedImage(svc, f"neuron/{svc}", "1.2.3", "sha256:" + f"{i:x}" * 64)
        for i, svc in enumerate(services(), start=1)
    }
    out = release.released_values(text, "registry.example.com/team", pushed)
    assert [line for line in out.splitlines() if line.lstrip().startswith("#")] == [
        line for line in text.splitlines() if line.lstrip().startswith("#")
    ]
    before, after = yaml.safe_load(text), yaml.safe_load(out)
    for path, svc in release.image_blocks(before).items():
        block_before, block_after = before, after
        for key in path:
            block_before, block_after = block_before[key], block_after[key]
        assert block_after == block_before | {
            "registry": "registry.example.com/team", "repository": f"neuron/{svc}", "tag": "1.2.3",
            "digest": pushed[svc].digest,
        }  # fmt: skip
        block_before.clear()
        block_after.clear()
    assert after == before  # nothing else changed


def test_set_scalars_refuses_a_path_values_yaml_lacks() -> None:
    with pytest.raises(release.ReleaseError, match=r"has no a\.c"):
        release.set_scalars("a:\n  b: 1\n", {("a", "c"): "x"})


# --- refusals that stop before the build, in a repository of their own ------------------------------------------


@pytest.mark.parametrize("change", ["untracked", "modified"])
def test_a_dirty_tree_is_refused_before_anything_is_built(tmp_path: Path, change: str) -> None:
    copy = repo_copy(tmp_path)
    if change == "untracked":
        (copy / "notes.txt").write_text("x")
    else:
        (copy / "tools" / "release.py").write_text((copy / "tools" / "release.py").read_text() + "\n")
    result = release_cli("--registry", "127.0.0.1:1", "--version", "1.0.0", release_py=copy / "tools" / "release.py")
    assert result.returncode == 1
    assert "the work tree has uncommitted changes or untracked files" in result.stderr
    assert "building" not in result.stdout


def test_an_unreachable_registry_is_reported_before_anything_is_built() -> None:
    with socket.socket() as s:  # a port nobody listens on while the socket holds it unlistened
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        result = release_cli("--registry", f"127.0.0.1:{port}", "--version", "1.0.0", "--allow-dirty")
    assert result.returncode == 1
    assert f"could not ask 127.0.0.1:{port} whether" in result.stderr
    assert "connection refused" in result.stderr
    assert "building" not in result.stdout
