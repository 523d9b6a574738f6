"""`make release REGISTRY=... VERSION=...`: publishes the service images and the chart to an OCI registry,
the way users install them (`helm upgrade --install neuron-helm-chart oci://$REGISTRY/neuron/neuron-helm-chart`).

    release.py --registry REGISTRY --version VERSION [--allow-dirty]

1. refuses a bad VERSION (semantic version) or REGISTRY (host[:port][/path], no scheme), a dirty work tree, and
   a VERSION whose chart the registry already has;
2. builds every service image with tests/cluster/images.sh (the one image build; it smoke-runs each image);
3. pushes each to $REGISTRY/neuron/<service>:$VERSION (semver's `+` as `_`, as Helm stores chart tags) and
   records the digest the registry stored;
4. packages the chart with version and appVersion VERSION, each project image's registry, repository, tag and
   digest filled in (so an install pulls exactly the pushed bytes) and the Artifact Hub image list to match;
5. pushes the chart to oci://$REGISTRY/neuron;
6. records what it pushed, every reference with its digest, in build/release-$VERSION.json (for signing,
   mirroring or a deployment's pin).

Loopback registries (127.0.0.0/8, localhost, [::1]) are spoken to over plain HTTP, any other over HTTPS.
Credentials are the clients' own: `podman login` and `helm registry login` beforehand.
--allow-dirty is for the test harness (its images then carry a `-dirty` revision label): `make release` never
passes it.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "neuron-helm-chart"
IMAGES_SH = REPO / "tests" / "cluster" / "images.sh"
IMAGES_TSV = REPO / "build" / "images.tsv"
IMAGE_WHEELS = REPO / "build" / "wheels"  # the wheels images.sh put in the build context, the lock's own
IMAGE_LOCK = REPO / "services" / "image-wheels.lock"
RECORD = REPO / "build" / "release-{version}.json"
NAMESPACE = "neuron"  # $REGISTRY/neuron/<service> for the images, oci://$REGISTRY/neuron for the chart
SOURCE_REPOSITORY_PREFIX = "neuron-helm-chart/"  # values.yaml's repositories of the project's images (make images)
ARTIFACTHUB_IMAGES = "artifacthub.io/images"

# Semantic Versioning 2.0.0's own grammar (semver.org), which Helm requires of a chart version.
SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)
# The distribution reference grammar's host (a DNS name or an IPv4 address, or an IPv6 one in brackets), port
# and lowercase path components.
_HOST = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:.]+\])"
)
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REGISTRY = re.compile(rf"(?P<host>{_HOST})(?::(?P<port>[0-9]{{1,5}}))?(?P<path>(?:/{_PATH_COMPONENT})*)")


class ReleaseError(Exception):
    """A refusal or failure, worded for the person who ran `make release`."""


def check_version(version: str) -> str:
    if not version:
        raise ReleaseError(
            "VERSION is not set: make release REGISTRY=<registry> VERSION=<semantic version, e.g. 1.2.3>"
        )
    if not SEMVER.fullmatch(version):
        raise ReleaseError(
            f"VERSION '{version}' is not a semantic version (MAJOR.MINOR.PATCH[-prerelease][+build], e.g. 1.2.3 or "
            "1.2.3-rc.1; no leading 'v'): Helm requires one for a chart version"
        )
    return version


def image_tag(version: str) -> str:
    """The images' tag for a version: an OCI tag cannot hold semver's `+` (build metadata), and Helm stores such a
    chart version under `_` instead, so the images follow the same rule."""
    return version.replace("+", "_")


def check_registry(registry: str) -> str:
    if not registry:
        raise ReleaseError(
            "REGISTRY is not set: make release REGISTRY=<host[:port][/path]> VERSION=<version>, e.g. "
            "REGISTRY=ghcr.io/<owner> or REGISTRY=127.0.0.1:5000"
        )
    if "://" in registry:
        raise ReleaseError(
            f"REGISTRY '{registry}' has a scheme: give host[:port][/path] alone (the release pushes the chart to "
            "oci://$REGISTRY/neuron and picks plain HTTP for loopback registries itself)"
        )
    match = REGISTRY.fullmatch(registry.rstrip("/"))
    if not match or (match["port"] and not 0 < int(match["port"]) < 65536):
        raise ReleaseError(
            f"REGISTRY '{registry}' is not host[:port][/path] with a lowercase path (e.g. 123456789012.dkr.ecr."
            "us-east-1.amazonaws.com, ghcr.io/<owner>, harbor.example.com/<project>, 127.0.0.1:5000)"
        )
    return registry.rstrip("/")


def is_loopback(registry: str) -> bool:
    """Whether the registry's host is this machine: the only ones spoken to over plain HTTP."""
    match = REGISTRY.fullmatch(registry)
    if not match:
        return False
    host = match["host"].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class PushedImage:
    service: str
    repository: str  # without the registry: neuron/<service>
    tag: str
    digest: str


def image_blocks(values: Mapping[str, Any], path: tuple[str, ...] = ()) -> dict[tuple[str, ...], str]:
    """The values paths of every `image` block of a project image, and that image's service (its directory under
    services/): the blocks whose repository is `neuron-helm-chart/<service>`."""
    found: dict[tuple[str, ...], str] = {}
    for key, value in values.items():
        if not isinstance(value, Mapping):
            continue
        repository = value.get("repository")
        if key == "image" and isinstance(repository, str) and repository.startswith(SOURCE_REPOSITORY_PREFIX):
            found[(*path, key)] = repository.removeprefix(SOURCE_REPOSITORY_PREFIX)
        else:
            found |= image_blocks(value, (*path, key))
    return found


_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-]+):(?P<rest>.*)$")


def set_scalars(text: str, updates: Mapping[tuple[str, ...], str]) -> str:
    """values.yaml's text with the scalar at each path replaced, and every comment kept (`helm show values` is the
    users' documentation). Every path must name an existing scalar."""
    stack: list[tuple[int, str]] = []
    out: list[str] = []
    done: set[tuple[str, ...]] = set()
    for original in text.splitlines(keepends=True):
        match = _KEY_LINE.match(original)
        if match is None or original.lstrip().startswith("#"):
            out.append(original)
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        path = tuple(key for _, key in stack)
        if path not in updates:
            out.append(original)
            continue
        comment = re.search(r"\s+#.*$", match["rest"])
        newline = "\n" if original.endswith("\n") else ""
        # a JSON string is a YAML double-quoted scalar
        value = json.dumps(updates[path])
        out.append(f"{match['indent']}{match['key']}: {value}{comment[0] if comment else ''}{newline}")
        done.add(path)
    missing = set(updates) - done
    if missing:
        raise ReleaseError(f"values.yaml has no {', '.join('.'.join(p) for p in sorted(missing))}")
    result = "".join(out)
    parsed = yaml.safe_load(result)
    for path, value in updates.items():
        node = parsed
        for key in path:
            node = node[key]
        if node != value:
            raise ReleaseError(f"values.yaml: {'.'.join(path)} did not become {value!r} (its layout is unexpected)")
    return result


def released_values(text: str, registry: str, images: Mapping[str, PushedImage]) -> str:
    """values.yaml as released: each project image block names the registry, repository, tag and digest pushed."""
    updates: dict[tuple[str, ...], str] = {}
    for path, service in image_blocks(yaml.safe_load(text)).items():
        if service not in images:
            raise ReleaseError(f"values.yaml's {'.'.join(path)} names {service}, which the image build did not make")
        pushed = images[service]
        updates |= {
            (*path, "registry"): registry,
            (*path, "repository"): pushed.repository,
            (*path, "tag"): pushed.tag,
            (*path, "digest"): pushed.digest,
        }
    return set_scalars(text, updates)


def artifacthub_images(rendered_images: Sequence[tuple[str, str]]) -> str:
    """The `artifacthub.io/images` annotation's value: a YAML list of {name, image}."""
    return "".join(f"- name: {name}\n  image: {image}\n" for name, image in rendered_images)


def released_chart_yaml(text: str, registry: str, images: Mapping[str, PushedImage]) -> str:
    """Chart.yaml with the Artifact Hub image list naming the pushed images by tag and digest (version and
    appVersion are set by `helm package`)."""
    block = re.compile(rf"^(  {re.escape(ARTIFACTHUB_IMAGES)}: \|\n)(?:    .*\n)+", re.MULTILINE)
    if not block.search(text):
        raise ReleaseError(f"Chart.yaml has no '{ARTIFACTHUB_IMAGES}: |' annotation")
    listed = artifacthub_images(
        [(name, f"{registry}/{p.repository}:{p.tag}@{p.digest}") for name, p in sorted(images.items())]
    )
    indented = "".join(f"    {line}\n" for line in listed.splitlines())
    return block.sub(lambda m: m[1] + indented, text, count=1)


# --- I/O ---------------------------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[release] {message}", flush=True)


def run(
    *args: str | Path, check: bool = True, capture: bool = True, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in args], capture_output=capture, text=True, check=False, cwd=REPO, env=env)
    if check and result.returncode != 0:
        raise ReleaseError(f"{' '.join(map(str, args))} failed ({result.returncode}):\n{result.stderr or ''}")
    return result


def _venv_tool(name: str) -> str:
    """The pinned build make setup links into .venv/bin, else whatever is on PATH."""
    pinned = REPO / ".venv" / "bin" / name
    return str(pinned) if pinned.exists() else name


def helm() -> str:
    return _venv_tool("helm")


def cosign() -> str:
    return _venv_tool("cosign")  # tools/build-cosign.sh


def syft() -> str:
    return _venv_tool("syft")  # tools/build-syft.sh


def _verify_wheels() -> Any:
    """services/verify_wheels.py, the image lock's reader that the image build runs: imported when an SBOM is
    written, so that the release's refusals before the build need nothing but this file."""
    if str(REPO / "services") not in sys.path:
        sys.path.insert(0, str(REPO / "services"))
    import verify_wheels

    return verify_wheels


def normalize(name: str) -> str:
    return str(_verify_wheels().normalize(name))


def own_packages() -> set[str]:
    """The normalized names of the project's own distributions (libs/ and services/)."""
    return {
        normalize(tomllib.loads(p.read_text())["project"]["name"])
        for p in [*REPO.glob("libs/*/pyproject.toml"), *REPO.glob("services/*/pyproject.toml")]
    }


def syft_sbom(source: str, name: str, version: str, out: Path) -> dict[str, Any]:
    """syft's SPDX 2.3 document of a syft source (`oci-archive:PATH` for an image, `dir:PATH`), written to OUT
    and returned. Offline: syft asks for no update, and reads nothing but the source."""
    env = dict(os.environ, SYFT_CHECK_FOR_APP_UPDATE="false")
    run(syft(), "scan", source, "--quiet", "--output", f"spdx-json={out}", "--source-name", name,
        "--source-version", version, env=env)  # fmt: skip
    document: dict[str, Any] = json.loads(out.read_text())
    return document


def wheel_digests(directory: Path) -> dict[tuple[str, str], str]:
    """(normalized name, version) -> the sha256 of that wheel in DIRECTORY."""
    digests = {}
    for wheel in directory.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        digests[(normalize(name), version)] = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return digests


def with_provenance(
    document: dict[str, Any], wheels: Mapping[tuple[str, str], str], lock_text: str, own: set[str], revision: str
) -> dict[str, Any]:
    """syft's document with what syft cannot know added, and checked against the lock.

    Why this is ours: syft reads the venv's installed distributions (their .dist-info), which keep no
    digest of the wheel they came from (pip records one only for a URL install), so syft's SPDX
    packages for Python carry no checksum (it writes package checksums for Java archives and Go
    modules alone); nor can it tell the project's own packages from the third-party ones. Each
    third-party Python package gets the sha256 of the wheel the image build installed (WHEELS, the
    build context), which must be one the lock admits; a distribution the lock never admitted is an
    error, not a silent entry. The project's own packages name the commit they were built from."""
    document = copy.deepcopy(document)
    admitted = _verify_wheels().allowed(lock_text)
    for package in document["packages"]:
        purls = [r["referenceLocator"] for r in package.get("externalRefs", []) if r["referenceType"] == "purl"]
        if not any(purl.startswith("pkg:pypi/") for purl in purls):
            continue
        name, version = package["name"], package["versionInfo"]
        key = normalize(name)
        if key in own:
            package["sourceInfo"] = f"built from neuron-helm-chart commit {revision}"
            continue
        digest = wheels.get((key, version))
        if digest is None or digest not in admitted.get((key, version), set()):
            raise ReleaseError(f"{name} {version} is in the image but not in the image lock")
        package["checksums"] = [{"algorithm": "SHA256", "checksumValue": digest}]
    document["creationInfo"]["creators"].append("Tool: neuron-helm-chart tools/release.py")
    return document


def image_sbom(image_id: str, service: str, version: str, out: Path) -> dict[str, Any]:
    """The SPDX SBOM of a local image: podman's OCI archive of it read by syft (no registry: the same for any
    REGISTRY, and nothing pulled back), with the provenance syft cannot know."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "image.tar"
        run("podman", "save", "-q", "--format", "oci-archive", "-o", archive, image_id)
        document = syft_sbom(f"oci-archive:{archive}", f"{NAMESPACE}/{service}", version, out)
    revision = run("git", "rev-parse", "HEAD").stdout.strip()
    document = with_provenance(document, wheel_digests(IMAGE_WHEELS), IMAGE_LOCK.read_text(), own_packages(), revision)
    out.write_text(json.dumps(document, indent=1) + "\n")
    return document


def check_sign_key(sign_key: str) -> Path:
    if not sign_key:
        raise ReleaseError(
            "a release is signed: pass --sign-key (make release SIGN_KEY=...), a cosign private key "
            "(`cosign generate-key-pair` makes one; its password comes from $COSIGN_PASSWORD)"
        )
    key = Path(sign_key)
    if not key.is_file():
        raise ReleaseError(f"--sign-key {sign_key}: no such file")
    if "COSIGN_PASSWORD" not in os.environ and not sys.stdin.isatty():
        raise ReleaseError("set COSIGN_PASSWORD to the password of --sign-key (empty for a key without one)")
    return key


class Signer:
    """Signs what the release pushed with cosign and the release key, and attests each image's SBOM
    (SPDX, written by syft: image_sbom) as a signed in-toto statement beside it in the registry. No transparency
    log: the signatures verify with the release's public key alone (`cosign verify --key ...
    --insecure-ignore-tlog`), which works the same in an air-gapped registry."""

    def __init__(self, key: Path, loopback: bool, workdir: Path) -> None:
        self.key, self.workdir = key, workdir
        self.flags = ["--yes", "--key", str(key), "--tlog-upload=false"]
        if loopback:
            self.flags += ["--allow-insecure-registry", "--allow-http-registry"]

    def sign(self, ref: str) -> None:
        log(f"signing {ref}")
        run(cosign(), "sign", *self.flags, ref)

    def attest_sbom(self, service: str, local_image: str, ref: str, version: str) -> Path:
        sbom = self.workdir / f"sbom-{service}-{version}.spdx.json"
        log(f"writing the SBOM of {local_image[:19]} with syft")
        image_sbom(local_image, service, version, sbom)
        log(f"attesting the SBOM of {ref}")
        run(cosign(), "attest", *self.flags, "--type", "spdxjson", "--predicate", sbom, ref)
        return sbom


def refuse_dirty_tree() -> None:
    status = run("git", "status", "--porcelain").stdout
    if status.strip():
        raise ReleaseError(
            "the work tree has uncommitted changes or untracked files: a release is built from a commit, so "
            f"commit or stash them first:\n{status}"
        )


def refuse_existing_version(registry: str, version: str, plain_http: list[str]) -> None:
    ref = f"oci://{registry}/{NAMESPACE}/{CHART.name}"
    result = run(helm(), "show", "chart", ref, "--version", version, *plain_http, check=False)
    if result.returncode == 0:
        raise ReleaseError(
            f"{ref} version {version} is already in the registry: a released version is never replaced, pick "
            "another VERSION"
        )
    if "not found" not in result.stderr:
        raise ReleaseError(f"could not ask {registry} whether {ref}:{version} exists:\n{result.stderr}")


def build_images() -> dict[str, tuple[str, str]]:
    """Service -> (local name, image ID) of the images tests/cluster/images.sh built."""
    log(f"building the images ({IMAGES_SH.relative_to(REPO)})")
    run(IMAGES_SH, capture=False)
    built: dict[str, tuple[str, str]] = {}
    for line in IMAGES_TSV.read_text().splitlines():
        service, local_name, image_id = line.split("\t")
        built[service] = (local_name, image_id)
    return built


def labelled(image_id: str, version: str) -> str:
    """The image with the release's version label, on the same layers: its own image ID.

    A release's images must differ from the local builds of the same commit: a kubelet that pulled an
    image keeps a record per image ID, and then refuses a local image of that ID under pull policy
    Never (ErrImageNeverPull) until it can verify it in the registry. A derived image of the one build
    (tests/cluster/images.sh, which labels it with the package's version), not a second build."""
    inspected = run("podman", "image", "inspect", "--format", "{{.Created.Unix}}", image_id).stdout
    created = int(inspected.strip())
    with tempfile.TemporaryDirectory() as context:
        iid = Path(context) / "iid"
        subprocess.run(
            # --no-cache: podman 4.3 would take a cached image of the same layers and LABEL line, whose
            # base had other labels (another commit's revision). --timestamp: the build's own (the
            # commit's), so that a release of a commit is still the same image ID each time.
            ["podman", "build", "-q", "--no-cache", "--timestamp", str(created), "--network", "none",
             "--iidfile", str(iid), "-f", "-", context],
            input=f"FROM {image_id}\nLABEL org.opencontainers.image.version={json.dumps(version)}\n",
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return iid.read_text().strip()


def push_images(
    registry: str, version: str, built: Mapping[str, tuple[str, str]], tls: list[str]
) -> dict[str, PushedImage]:
    pushed: dict[str, PushedImage] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for service, (local_name, image_id) in sorted(built.items()):
            repository = f"{NAMESPACE}/{service}"
            destination = f"{registry}/{repository}:{image_tag(version)}"
            digest_file = Path(tmp) / f"{service}.digest"
            release_id = labelled(image_id, version)
            log(f"pushing {local_name} ({image_id[:19]}, labelled {version}: {release_id[:19]}) to {destination}")
            run("podman", "push", "-q", *tls, "--digestfile", digest_file, release_id, f"docker://{destination}")
            digest = digest_file.read_text().strip()
            if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
                raise ReleaseError(f"podman push recorded no digest for {destination} ({digest!r})")
            pushed[service] = PushedImage(service, repository, image_tag(version), digest)
    return pushed


def package_chart(registry: str, version: str, pushed: Mapping[str, PushedImage], out: Path) -> Path:
    staged = out / CHART.name
    shutil.copytree(CHART, staged, ignore=shutil.ignore_patterns("ci"))
    (staged / "values.yaml").write_text(released_values((CHART / "values.yaml").read_text(), registry, pushed))
    (staged / "Chart.yaml").write_text(released_chart_yaml((CHART / "Chart.yaml").read_text(), registry, pushed))
    run(helm(), "lint", "--strict", staged)
    run(helm(), "package", staged, "--version", version, "--app-version", version, "--destination", out)
    return out / f"{CHART.name}-{version}.tgz"


def release(registry: str, version: str, sign_key: str = "", allow_dirty: bool = False) -> dict[str, PushedImage]:
    registry, version = check_registry(registry), check_version(version)
    loopback = is_loopback(registry)
    plain_http = ["--plain-http"] if loopback else []
    tls = ["--tls-verify=false"] if loopback else []
    if not allow_dirty:
        refuse_dirty_tree()
    refuse_existing_version(registry, version, plain_http)
    key = check_sign_key(sign_key)
    built = build_images()
    pushed = push_images(registry, version, built, tls)
    signer = Signer(key, loopback, RECORD.parent)
    RECORD.parent.mkdir(exist_ok=True)
    sboms = {}
    for service, p in sorted(pushed.items()):
        ref = f"{registry}/{p.repository}@{p.digest}"
        signer.sign(ref)
        sboms[service] = str(signer.attest_sbom(service, built[service][1], ref, version).relative_to(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        package = package_chart(registry, version, pushed, Path(tmp))
        ref = f"oci://{registry}/{NAMESPACE}"
        log(f"pushing {package.name} to {ref}")
        result = run(helm(), "push", package, ref, *plain_http)
        log((result.stdout + result.stderr).strip())
    chart_digest = re.search(r"^Digest: (sha256:[0-9a-f]{64})$", result.stdout + result.stderr, re.MULTILINE)
    if not chart_digest:
        raise ReleaseError(f"helm push printed no chart digest:\n{result.stdout}{result.stderr}")
    chart_ref = f"{ref}/{CHART.name}:{image_tag(version)}@{chart_digest[1]}"
    signer.sign(f"{registry}/{NAMESPACE}/{CHART.name}@{chart_digest[1]}")
    image_refs = {s: f"{registry}/{p.repository}:{p.tag}@{p.digest}" for s, p in sorted(pushed.items())}
    record = {"version": version, "chart": chart_ref, "images": image_refs, "sboms": sboms, "signed": True}
    record_path = Path(str(RECORD).format(version=version))
    record_path.parent.mkdir(exist_ok=True)
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    for line in [chart_ref, *image_refs.values()]:
        log(line)
    log(f"recorded in {record_path.relative_to(REPO)}")
    log(f"install: helm upgrade --install {CHART.name} {ref}/{CHART.name} --version {version}")
    return pushed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registry", default="", help="host[:port][/path] (no scheme)")
    parser.add_argument("--version", default="", help="the chart's and the images' semantic version")
    parser.add_argument(
        "--sign-key",
        default=os.environ.get("SIGN_KEY", ""),
        help="cosign private key signing the images, their SBOM attestations and the chart ($SIGN_KEY; its "
        "password from $COSIGN_PASSWORD)",
    )
    parser.add_argument("--allow-dirty", action="store_true", help="for the test harness: release uncommitted work")
    args = parser.parse_args(argv)
    try:
        release(args.registry, args.version, args.sign_key, args.allow_dirty)
    except ReleaseError as e:
        print(f"[release] error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
