"""Makes dra_harness (a real kube-apiserver, the driver on a simulated node, the kubelet's calls)
importable from these tests, and its fixtures visible."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from dra_harness import apiserver, apiserver_without_taints, short_tmp, start_driver  # noqa: F401
