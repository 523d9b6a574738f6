"""tests/polling.py is the one polling loop of the tests and the benches: what it does, and that no
other module of tests/, bench/, libs/*/tests or services/*/tests has a loop of its own. A polling loop
here: a loop that sleeps and can end on what it checks (a `while` with a condition, or a `break` or
`return` in it). A loop that sleeps at a pace forever or until told to stop (a heartbeat, a sampler
of invariants) is not one; product code (src/) keeps its own retry loops."""

from __future__ import annotations

import ast
import asyncio
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from polling import until, until_async

REPO = Path(__file__).resolve().parent.parent
COVERED = [REPO / "tests", REPO / "bench", *REPO.glob("libs/*/tests"), *REPO.glob("services/*/tests")]
HOME = REPO / "tests" / "polling.py"


def test_until_returns_the_first_true_answer() -> None:
    answers = iter([0, None, "", "ready", "later"])
    assert until(lambda: next(answers), "an answer", timeout=5, interval=0) == "ready"


async def test_until_async_awaits_a_coroutine_predicate_and_returns_its_answer() -> None:
    calls = itertools.count()

    async def third() -> int | None:
        n = next(calls)
        return n if n >= 2 else None

    assert await until_async(third, "the third call", timeout=5, interval=0) == 2


def test_a_timeout_raises_the_callers_error_naming_what_and_the_last_ignored_error() -> None:
    class BenchFailed(RuntimeError):
        pass

    def failing() -> bool:
        raise KeyError("status")

    began = time.monotonic()
    with pytest.raises(
        BenchFailed, match=r"gave up after 0.1 s waiting for the pod \(last error: KeyError: 'status'\)"
    ):
        until(failing, "the pod", timeout=0.1, interval=0.01, error=BenchFailed, ignore=(KeyError,))
    assert time.monotonic() - began >= 0.1


def test_an_error_not_ignored_ends_the_wait_at_once() -> None:
    def broken() -> bool:
        raise ValueError("not a poll")

    with pytest.raises(ValueError, match="not a poll"):
        until(broken, "anything", timeout=30, ignore=(KeyError,))


async def test_until_async_sleeps_in_the_event_loop() -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    try:
        assert await until_async(lambda: ticks >= 3, "the ticker", timeout=5, interval=0.01)
    finally:
        task.cancel()


def _sleeps(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and ast.unparse(n.func).split(".")[-1] in ("sleep", "sleep_or_stop")
        for n in _walk_loop(node)
    )


def _ends_on_a_check(loop: ast.While | ast.For | ast.AsyncFor) -> bool:
    if isinstance(loop, ast.While) and not (isinstance(loop.test, ast.Constant) and loop.test.value):
        return not _until_stopped(loop.test)
    return any(isinstance(n, (ast.Break, ast.Return)) for n in _walk_loop(loop))


def _until_stopped(test: ast.expr) -> bool:
    """`while not stop.is_set()`: a job at a pace until it is told to stop, no wait for a state."""
    return (
        isinstance(test, ast.UnaryOp)
        and isinstance(test.op, ast.Not)
        and isinstance(test.operand, ast.Call)
        and ast.unparse(test.operand.func).endswith(".is_set")
    )


def _walk_loop(node: ast.AST) -> Iterator[ast.AST]:
    """The node's own statements and expressions, not those of functions defined inside it."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield child
        yield from _walk_loop(child)


def polling_loops(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of each polling loop in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for function in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        name = getattr(function, "name", "<module>")
        for node in _walk_loop(function):  # its own loops: a function inside it is walked on its own
            if isinstance(node, (ast.While, ast.For, ast.AsyncFor)) and _sleeps(node) and _ends_on_a_check(node):
                found.append((name, node.lineno))
    return sorted(set(found), key=lambda f: f[1])


# (file, function) -> why its loop is no wait for a state. A client's retries of a refused request,
# with back-off, are the client's behaviour (as product code's retry loops in src/ are), not a test's wait.
NOT_POLLING = {
    ("tests/simcluster/api.py", "request"): "the simulation's API client retries a request refused for load "
    "(429, 5xx, a dropped connection) with exponential back-off, as a client under load does",
}


def test_only_tests_polling_defines_a_polling_loop() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line} ({function})"
        for root in COVERED
        for path in sorted(root.rglob("*.py"))
        if path != HOME and "src" not in path.relative_to(REPO).parts
        for function, line in polling_loops(path)
        if (str(path.relative_to(REPO)), function) not in NOT_POLLING
    ]
    assert found == [], "poll with tests/polling.py's until or until_async instead:\n" + "\n".join(found)


def test_what_is_not_polling_is_still_there() -> None:
    """An entry whose loop has gone would let a new loop in the same function through unnoticed."""
    for path, function in NOT_POLLING:
        assert function in {f for f, _ in polling_loops(REPO / path)}, (path, function)


def test_the_check_sees_a_polling_loop(tmp_path: Path) -> None:
    """The check can fail: each shape of loop the tree had before it was brought to polling.py."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import asyncio, time\n"
        "def a(p):\n    while not p():\n        time.sleep(0.1)\n"
        "async def b(p):\n    for _ in range(100):\n        if p():\n            break\n        await asyncio.sleep(0)\n"
        "def c(p):\n    while True:\n        if p():\n            return 1\n        time.sleep(1)\n"
        "async def heartbeat(p):\n    while True:\n        await asyncio.sleep(1)\n        p()\n"
        "def sampler(done, p):\n    while not done.is_set():\n        p()\n        time.sleep(0.5)\n"
    )
    assert polling_loops(probe) == [("a", 3), ("b", 6), ("c", 11)]
    assert [function for function, _ in polling_loops(HOME)] == ["until", "until_async"]  # the one home
