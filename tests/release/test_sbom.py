"""An image's SBOM as the release writes it (tools/release.py): syft's SPDX document of a root made as
services/rootfs.sh makes an image's (Debian files copied with their packages' dpkg records from
services/debian_inventory.py, a venv's installed distributions), with what only the release knows
added: the third-party wheels' digests, checked against the lock, and the commit of the project's own.
The SBOM of real images, signed and read back with cosign, is tests/e2e/test_release.py's."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loading import load
from releasing import RELEASE_PY

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration]  # syft runs

release = load("release", RELEASE_PY)
inventory = load("debian_inventory", REPO / "services" / "debian_inventory.py")
SITE = "opt/neuron/lib/python3.11/site-packages"
WHEEL = b"the reviewed wheel's bytes"
AIOHTTP = ("aiohttp", importlib.metadata.version("aiohttp"))
LOCK = f"# header\n{AIOHTTP[0]}=={AIOHTTP[1]} \\\n    --hash=sha256:{hashlib.sha256(WHEEL).hexdigest()}\n"
OWN = release.own_packages()


def image_like_root(root: Path) -> Path:
    """The C library and os-release (a link and its target) as rootfs.sh copies them, and the dist-info of a
    third-party distribution and of one of the project's, as pip leaves them in the image's venv."""
    for path in ["/etc/os-release", "/usr/lib/os-release", "/usr/lib/x86_64-linux-gnu/libc.so.6"]:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if os.path.islink(path):
            target.symlink_to(os.readlink(path))
        else:
            shutil.copy2(path, target)
    for name in [AIOHTTP[0], "neuron-node-metrics"]:
        dist_info = Path(str(importlib.metadata.distribution(name)._path))  # type: ignore[attr-defined]
        shutil.copytree(dist_info, root / SITE / dist_info.name)
    return root


def packages(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in document["packages"]}


def purl(package: dict[str, Any]) -> str:
    (found,) = [r["referenceLocator"] for r in package.get("externalRefs", []) if r["referenceType"] == "purl"]
    return str(found)


@pytest.fixture(scope="module")
def on_disk() -> Iterator[Path]:
    """A directory syft scans: not the session's temporaries on /dev/shm, since syft skips every path of a
    tmpfs mounted under /dev (or /run, /sys) as a system mount, and would find nothing there."""
    directory = Path(tempfile.mkdtemp(prefix="neuron-sbom-test-", dir="/var/tmp"))
    yield directory
    shutil.rmtree(directory)


@pytest.fixture(scope="module")
def scanned(on_disk: Path) -> dict[str, Any]:
    root = image_like_root(on_disk / "with-records")
    assert inventory.main([str(root)]) == 0
    out = on_disk / "with-records.spdx.json"
    return release.syft_sbom(f"dir:{root}", "neuron/node-metrics", "1.0.0", out)  # type: ignore[no-any-return]


def test_syft_lists_the_debian_packages_and_python_distributions_the_release_adds_provenance_to(
    scanned: dict[str, Any],
) -> None:
    wheels = {AIOHTTP: hashlib.sha256(WHEEL).hexdigest()}
    document = release.with_provenance(scanned, wheels, LOCK, OWN, "abc123")
    assert document["spdxVersion"] == "SPDX-2.3"
    assert {"Tool: syft-1.57.0", "Tool: neuron-helm-chart tools/release.py"} <= set(
        document["creationInfo"]["creators"]
    )
    by_name = packages(document)
    aiohttp = by_name[AIOHTTP[0]]
    assert purl(aiohttp) == f"pkg:pypi/aiohttp@{AIOHTTP[1]}"
    assert aiohttp["checksums"] == [{"algorithm": "SHA256", "checksumValue": hashlib.sha256(WHEEL).hexdigest()}]
    own = by_name["neuron-node-metrics"]
    assert own["sourceInfo"] == "built from neuron-helm-chart commit abc123"
    assert "checksums" not in own
    # the C library by the package that owns it, its version the build stage's, its distribution from os-release
    libc6 = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "libc6"], capture_output=True, text=True, check=True
    ).stdout
    assert by_name["libc6"]["versionInfo"] == libc6
    assert purl(by_name["libc6"]).startswith(f"pkg:deb/debian/libc6@{libc6.replace('+', '%2B')}?arch=amd64&")
    assert "distro=debian-12" in purl(by_name["libc6"])
    assert "base-files" in by_name  # os-release's owner


def test_without_the_dpkg_records_syft_finds_no_debian_package(on_disk: Path) -> None:
    """Why services/debian_inventory.py is kept beside syft: an image built FROM scratch has no dpkg database."""
    root = image_like_root(on_disk / "without-records")
    document = release.syft_sbom(f"dir:{root}", "neuron/node-metrics", "1.0.0", on_disk / "without-records.spdx.json")
    purls = [r["referenceLocator"] for p in document["packages"] for r in p.get("externalRefs", [])]
    assert not [p for p in purls if p.startswith("pkg:deb/")], purls
    assert f"pkg:pypi/aiohttp@{AIOHTTP[1]}" in purls  # while the venv's distributions are found


def test_a_third_party_distribution_the_lock_never_admitted_is_an_error(scanned: dict[str, Any]) -> None:
    version = AIOHTTP[1]
    with pytest.raises(release.ReleaseError, match=rf"aiohttp {version} is in the image but not in the image lock"):
        release.with_provenance(scanned, {}, LOCK, OWN, "abc")  # no wheel of it in the build context
    tampered = {AIOHTTP: hashlib.sha256(b"other bytes").hexdigest()}
    with pytest.raises(release.ReleaseError, match=rf"aiohttp {version} is in the image"):
        release.with_provenance(scanned, tampered, LOCK, OWN, "abc")  # a wheel of another digest than the lock's
    with pytest.raises(release.ReleaseError, match=rf"aiohttp {version} is in the image"):
        release.with_provenance(scanned, {AIOHTTP: hashlib.sha256(WHEEL).hexdigest()}, "# empty\n", OWN, "abc")


def test_a_file_no_debian_package_owns_fails_the_inventory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = image_like_root(tmp_path / "root")
    (root / "usr/lib/stray.so").write_bytes(b"x")
    assert inventory.main([str(root)]) == 1
    assert "no package owns 1 file(s), e.g. ['/usr/lib/stray.so']" in capsys.readouterr().err
    assert not (root / inventory.STATUS_D).exists()
