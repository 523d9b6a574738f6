"""An SPDX 2.3 SBOM of one service image, from what the image itself holds.

    sbom.py IMAGE SERVICE VERSION OUT [--podman ARGS...]

Read from inside the image (its own interpreter, run with podman): every Python distribution of its
venv (name, version; the third-party ones carry the sha256 of the wheel services/image-wheels.lock
admitted) and the Debian packages the build copied from the base (debian-packages.tsv, written by
services/debian_inventory.py). The project's own packages name the commit they were built from.
`make release` attaches it to the pushed image as a signed in-toto attestation (cosign attest
--type spdxjson); `cosign verify-attestation` reads it back.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shlex
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "services"))
from verify_wheels import allowed, normalize  # noqa: E402

INVENTORY = "/opt/neuron/share/neuron-helm-chart/debian-packages.tsv"
LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m, json; "
    "print(json.dumps(sorted({(d.metadata['Name'], d.version) for d in m.distributions()})))"
)
OWN_PACKAGES = {
    normalize(tomllib.loads(p.read_text())["project"]["name"])
    for p in [*REPO.glob("libs/*/pyproject.toml"), *REPO.glob("services/*/pyproject.toml")]
}


def podman_args(kind: str) -> list[str]:
    """tools/podman.args' `kind:` line: podman's options as tests/cluster/images.sh passes them too."""
    for line in (REPO / "tools" / "podman.args").read_text().splitlines():
        if line.startswith(f"{kind}:"):
            return shlex.split(line.removeprefix(f"{kind}:"))
    raise SystemExit(f"sbom.py: tools/podman.args has no {kind}: line")


PODMAN = ["podman", *podman_args("global")]
LIMITS = podman_args("run")


def in_image(podman: list[str], image: str, script: str) -> str:
    command = [*podman, "run", "--rm", *LIMITS, "--network", "none", "--entrypoint", "/opt/neuron/bin/python3"]
    result = subprocess.run(
        [*command, image, "-c", script],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"sbom.py: cannot read {image}: {result.stderr.strip()}")
    return result.stdout


def _id(kind: str, name: str) -> str:
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]", "-", f"{kind}-{name}")


def _package(spdx_id: str, name: str, version: str, purpose: str, purl: str) -> dict[str, Any]:
    return {
        "SPDXID": spdx_id,
        "name": name,
        "versionInfo": version,
        "downloadLocation": "NOASSERTION",
        "primaryPackagePurpose": purpose,
        "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}],
    }


def document(
    image: str,
    service: str,
    version: str,
    distributions: list[tuple[str, str]],
    debian: list[tuple[str, str, str]],
    lock_text: str,
    revision: str,
) -> dict[str, Any]:
    """The SBOM, pure: the image as the described package, containing each distribution and Debian package."""
    digests = allowed(lock_text)
    root = _id("Image", service)
    packages = [
        _package(root, service, version, "CONTAINER", f"pkg:oci/{service}?repository_url={image.rsplit(':', 1)[0]}")
    ]
    for name, dist_version in distributions:
        key = normalize(name)
        package = _package(_id("Python", key), name, dist_version, "LIBRARY", f"pkg:pypi/{key}@{dist_version}")
        if key in OWN_PACKAGES:
            package["sourceInfo"] = f"built from neuron-helm-chart commit {revision}"
        else:
            hashes = sorted(digests.get((key, dist_version), ()))
            if not hashes:
                raise SystemExit(f"sbom.py: {name} {dist_version} is in {image} but not in the image lock")
            package["checksums"] = [{"algorithm": "SHA256", "checksumValue": h} for h in hashes]
        packages.append(package)
    for name, deb_version, arch in debian:
        purl = f"pkg:deb/debian/{name}@{deb_version}?arch={arch}&distro=bookworm"
        packages.append(_package(_id("Debian", f"{name}-{arch}"), name, deb_version, "LIBRARY", purl))
    relationships = [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": root}]
    relationships += [
        {"spdxElementId": root, "relationshipType": "CONTAINS", "relatedSpdxElement": p["SPDXID"]} for p in packages[1:]
    ]
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{service}-{version}",
        "documentNamespace": f"https://neuron-helm-chart.invalid/spdx/{service}-{version}-{uuid.uuid4()}",
        "creationInfo": {
            "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "creators": ["Tool: neuron-helm-chart tools/sbom.py"],
        },
        "packages": packages,
        "relationships": relationships,
    }


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    image, service, version, out = argv[:4]
    podman = argv[5:] if len(argv) > 4 and argv[4] == "--podman" else PODMAN
    distributions = [tuple(d) for d in json.loads(in_image(podman, image, LIST_DISTRIBUTIONS))]
    rows = in_image(podman, image, f"print(open({INVENTORY!r}).read(), end='')")
    debian = [tuple(line.split("\t")) for line in rows.splitlines() if line.strip()]
    revision = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO, check=True
    ).stdout.strip()
    lock = (REPO / "services" / "image-wheels.lock").read_text()
    sbom = document(image, service, version, distributions, debian, lock, revision)  # type: ignore[arg-type]
    Path(out).write_text(json.dumps(sbom, indent=1) + "\n")
    print(f"sbom.py: {out}: {len(distributions)} Python distributions, {len(debian)} Debian packages")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
