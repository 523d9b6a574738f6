"""Where tests/karpenter/build-peer.sh caches the Karpenter node repair peer, and the repair policies
its test cloud provider carries, read from the peer's own source (tests/karpenter/peer/main.go), so
the contract test and the integration test hold our condition to the one list the peer runs."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

PEER_MODULE = Path(__file__).parent / "peer"
MAIN_GO = PEER_MODULE / "main.go"
BINARY = "karpenter-repair-peer"


def karpenter_version() -> str:
    found = re.search(
        r"^\s*(?:require\s+)?sigs\.k8s\.io/karpenter (v[0-9.]+)$", (PEER_MODULE / "go.mod").read_text(), re.M
    )
    assert found, "tests/karpenter/peer/go.mod pins no sigs.k8s.io/karpenter"
    return found.group(1)


def cache_dir() -> Path:
    """build-peer.sh's directory: keyed by the version and by go.mod, go.sum and main.go's content."""
    key = hashlib.sha256(b"".join((PEER_MODULE / f).read_bytes() for f in ("go.mod", "go.sum", "main.go")))
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "neuron-helm-chart" / "karpenter" / karpenter_version() / key.hexdigest()[:12]


def missing() -> list[str]:
    d = cache_dir()
    return [str(p) for p in (d / BINARY, d / "crds" / ".complete") if not p.exists()]


@dataclass(frozen=True)
class Policy:
    condition_type: str
    condition_status: str
    reason_regex: str
    toleration_seconds: float | None  # None: the toleration flag's (the AcceleratedHardwareReady policy)
    action: str


_GO_DURATION = re.compile(r"^(\d+)\s*\*\s*time\.(Second|Minute|Hour)$")
_UNITS = {"Second": 1.0, "Minute": 60.0, "Hour": 3600.0}


def _seconds(expr: str) -> float:
    found = _GO_DURATION.match(expr.strip())
    assert found, f"not a Go duration literal: {expr}"
    return int(found.group(1)) * _UNITS[found.group(2)]


def policies() -> list[Policy]:
    """awsRepairPolicies in main.go, one `replace(type, status, regex, toleration)` a line."""
    source = MAIN_GO.read_text()
    body = source.split("func awsRepairPolicies(", 1)[1].split("\n}\n", 1)[0]
    assert "Action: cloudprovider.ReplaceNode" in body, "the peer's policies no longer all replace"
    found = []
    for kind, status, regex, toleration in re.findall(
        r'^\s*replace\(([\w."]+), corev1\.Condition(\w+), "([^"]*)", ([^)]+)\),$', body, re.M
    ):
        ctype = kind.strip('"') if kind.startswith('"') else {"corev1.NodeReady": "Ready"}[kind]
        seconds = None if toleration == "acceleratedHardwareToleration" else _seconds(toleration)
        found.append(Policy(ctype, status, regex, seconds, "ReplaceNode"))
    assert found, "no policy found in tests/karpenter/peer/main.go"
    return found


def default_accelerated_hardware_toleration() -> float:
    found = re.search(r"^const AcceleratedHardwareReadyTolerationDefault = (.+)$", MAIN_GO.read_text(), re.M)
    assert found, "main.go has no AcceleratedHardwareReadyTolerationDefault"
    return _seconds(found.group(1))
