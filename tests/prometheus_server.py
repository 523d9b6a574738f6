"""A real Prometheus (Debian's, from make setup) for the dashboard tests, and the panels' queries.

`prometheus()` runs one on a free loopback port over the scrape jobs given; `query()` asks it over
its HTTP API. `panel_queries(scraped)` are the queries of every committed board whose `sources`
(tools/dashboards.py) are all among the components a test scrapes: each test that runs real
exporters checks exactly the boards they serve.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlencode

import aiohttp
import processes
import yaml
from polling import until_async
from simcluster.controlplane import free_port
from skips import require

REPO = Path(__file__).resolve().parents[1]
DASHBOARDS = REPO / "charts/neuron-helm-chart/dashboards"
# AWS's own published board for neuron-monitor-prometheus, vendored unchanged (see its README)
AWS_DASHBOARD = REPO / "tests/integration/aws-dashboard/neuron-monitor-grafana.json"
PROMETHEUS = shutil.which("prometheus")
SCRAPE_SECONDS = 1
# What each test that checks panel queries scrapes, real processes all (add a set with its test).
TESTED_SOURCES = (
    frozenset({"neuron-node-metrics"}),  # integration/test_prometheus_dashboards.py
    frozenset({"neuron-scheduler-extender", "kube-scheduler"}),  # integration/test_prometheus_scheduling.py
    frozenset({"neuron-dra-driver"}),  # integration/test_prometheus_dra.py
)
_METRIC = re.compile(r"\b(?:neuron|scheduler)_[a-z0-9_]+\b")


def generator() -> ModuleType:
    """tools/dashboards.py, the boards' generator."""
    tools = str(REPO / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    return importlib.import_module("dashboards")


def panel_queries(scraped: frozenset[str]) -> list[tuple[str, str, str]]:
    """(file, panel title, expr) of every panel of the committed boards whose sources are all `scraped`."""
    boards = generator().BOARDS
    found = []
    for name in sorted(n for n, board in boards.items() if board.sources <= scraped):
        for panel in json.loads((DASHBOARDS / name).read_text())["panels"]:
            for target in panel["targets"]:
                found.append((name, panel["title"], target["expr"]))
    return found


_LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_NOT_LABELS = {"Time", "Value", "__name__"}


def grafana_queries(board: dict[str, Any]) -> list[tuple[str, str, frozenset[str]]]:
    """(where, expr, shown) of every PromQL expression of a Grafana dashboard's JSON as Grafana
    exports it: each target of each panel, of panels nested in rows (collapsed rows keep theirs in
    `panels`), of annotations, and each query variable's query. `where` names the panel, its id and
    the target; `shown` are the labels the panel puts on screen (the legend's `{{label}}`s, a table's
    columns as its `organize` transformation orders or renames them), so a drop-in must serve them."""
    found: list[tuple[str, str, frozenset[str]]] = []

    def columns(panel: dict[str, Any]) -> set[str]:
        shown: set[str] = set()
        for t in panel.get("transformations", []):
            if t.get("id") == "organize":
                options = t.get("options", {})
                hidden = {k for k, v in options.get("excludeByName", {}).items() if v}
                named = set(options.get("indexByName", {})) | set(options.get("renameByName", {}))
                shown |= named - hidden - _NOT_LABELS
        return shown

    def targets(where: str, owner: dict[str, Any]) -> None:
        for target in owner.get("targets", []):
            if target.get("expr"):
                shown = set(_LEGEND_LABEL.findall(target.get("legendFormat") or ""))
                if target.get("format") == "table":
                    shown |= columns(owner)
                found.append((f"{where} {target.get('refId', '')}".rstrip(), target["expr"], frozenset(shown)))

    def panels(within: list[dict[str, Any]]) -> None:
        for panel in within:
            targets(f"{panel.get('title', '')} (panel {panel.get('id')})", panel)
            panels(panel.get("panels", []))

    panels(board.get("panels", []))
    for annotation in board.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            found.append((f"annotation {annotation['name']}", annotation["expr"], frozenset()))
        targets(f"annotation {annotation.get('name')}", annotation)
    for variable in board.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            q = variable.get("query")
            q = q.get("query") if isinstance(q, dict) else q
            if q:
                found.append((f"variable {variable['name']}", q, frozenset()))
    return found


def concrete(expr: str, rate_interval: str = "20s") -> str:
    """The query as Grafana sends it with every node and namespace selected, and the profile's default."""
    for variable, value in (("$node", ".*"), ("$namespace", ".*"), ("$profile", "neuron-scheduler")):
        expr = expr.replace(variable, value)
    return expr.replace("$__rate_interval", rate_interval)


def metrics_read(expr: str) -> set[str]:
    """The series names a query reads (every metric this project serves or reads starts so)."""
    return set(_METRIC.findall(expr))


@contextlib.contextmanager
def prometheus(work: Path, scrape_configs: Sequence[dict[str, Any]], rule_files: Sequence[Path] = ()) -> Iterator[str]:
    """A Prometheus scraping every second, storing in `work`; yields its base URL."""
    require([] if PROMETHEUS else ["prometheus (Debian's)"], "make setup")
    assert PROMETHEUS is not None
    work.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
        "rule_files": [str(r) for r in rule_files],
        "scrape_configs": list(scrape_configs),
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        processes.stop(proc)


async def query(base: str, expr: str, at: float | None = None) -> dict[str, Any]:
    """An instant query's `data`, at `at` (Unix seconds) or now."""
    params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
    async with aiohttp.ClientSession() as s, s.get(f"{base}/api/v1/query?{urlencode(params)}") as r:
        body = await r.json()
    assert body["status"] == "success", (expr, body)
    data: dict[str, Any] = body["data"]
    return data


async def wait_for(base: str, expr: str, what: str, timeout: float = 60) -> None:
    """Until `expr` has a result (an `== 1`-style filter); Prometheus may not be up yet."""

    async def answered() -> object:
        return (await query(base, expr))["result"]

    await until_async(
        answered, f"Prometheus to see {what}: {expr}", timeout, 0.5, TimeoutError, (aiohttp.ClientError, AssertionError)
    )


async def scraped_instant(base: str, timeout: float = 30) -> float:
    """A recent instant (Unix seconds) at which the last scrape of every target succeeded. A scrape
    that times out on a loaded machine marks all its target's series stale until the next one, so a
    gauge read just then has no value although the exporter serves it: a query checked at this
    instant fails only on what it asks. Three scrape intervals back, so that a scrape begun before
    it has been stored by the time it is read."""

    async def all_up() -> float | None:
        at = time.time() - 3 * SCRAPE_SECONDS
        return at if numbers(await query(base, "min(up)", at)) == [1.0] else None

    at: float = await until_async(
        all_up, f"{base}: an instant at which every scrape succeeded", timeout, 0.5, TimeoutError
    )
    return at


def numbers(data: dict[str, Any]) -> list[float]:
    """The values of an instant query's vector (or scalar) result."""
    if data["resultType"] == "scalar":
        return [float(data["result"][1])]
    return [float(r["value"][1]) for r in data["result"]]


async def check_returns_numbers(base: str, where: str, sent: str, at: float | None = None) -> None:
    """The query, as sent, returns numbers (no NaN: a quantile of nothing, a ratio of nothing)."""
    values = numbers(await query(base, sent, at))
    assert values, f"{where}: no data for {sent}"
    assert not any(math.isnan(v) for v in values), f"{where}: NaN from {sent}"


async def check_panel_query(base: str, board: str, title: str, expr: str, at: float | None = None, **kw: str) -> None:
    """The query returns numbers, and it filters by `$node` wherever the series it reads carry a
    `node` label."""
    if at is None:
        at = await scraped_instant(base)
    await check_returns_numbers(base, f"{board} / {title}", concrete(expr, **kw), at)
    if "$node" not in expr:
        for metric in metrics_read(expr):
            with_node = await query(base, f'count({metric}{{node!=""}})', at)
            assert not with_node["result"], f"{board} / {title}: {metric} has a node label the query does not filter"


def awss_queries() -> list[tuple[str, str, frozenset[str]]]:
    """(where, expr, shown) of every query of AWS's neuron-monitor board."""
    return grafana_queries(json.loads(AWS_DASHBOARD.read_text()))


def as_grafana_sends(expr: str) -> str:
    """AWS's query as Grafana sends it: the interval variables at a 1 s scrape, and no ad hoc filter
    (the board's only variable, `Filters`, empty by default) added."""
    for variable, value in (("$__rate_interval", "20s"), ("$__interval", "1s"), ("$__range", "1m")):
        expr = expr.replace(variable, value)
    assert not re.search(r"\$\w|\$\{", expr), f"a Grafana variable this test does not know: {expr}"
    return expr


_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_FUNCTIONS = {"sum", "avg", "count", "min", "max", "rate", "irate", "increase", "by", "without", "and", "or", "unless"}


def series_read(expr: str) -> set[str]:
    """The metric names of a PromQL expression as simple as AWS's: what is left once the matchers,
    ranges, groupings and functions are taken out."""
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b(?:by|without)\s*\([^)]*\)", " ", expr)
    return {name for name in re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", bare) if name not in _FUNCTIONS}


async def check_awss_query(base: str, where: str, expr: str, shown: frozenset[str]) -> None:
    """One query of AWS's board, as Grafana sends it, answers with numbers from the Prometheus at
    `base`; each series carries the labels the panel shows (its legend's, its table's columns), and
    every label it groups by is on every series it reads (or the groups silently merge into one)."""
    sent = as_grafana_sends(expr)
    at = await scraped_instant(base)
    await check_returns_numbers(base, f"AWS's neuron-monitor board / {where}", sent, at)
    for series in (await query(base, sent, at))["result"]:
        missing = sorted(label for label in shown if not series["metric"].get(label))
        assert not missing, f"{where}: {sent} gives {series['metric']}, without {missing}"
    grouped = {label.strip() for labels in _GROUPING.findall(sent) for label in labels.split(",")}
    for metric in series_read(sent):
        for label in grouped:
            without = await query(base, f'count({metric}{{{label}=""}})', at)
            assert not without["result"], f"{where}: {metric} has series without {label}, which {sent} groups by"
