"""Makes extender_objects (hand-built API objects) importable from these tests."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
