from __future__ import annotations

from pathlib import Path

import pytest

from neuron_sim import node as sim


@pytest.fixture
def make_node(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Create a simulated node: make_node("trn1.32xlarge", lnc=None) -> its root."""
    counter = iter(range(1000))

    def _make(instance_type: str, lnc: int | None = None) -> Path:
        root = tmp_path / f"node{next(counter)}"
        sim.create(root, instance_type, lnc)
        return root

    return _make
