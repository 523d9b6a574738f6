"""`make release` (tools/release.py) against a real registry: the CNCF distribution registry that
tests/registry.sh starts on a free loopback port. One release builds (podman caches the layers), pushes the
images and the chart; then what a user does with it is checked: `helm pull`, `helm show values|readme` from the
OCI reference, the rendered images against the digests the registry serves. The refusals (a bad VERSION or
REGISTRY, a dirty tree, a version already released) are checked without building anything.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import signing
import yaml
import yaml_streams
from loading import load

REPO = Path(__file__).resolve().parents[2]
HELM = str(REPO / ".venv" / "bin" / "helm")
RELEASE_PY = REPO / "tools" / "release.py"
REGISTRY_SH = REPO / "tests" / "registry.sh"
CHART_NAME = "neuron-helm-chart"
# with build metadata: Helm stores the chart under 0.1.0-test.1_release.2, and so must the images be tagged
VERSION = "0.1.0-test.1+release.2"
TAG = "0.1.0-test.1_release.2"

# on a fresh machine the first release builds the base image and every image (several minutes, cached afterwards)
pytestmark = [pytest.mark.timeout(1800), pytest.mark.integration]


release = load("release", RELEASE_PY)


def services() -> list[str]:
    return sorted(p.parent.name for p in (REPO / "services").glob("*/pyproject.toml"))


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


def repo_copy(tmp_path: Path) -> Path:
    """A git repository holding tools/release.py alone, committed: the release tool finds its repository from its
    own path, so a copy is a clean tree that a test can make dirty."""
    copy = tmp_path / "repo"
    (copy / "tools").mkdir(parents=True)
    shutil.copy(RELEASE_PY, copy / "tools" / "release.py")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=copy, check=True, capture_output=True)
    return copy


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


# --- a real release to a real registry ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("docker-registry") is None:
        pytest.fail("docker-registry is missing: make setup installs it (tools/apt-packages.txt)")
    directory = tmp_path_factory.mktemp("registry")
    port = free_port()
    result = run(REGISTRY_SH, "start", directory, str(port))
    assert result.returncode == 0, result.stderr
    try:
        yield f"127.0.0.1:{port}"
    finally:
        run(REGISTRY_SH, "stop", directory)


@pytest.fixture(scope="module")
def release_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return signing.key_pair(tmp_path_factory.mktemp("release-key"))


@pytest.fixture(scope="module")
def released(registry: str, release_key: tuple[Path, Path]) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0:
        pytest.skip("building the images needs root (rootful podman)")
    # --allow-dirty: the release of the work tree under test, uncommitted changes included
    result = release_cli(
        "--registry", registry, "--version", VERSION, "--allow-dirty", "--sign-key", str(release_key[0])
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return result


def manifest_digest(registry: str, repository: str, reference: str) -> str:
    """The digest the registry serves for a manifest, as a pulling runtime sees it."""
    request = urllib.request.Request(
        f"http://{registry}/v2/{repository}/manifests/{reference}",
        method="HEAD",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.headers["Docker-Content-Digest"])


def pulled_chart(registry: str, tmp_path: Path) -> Path:
    result = run(HELM, "pull", f"oci://{registry}/neuron/{CHART_NAME}", "--version", VERSION, "--plain-http",
                 "--destination", tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    (package,) = tmp_path.glob(f"{CHART_NAME}-*.tgz")
    with tarfile.open(package) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / CHART_NAME


def rendered_images(chart: Path) -> set[str]:
    images: set[str] = set()
    # the DRA driver replaces the device plugin on a node, so its image comes from a second rendering
    for values in (["scheduler.enabled=true"], ["devicePlugin.enabled=false", "draDriver.enabled=true"]):
        sets = [a for v in values for a in ("--set", v)]
        out = run(HELM, "template", CHART_NAME, chart, *sets, "--kube-version", "v1.36.3")
        assert out.returncode == 0, out.stderr
        for doc in yaml_streams.load_all(out.stdout):
            spec: Any = (doc or {}).get("spec", {})
            spec = spec.get("template", {}).get("spec", spec)
            images |= {c["image"] for c in spec.get("containers", []) + spec.get("initContainers", [])}
    return images


@pytest.mark.usefixtures("released")
@pytest.mark.slow
@pytest.mark.root
def test_the_pulled_chart_refers_to_the_pushed_images_by_tag_and_the_registrys_digest(
    registry: str, tmp_path: Path
) -> None:
    chart = pulled_chart(registry, tmp_path)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    assert (meta["version"], meta["appVersion"]) == (VERSION, VERSION)
    expected = {
        svc: f"{registry}/neuron/{svc}:{TAG}@{manifest_digest(registry, f'neuron/{svc}', TAG)}" for svc in services()
    }
    # the digest is the one the tag resolves to, and the registry serves the manifest by it
    for svc, ref in expected.items():
        assert manifest_digest(registry, f"neuron/{svc}", ref.rsplit("@", 1)[1]) == ref.rsplit("@", 1)[1]
    project_images = {i for i in rendered_images(chart) if not i.startswith("registry.k8s.io/")}
    assert project_images == set(expected.values())
    annotated = yaml.safe_load(meta["annotations"]["artifacthub.io/images"])
    assert {entry["name"]: entry["image"] for entry in annotated} == expected
    record = json.loads((REPO / "build" / f"release-{VERSION}.json").read_text())
    assert record["images"] == expected
    chart_digest = manifest_digest(registry, f"neuron/{CHART_NAME}", TAG)
    assert record["chart"] == f"oci://{registry}/neuron/{CHART_NAME}:{TAG}@{chart_digest}"


@pytest.mark.slow
@pytest.mark.root
def test_every_image_and_the_chart_verify_with_the_release_key_and_no_other(
    registry: str, released: subprocess.CompletedProcess[str], release_key: tuple[Path, Path], tmp_path: Path
) -> None:
    record = json.loads((REPO / "build" / f"release-{VERSION}.json").read_text())
    chart = record["chart"].removeprefix("oci://").replace(f":{TAG}@", "@")
    refs = [*record["images"].values(), chart]
    for ref in refs:
        signing.verify(ref, release_key[1])
    _, stranger = signing.key_pair(tmp_path / "stranger")
    for ref in refs:
        refused = signing.verify(ref, stranger, check=False)
        assert refused.returncode != 0, ref
        assert "no matching signatures" in refused.stderr, refused.stderr


@pytest.mark.slow
@pytest.mark.root
def test_each_image_carries_a_signed_sbom_of_what_it_holds(
    registry: str, released: subprocess.CompletedProcess[str], release_key: tuple[Path, Path]
) -> None:
    record = json.loads((REPO / "build" / f"release-{VERSION}.json").read_text())
    lock = (REPO / "services" / "image-wheels.lock").read_text()
    for svc, ref in record["images"].items():
        subject, sbom = signing.attested_sbom(ref, release_key[1])
        assert "sha256:" + subject["digest"]["sha256"] == ref.rsplit("@", 1)[1]  # about this very image
        packages = {p["name"].lower(): p for p in sbom["packages"]}
        # the service's own package, built from the commit, and its third-party ones by the lock's digest
        assert f"neuron-{svc}".replace("neuron-node-problem-detector", "neuron-problem-detector") in packages, svc
        aiohttp = packages["aiohttp"]
        assert f"aiohttp=={aiohttp['versionInfo']} --hash=sha256:{aiohttp['checksums'][0]['checksumValue']}" in lock
        # what of Debian the image took: the interpreter and the C library at least
        debian = {p["name"] for p in sbom["packages"] if "pkg:deb/" in p["externalRefs"][0]["referenceLocator"]}
        assert {"libc6", "libpython3.11-minimal"} <= debian, (svc, sorted(debian))


def image_config(registry: str, repository: str, reference: str) -> dict[str, Any]:
    accept = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"
    get = urllib.request.Request(f"http://{registry}/v2/{repository}/manifests/{reference}", headers={"Accept": accept})
    with urllib.request.urlopen(get, timeout=10) as response:
        config_digest = json.load(response)["config"]["digest"]
    with urllib.request.urlopen(f"http://{registry}/v2/{repository}/blobs/{config_digest}", timeout=10) as response:
        config: dict[str, Any] = json.load(response)
    return {"id": config_digest, **config}


def test_the_pushed_images_are_labelled_with_the_release_version_so_their_ids_are_not_the_local_builds(
    registry: str, released: subprocess.CompletedProcess[str]
) -> None:
    """A kubelet that pulled an image records its ID, then refuses a local image of that ID under pull
    policy Never: a release must not share IDs with the images `make images` imports."""
    local_builds = {  # service -> the image ID tests/cluster/images.sh built, as the release read it
        line.split("\t")[0]: line.split("\t")[2] for line in (REPO / "build/images.tsv").read_text().splitlines()
    }
    for svc in services():
        config = image_config(registry, f"neuron/{svc}", TAG)
        assert config["config"]["Labels"]["org.opencontainers.image.version"] == VERSION, svc
        assert config["id"] != local_builds[svc], svc


def test_the_pushed_images_name_the_commit_they_were_built_from(
    registry: str, released: subprocess.CompletedProcess[str]
) -> None:
    """The revision and created labels are this tree's commit and its date, even when podman's layer
    cache holds a build of an earlier commit on the same layers (podman 4.3 reused it, labels and all)."""
    head = run("git", "rev-parse", "HEAD").stdout.strip()
    dirty = run("git", "status", "--porcelain", "--untracked-files=no").stdout.strip() != ""
    commit_time = int(run("git", "log", "-1", "--format=%ct", "HEAD").stdout)
    created = datetime.datetime.fromtimestamp(commit_time, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for svc in services():
        labels = image_config(registry, f"neuron/{svc}", TAG)["config"]["Labels"]
        assert labels["org.opencontainers.image.revision"] == head + ("-dirty" if dirty else ""), svc
        assert labels["org.opencontainers.image.created"] == created, svc
        assert labels["org.opencontainers.image.title"], svc


def test_helm_show_values_and_readme_from_the_oci_reference_are_the_documentation(registry: str) -> None:
    ref = f"oci://{registry}/neuron/{CHART_NAME}"
    values = run(HELM, "show", "values", ref, "--version", VERSION, "--plain-http")
    assert values.returncode == 0, values.stderr
    assert "# -- Image digest" in values.stdout  # the comments are the values' documentation
    parsed = yaml.safe_load(values.stdout)
    assert parsed["devicePlugin"]["image"]["registry"] == registry
    assert parsed["devicePlugin"]["image"]["digest"].startswith("sha256:")
    readme = run(HELM, "show", "readme", ref, "--version", VERSION, "--plain-http")
    assert readme.returncode == 0, readme.stderr
    assert f"helm upgrade --install {CHART_NAME} oci://" in readme.stdout


@pytest.mark.usefixtures("released")
@pytest.mark.slow
@pytest.mark.root
def test_a_release_without_a_key_is_refused_before_building(registry: str) -> None:
    result = release_cli("--registry", registry, "--version", "9.9.9-unsigned", "--allow-dirty")
    assert result.returncode == 1
    assert "a release is signed: pass --sign-key" in result.stderr
    assert "building" not in result.stdout


@pytest.mark.usefixtures("released")
@pytest.mark.slow
@pytest.mark.root
def test_a_version_already_released_is_refused_before_building(registry: str) -> None:
    result = release_cli("--registry", registry, "--version", VERSION, "--allow-dirty")
    assert result.returncode == 1
    assert f"version {VERSION} is already in the registry" in result.stderr
    assert "building" not in result.stdout
    # and nothing was pushed besides the first release
    catalog = json.loads(urllib.request.urlopen(f"http://{registry}/v2/_catalog", timeout=10).read())
    assert sorted(catalog["repositories"]) == sorted([f"neuron/{CHART_NAME}", *(f"neuron/{s}" for s in services())])


@pytest.mark.slow
@pytest.mark.root
def test_a_clean_tree_gets_past_the_tree_check_to_the_version_check(
    registry: str, released: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    copy = repo_copy(tmp_path)
    result = release_cli("--registry", registry, "--version", VERSION, release_py=copy / "tools" / "release.py")
    assert result.returncode == 1
    assert "uncommitted" not in result.stderr
    assert "is already in the registry" in result.stderr
