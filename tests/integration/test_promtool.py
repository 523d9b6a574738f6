"""promtool check rules / test rules on the exporter's alert rules (Debian's prometheus package)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from skips import require

RULES = Path(__file__).resolve().parents[2] / "charts/neuron-helm-chart/rules"
PROMTOOL = shutil.which("promtool")
pytestmark = [
    pytest.mark.integration,
]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    require([] if PROMTOOL else ["promtool (Debian's prometheus)"], "make setup")
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, check=False, timeout=60)


def test_rules_are_valid() -> None:
    out = promtool("check", "rules", str(RULES / "neuron-node-metrics.rules.yaml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 10 rules found" in out.stdout


def test_rule_unit_tests_pass() -> None:
    out = promtool("test", "rules", str(RULES / "tests/neuron-node-metrics.test.yaml"))
    assert out.returncode == 0, out.stdout + out.stderr


def test_rule_unit_tests_can_fail(tmp_path: Path) -> None:
    """The unit tests are not vacuous: a wrong expectation makes promtool fail."""
    original = (RULES / "tests/neuron-node-metrics.test.yaml").read_text()
    broken = original.replace("summary: Uncorrectable ECC errors on Neuron device 3 of n1", "summary: wrong")
    assert broken != original
    (tmp_path / "rules").mkdir()
    shutil.copy(RULES / "neuron-node-metrics.rules.yaml", tmp_path / "neuron-node-metrics.rules.yaml")
    (tmp_path / "rules" / "t.yaml").write_text(broken)
    assert promtool("test", "rules", str(tmp_path / "rules" / "t.yaml")).returncode != 0
