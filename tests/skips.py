"""Which skips a CI run accepts, and the one way a test asks for a missing tool.

A skip says "this could not be checked here". On a developer's machine that is a note in the summary
(`-ra`); with `CI=true` it fails the run, unless its reason is on `ALLOWED` below: a condition of the
machine that no `make` target changes. A missing tool is never one of them. `make setup` installs
every tool the tests use, so a test that finds one missing calls `require`, which fails it naming the
make target that provides it: a partial `make setup` cannot go green.

Nor may a test fall between the stages: `make test` runs the cluster, e2e and cluster-down stages
as `-m MARKER DIRECTORY` (tools/cluster_stage.sh) and the others by their marker over the whole tree,
so a test marked for one outside its directory, or in the directory without its marker, would run in
no stage, or in one without its cluster. Every collection refuses such a test.

The root conftest.py registers this module as a plugin. The hook changes the report where it is
made, so under pytest-xdist the controller and its summary receive it failed already.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

# The reason a skip gives (as its test writes it) -> the machine condition it stands for. Add an
# entry only for what no make target can change; name the condition, never a tool.
ALLOWED: dict[str, str] = {
    "needs root to create character devices": "the tests run as a user without CAP_MKNOD (not root)",
}


def ci() -> bool:
    return os.environ.get("CI") == "true"


def require(missing: Iterable[str], target: str, what: str = "") -> None:
    """Fails the calling test (or fixture) when anything is `missing`, naming it and the make target
    that installs it. Never a skip: a tool `make setup` should have provided is a broken set-up."""
    missing = list(missing)
    if missing:
        needed = f" for {what}" if what else ""
        pytest.fail(f"missing{needed}: {', '.join(missing)}; run `{target}`", pytrace=False)


def reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """A skip's reason as its test wrote it (pytest prefixes `Skipped: `)."""
    longrepr: Any = report.longrepr
    text = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def _fail_unless_allowed(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not (ci() and report.skipped) or hasattr(report, "wasxfail"):
        return
    why = reason(report)
    if why in ALLOWED:
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped with CI=true: {why!r}. A missing tool must fail (tests/skips.py's require, naming the make "
        "target that installs it); a condition of the machine that no make target changes goes on "
        "tests/skips.py's ALLOWED, with its reason"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    _fail_unless_allowed(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    _fail_unless_allowed(outcome.get_result())


# marker -> where its stage looks for it (tools/cluster_stage.sh)
STAGE_PATHS = {"cluster": "tests/cluster", "e2e": "tests/e2e", "cluster_down": "tests/cluster/test_down.py"}


def misplaced(relative: str, markers: set[str]) -> list[str]:
    """Why a test at `relative` (to the repository) with `markers` would run in no stage, if it would."""
    wrong = [
        f"marked {mark} outside {where}, where its stage looks"
        for mark, where in STAGE_PATHS.items()
        if mark in markers and not (relative == where or relative.startswith(where + "/"))
    ]
    if relative.startswith("tests/cluster/") and not markers & {"cluster", "cluster_down"}:
        wrong.append(
            "in tests/cluster without the cluster (or cluster_down) marker: the unit or integration stage would run it, without a cluster"
        )
    if relative.startswith("tests/e2e/") and "e2e" not in markers:
        wrong.append(
            "in tests/e2e without the e2e marker: the unit or integration stage would run it, without a cluster"
        )
    if "isolated" in markers and "e2e" not in markers:
        wrong.append("marked isolated without e2e: the isolated run selects e2e and isolated")
    return wrong


@pytest.hookimpl(tryfirst=True)  # before -m deselects: every test, whichever stage this run is
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    wrong = []
    for item in items:
        if not item.path.is_relative_to(root):
            continue
        relative = item.path.relative_to(root).as_posix()
        wrong += [f"{item.nodeid}: {why}" for why in misplaced(relative, {m.name for m in item.iter_markers()})]
    if wrong:
        raise pytest.UsageError("tests no stage of make test runs as they are:\n" + "\n".join(sorted(set(wrong))))
