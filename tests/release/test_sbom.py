"""tools/sbom.py's document, pure: what an image holds becomes SPDX packages, the third-party ones
with the digest the image lock admitted, the project's own naming the commit; a distribution the lock
never admitted is an error, not a silent entry. The SBOM of real images, signed and read back with
cosign, is tests/release/test_release.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
from loading import load

REPO = Path(__file__).resolve().parents[2]


sbom = load("sbom", REPO / "tools" / "sbom.py")
LOCK = "# header\naiohttp==3.14.5 --hash=sha256:" + "a" * 64 + "\n"


def test_each_package_is_contained_by_the_image_with_its_purl_and_provenance() -> None:
    doc = sbom.document(
        "reg/neuron/node-metrics:1.0.0", "node-metrics", "1.0.0",
        [("aiohttp", "3.14.5"), ("neuron-node-metrics", "0.1.0")],
        [("libc6", "2.36-9", "amd64")], LOCK, "abc123",
    )  # fmt: skip
    assert doc["spdxVersion"] == "SPDX-2.3"
    by_name = {p["name"]: p for p in doc["packages"]}
    assert by_name["aiohttp"]["checksums"] == [{"algorithm": "SHA256", "checksumValue": "a" * 64}]
    assert by_name["aiohttp"]["externalRefs"][0]["referenceLocator"] == "pkg:pypi/aiohttp@3.14.5"
    assert by_name["neuron-node-metrics"]["sourceInfo"] == "built from neuron-helm-chart commit abc123"
    assert "checksums" not in by_name["neuron-node-metrics"]
    assert by_name["libc6"]["externalRefs"][0]["referenceLocator"].startswith("pkg:deb/debian/libc6@2.36-9?arch=amd64")
    image = by_name["node-metrics"]["SPDXID"]
    contained = {r["relatedSpdxElement"] for r in doc["relationships"] if r["spdxElementId"] == image}
    assert contained == {p["SPDXID"] for p in doc["packages"]} - {image}
    assert {"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": image} in doc[
        "relationships"
    ]


def test_a_third_party_distribution_the_lock_never_admitted_is_an_error() -> None:
    with pytest.raises(SystemExit, match=r"requests 2\.0 is in img but not in the image lock"):
        sbom.document("img", "svc", "1", [("requests", "2.0")], [], LOCK, "abc")
    with pytest.raises(SystemExit, match=r"aiohttp 3\.0 is in img"):  # another version than the lock's
        sbom.document("img", "svc", "1", [("aiohttp", "3.0")], [], LOCK, "abc")
