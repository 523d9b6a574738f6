"""tests/skips.py: with CI=true a skip fails the run unless its reason is on the allowed list; without
CI it stays a skip; a missing tool fails wherever it runs; a test no stage of make test would run
fails the collection. Real pytest runs (pytester) of probe tests, in this process (and, in the
integration stage, with pytest-xdist's workers as make unit)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import skips

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parent.parent
ALLOWED_REASON = next(iter(skips.ALLOWED))

PROBE = f"""
import pytest
from skips import require

def test_passes():
    assert True

def test_skips_for_a_tool():
    pytest.skip("prometheus is not installed")

@pytest.mark.skipif(True, reason="promtool is missing")
def test_marked_skip_for_a_tool():
    pass

@pytest.mark.skipif(True, reason={ALLOWED_REASON!r})
def test_skips_for_the_machine():
    pass

def test_requires_a_missing_tool():
    require(["/nowhere/kube-apiserver"], "make setup", "a control plane")
"""


@pytest.fixture(autouse=True)
def quiet_asyncio(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")  # as pyproject.toml has it


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: bool, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_probe=PROBE)
    if ci:
        monkeypatch.setenv("CI", "true")
    else:
        monkeypatch.delenv("CI", raising=False)
    return pytester.runpytest_inprocess("-p", "skips", "-rA", *args)


def test_under_ci_a_skip_fails_unless_allowed_and_a_missing_tool_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, monkeypatch, True)
    # the skip in the test's body fails it; the marked one fails its set-up (an error)
    result.assert_outcomes(passed=1, skipped=1, failed=2, errors=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "skipped with CI=true: 'prometheus is not installed'" in out
    assert "skipped with CI=true: 'promtool is missing'" in out
    assert re.search(rf"SKIPPED \[1\] test_probe.py:\d+: {re.escape(ALLOWED_REASON)}", out), out
    assert "missing for a control plane: /nowhere/kube-apiserver; run `make setup`" in out


def test_without_ci_a_skip_stays_a_skip_but_a_missing_tool_still_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, monkeypatch, False)
    result.assert_outcomes(passed=1, skipped=3, failed=1)
    assert "skipped with CI=true" not in result.stdout.str()


def test_under_ci_a_module_skipped_at_collection_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        test_gone="import pytest\npytest.importorskip('no_such_module_here')\n\ndef test_x():\n    pass\n"
    )
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest_inprocess("-p", "skips")
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()  # a collection error stops the run
    assert "skipped with CI=true: \"could not import 'no_such_module_here'" in result.stdout.str()


def test_each_allowed_skip_is_a_machine_condition_still_in_use() -> None:
    """An entry names a condition of the machine, never a tool or a make target, and some test still
    skips for it (a stale entry would let a new skip of that wording through unnoticed)."""
    tree = "\n".join(
        p.read_text()
        for root in ("libs", "services", "tests", "bench")
        for p in (REPO / root).rglob("*.py")
        if p.name != "test_skips.py" and ".venv" not in p.parts
    )
    for reason, condition in skips.ALLOWED.items():
        assert not re.search(r"\b(make|install|setup|built?)\b", reason + condition, re.IGNORECASE), reason
        assert repr(reason)[1:-1] in tree or reason in tree, f"no test skips for {reason!r} any more"


@pytest.mark.integration  # pytest-xdist starts its workers as processes
@pytest.mark.parametrize("workers", [["-n", "2", "--dist", "loadfile"]], ids=["xdist"])
def test_under_xdist_the_controller_reports_the_skip_failed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: list[str]
) -> None:
    pytester.makepyfile(test_probe=PROBE)
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))
    result = pytester.runpytest_subprocess("-p", "skips", "-p", "no:cacheprovider", *workers)
    result.assert_outcomes(passed=1, skipped=1, failed=2, errors=1)
    assert "skipped with CI=true: 'prometheus is not installed'" in result.stdout.str()


@pytest.mark.parametrize(
    ("relative", "markers", "why"),
    [
        ("tests/integration/test_x.py", {"cluster"}, "marked cluster outside tests/cluster"),
        ("tests/cluster/test_x.py", {"e2e"}, "marked e2e outside tests/e2e"),
        ("tests/cluster/test_x.py", set(), "in tests/cluster without the cluster"),
        ("tests/e2e/test_x.py", {"integration"}, "in tests/e2e without the e2e marker"),
        ("tests/cluster/test_x.py", {"cluster_down"}, "marked cluster_down outside tests/cluster/test_down.py"),
        ("tests/test_x.py", {"isolated", "integration"}, "marked isolated without e2e"),
    ],
)
def test_a_test_no_stage_runs_is_named(relative: str, markers: set[str], why: str) -> None:
    assert any(w.startswith(why) for w in skips.misplaced(relative, markers)), skips.misplaced(relative, markers)


@pytest.mark.parametrize(
    ("relative", "markers"),
    [
        ("tests/cluster/test_x.py", {"cluster"}),
        ("tests/cluster/test_down.py", {"cluster_down"}),
        ("tests/e2e/test_x.py", {"e2e", "isolated"}),
        ("libs/x/tests/test_x.py", {"integration"}),
        ("tests/test_x.py", set()),
    ],
)
def test_a_test_its_stage_runs_passes(relative: str, markers: set[str]) -> None:
    assert skips.misplaced(relative, markers) == []


def test_a_collection_with_a_test_no_stage_runs_fails(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(**{"tests/e2e/test_probe": "def test_forgot_its_marker():\n    pass\n"})
    result = pytester.runpytest_inprocess("-p", "skips", "--rootdir", str(pytester.path))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "test_forgot_its_marker: in tests/e2e without the e2e marker" in result.stderr.str()
