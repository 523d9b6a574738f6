"""The e2e tests talk to $KUBECONFIG; without one they use the test cluster's (make cluster-up)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault(
    "KUBECONFIG", str(Path(os.environ.get("CLUSTER_DIR", REPO / ".run/cluster")) / "admin.kubeconfig")
)
