"""Prepared claims on disk, so a restarted driver answers NodeUnprepareResources (and a repeated
NodePrepareResources) for claims it prepared before.

One JSON file, replaced atomically, on persistent disk; it keeps each claim's CDI spec too, because
the specs live in /var/run/cdi, a tmpfs that a reboot empties while the kubelet still expects the
claims it prepared before (it asks again, and starts containers naming their CDI devices).
A file that cannot be read back is moved aside (never
deleted: it is evidence) and the claims are rebuilt from the CDI specs of prepared claims,
which carry the same facts; the driver keeps running instead of failing on every restart.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from neuron_dra_driver.claims import CLAIM_KIND, PreparedClaim
from neuron_driver.files import replace_file

log = logging.getLogger(__name__)

VERSION = 1
# The annotation of a claim's CDI spec that records the prepared claim, for `claims_from_specs`.
CHECKPOINT_ANNOTATION = "neuron.aws.com/prepared-claim"


class CheckpointError(Exception):
    """The checkpoint exists but is not one this driver wrote."""


def encode(claims: Mapping[str, PreparedClaim]) -> str:
    claims_json = [c.to_json(with_spec=True) for _, c in sorted(claims.items())]
    return json.dumps({"version": VERSION, "claims": claims_json}, indent=1)


def decode(text: str) -> dict[str, PreparedClaim]:
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            raise CheckpointError(
                f"unknown checkpoint version {raw.get('version') if isinstance(raw, dict) else raw!r}"
            )
        claims = [PreparedClaim.from_json(c) for c in raw["claims"]]
    except CheckpointError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{type(exc).__name__}: {exc}") from exc
    return {c.uid: c for c in claims}


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, PreparedClaim]:
        """The saved claims ({} when there is no file); `CheckpointError` when it is unreadable."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{self.path}: {exc}") from exc
        try:
            return decode(text)
        except CheckpointError as exc:
            raise CheckpointError(f"{self.path}: {exc}") from exc

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        replace_file(self.path, encode(claims), durable=True)

    def set_aside(self) -> Path:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        os.replace(self.path, aside)
        return aside

    def recover(self, cdi_dir: Path) -> tuple[dict[str, PreparedClaim], str]:
        """The saved claims, or, when the file is unreadable, those the CDI specs show (the file is
        moved aside and a new one written). Returns the claims and a problem to report ("" if none)."""
        try:
            return self.load(), ""
        except CheckpointError as exc:
            aside = self.set_aside()
            claims = claims_from_specs(cdi_dir)
            self.save(claims)
            problem = (
                f"checkpoint unreadable ({exc}); moved to {aside}, {len(claims)} claim(s) recovered from CDI specs"
            )
            log.error(problem)
            return claims, problem


def claims_from_specs(cdi_dir: Path) -> dict[str, PreparedClaim]:
    """Prepared claims as their CDI specs record them (each spec carries its claim in an annotation)."""
    found: dict[str, PreparedClaim] = {}
    prefix = CLAIM_KIND.replace("/", "_") + "-"
    for path in _specs(cdi_dir, prefix):
        try:
            spec = json.loads(path.read_text())
            claim = PreparedClaim.from_json(json.loads(spec["annotations"][CHECKPOINT_ANNOTATION]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("cannot read prepared claim from %s: %s", path, exc)
            continue
        found[claim.uid] = claim
    return found


def _specs(cdi_dir: Path, prefix: str) -> Iterable[Path]:
    try:
        return sorted(p for p in cdi_dir.iterdir() if p.name.startswith(prefix) and p.suffix == ".json")
    except FileNotFoundError:
        return []


def annotate(spec: dict[str, Any], claim: PreparedClaim) -> dict[str, Any]:
    """The CDI spec with its claim recorded, for `claims_from_specs`."""
    annotations = dict(spec.get("annotations") or {})
    annotations[CHECKPOINT_ANNOTATION] = json.dumps(claim.to_json(), separators=(",", ":"))
    return {**spec, "annotations": annotations}
