"""cosign for the release tests: a throwaway key pair, and what a user runs to check a release
(`cosign verify`, `cosign verify-attestation --type spdxjson`) with the release's public key, no
transparency log (the release uploads to none). cosign is the pinned build make setup links
into .venv/bin (tools/build-cosign.sh)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
COSIGN = REPO / ".venv" / "bin" / "cosign"
# the release tests' registries are loopback and plain HTTP
REGISTRY_FLAGS = ["--allow-insecure-registry", "--allow-http-registry"]


def cosign(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COSIGN_PASSWORD="")
    result = subprocess.run(
        [str(COSIGN), *map(str, args)], capture_output=True, text=True, check=False, env=env, timeout=300
    )
    if check and result.returncode != 0:
        raise AssertionError(f"cosign {' '.join(map(str, args))} failed:\n{result.stdout}\n{result.stderr}")
    return result


def key_pair(directory: Path) -> tuple[Path, Path]:
    """(private key, public key), the private one with an empty password; $COSIGN_PASSWORD is set to
    it for the release tool the tests run (it signs with the key, and cosign has no terminal to ask on)."""
    os.environ["COSIGN_PASSWORD"] = ""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(COSIGN), "generate-key-pair"], cwd=directory, env=dict(os.environ, COSIGN_PASSWORD=""),
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return directory / "cosign.key", directory / "cosign.pub"


def verify(ref: str, public_key: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return cosign("verify", "--key", public_key, "--insecure-ignore-tlog", *REGISTRY_FLAGS, ref, check=check)


def attested_sbom(ref: str, public_key: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the in-toto statement's subject, its SPDX predicate) of the image's verified SBOM attestation."""
    out = cosign(
        "verify-attestation", "--type", "spdxjson", "--key", public_key, "--insecure-ignore-tlog", *REGISTRY_FLAGS, ref
    ).stdout
    (envelope,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["predicateType"] == "https://spdx.dev/Document"
    (subject,) = statement["subject"]
    return subject, statement["predicate"]
