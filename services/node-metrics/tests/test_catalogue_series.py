"""The exporter's catalogue (`catalogue.series()`, which tests/test_metric_names.py holds the chart's
rules and dashboards to) against what the exporter really serves: over a simulated trn2.48xlarge
of driver 2.30.2,
with neuron-monitor's stand-in and without, a pod holding cores, and every naming. A series served
and not catalogued fails, and so does a catalogued series never served here (but for the few that
need a node this test cannot make, named below)."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from neuron_common import metrics_auth
from neuron_node_metrics import config as config_mod
from neuron_node_metrics.app import Exporter
from neuron_node_metrics.attribution import Attribution, Owner
from neuron_node_metrics.catalogue import series
from neuron_sim import monitor as standin
from neuron_sim import node as sim

# Served only where this test cannot make them: the authorizer's series need --metrics-auth=kubernetes
# and an API server (tests/secure_metrics.py serves them for real).
NOT_MADE_HERE = {s.name for s in metrics_auth.catalogue()}


def _served(root: Path, naming: str, *, monitor: bool) -> dict[str, set[str]]:
    args = ["--host-root", str(root), "--pod-resources-socket", str(root / "none.sock"), "--listen", "127.0.0.1:0"]
    args += ["--naming", naming] + (["--neuron-monitor-command", "neuron-monitor"] if monitor else [])
    cfg = config_mod.parse(args, env={})
    assert cfg is not None
    exporter = Exporter(cfg, asyncio.Event())
    held = Owner("ml", "trainer-0", "main")
    attribution = Attribution({0: held, 1: held}, {0: held}, {"aws.amazon.com/neuroncore": 2})
    exporter.collector.attribution = lambda: attribution
    exporter.collector.allocatable = lambda: {"aws.amazon.com/neuron": 15, "aws.amazon.com/neuroncore": 60}
    exporter.collector.read_errors["missing"] += 1
    exporter.poller.errors["RESOURCE_EXHAUSTED"] += 1
    exporter.monitor.problems["malformed"] += 1
    if monitor:
        node = standin.node_from_root(root)
        exporter.monitor.feed(json.dumps(standin.document(node, standin.spread(node, 4, 2), random.Random(0))))
    text = exporter.collector.render() + generate_latest(exporter.self_registry).decode()
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def test_what_the_exporter_serves_is_its_catalogue(tmp_path: Path) -> None:
    # the newest tree the simulator writes: the corrected ECC counts and live counters are 2.30.2's
    sim.create(tmp_path, "trn2.48xlarge", driver_version="2.30.2.0")
    catalogue = {s.name: set(s.labels) for s in series()}
    assert len(catalogue) == len(series()), "one entry a name"
    seen: set[str] = set()
    for naming in ("native", "neuron-monitor", "both"):
        for monitor in (False, True):
            for name, labels in _served(tmp_path, naming, monitor=monitor).items():
                assert name in catalogue, f"--naming {naming}: {name} is served but not catalogued"
                assert labels <= catalogue[name], f"--naming {naming}: {name} labels {labels - catalogue[name]}"
                seen.add(name)
    never = sorted(set(catalogue) - seen - NOT_MADE_HERE)
    assert not never, f"catalogued, never served: {never}"
