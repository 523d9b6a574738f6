"""The test cluster's helpers that need no cluster: reading the kubelet's status period from the
configuration up.sh writes, in the Go duration format the kubelet takes."""

from __future__ import annotations

from pathlib import Path

import cluster_access
import pytest
from cluster_access import go_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2s", 2.0), ("10s", 10.0), ("1m0s", 60.0), ("1h2m3s", 3723.0), ("500ms", 0.5), ("1.5s", 1.5), ("250us", 250e-6)],
)
def test_go_durations_as_the_kubelet_writes_them(text: str, seconds: float) -> None:
    assert go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "2", "s", "2x", "2 s", "-2s", "2s3", "ms"])
def test_anything_else_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="not a Go duration"):
        go_duration(text)


def test_up_sh_sets_the_period_the_helper_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The value up.sh writes into the kubelet's configuration, and the kubelet's default without it."""
    up = (cluster_access.REPO / "tests" / "cluster" / "up.sh").read_text()
    (written,) = [
        line.split(":", 1)[1].strip() for line in up.splitlines() if line.startswith("nodeStatusUpdateFrequency:")
    ]
    monkeypatch.setattr(cluster_access, "CLUSTER_DIR", tmp_path)
    (tmp_path / "kubelet").mkdir()
    config = tmp_path / "kubelet" / "config.yaml"
    config.write_text(f"kind: KubeletConfiguration\nnodeStatusUpdateFrequency: {written}\n")
    assert cluster_access.node_status_update_period() == go_duration(written) < 10.0
    config.write_text("kind: KubeletConfiguration\n")
    assert cluster_access.node_status_update_period() == 10.0
