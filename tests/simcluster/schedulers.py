"""The two schedulers under comparison, as real processes against the simulation's API server.

- the default kube-scheduler, its own default profile;
- `neuron-scheduler`: a second kube-scheduler whose only profile is named `neuron-scheduler`,
  calling the scheduler extender (`neuron-scheduler-extender`, started here as a subprocess by its
  command) for pods asking for either Neuron resource: filter, prioritize and bind, names only
  (nodeCacheCapable), not ignorable: the chart's extender stanza, with its default weight.
Both get the same client rate limits, raised above kube-scheduler's default 50 QPS so that the
throughput measured is the scheduler's (and the extender's) own pace, not a client throttle's.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from simcluster.controlplane import ControlPlane, free_port, k8s_bin
from simcluster.fleet import DEFAULT_SCHEDULER, NEURON, NEURONCORE

NEURON_SCHEDULER = "neuron-scheduler"
EXTENDER_COMMAND = "neuron-scheduler-extender"
CLIENT_QPS = 5000
EXTENDER_WEIGHT = 10  # the chart's scheduler.extender.weight


def scheduler_config(
    kubeconfig: Path, scheduler_name: str, extender_url: str | None, nodes_to_score: int | None = None
) -> dict[str, Any]:
    """`nodes_to_score`: percentageOfNodesToScore; None leaves kube-scheduler's adaptive default."""
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": CLIENT_QPS, "burst": CLIENT_QPS},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": scheduler_name}],
    }
    if nodes_to_score is not None:
        config["percentageOfNodesToScore"] = nodes_to_score
    if extender_url is not None:
        # The chart's stanza (tests/chart checks that they agree), so the figures are the chart's
        config["extenders"] = [
            {
                "urlPrefix": extender_url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "weight": EXTENDER_WEIGHT,
                "bindVerb": "bind",
                "preemptVerb": "preempt",
                "enableHTTPS": False,
                "nodeCacheCapable": True,
                "httpTimeout": "10s",
                "ignorable": False,
                "managedResources": [
                    {"name": NEURON, "ignoredByScheduler": False},
                    {"name": NEURONCORE, "ignoredByScheduler": False},
                ],
            }
        ]
    return config


@dataclass(frozen=True)
class Scheduler:
    name: str  # among the control plane's processes
    pid: int
    port: int  # HTTPS: health, and /metrics without credentials

    async def attempts(self) -> dict[str, float]:
        """scheduler_schedule_attempts_total by result (scheduled, unschedulable, error) so far."""
        url = f"https://127.0.0.1:{self.port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url, ssl=False) as response:
            text = await response.text()
        found: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name == "scheduler_schedule_attempts":
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        result = sample.labels["result"]
                        found[result] = found.get(result, 0.0) + sample.value
        return found


def start_scheduler(
    cp: ControlPlane,
    scheduler_name: str,
    extender_url: str | None = None,
    *,
    args: Sequence[str] = (),
    nodes_to_score: int | None = None,
    profiling: bool = False,
) -> Scheduler:
    """Starts kube-scheduler with one profile, its metrics readable without credentials. `args`:
    more flags (e.g. feature gates, which kube-scheduler reads from its command line, not its config).
    `profiling`: its pprof endpoints readable without credentials too (`simcluster.profile`)."""
    name = "kube-scheduler" if scheduler_name == DEFAULT_SCHEDULER else scheduler_name
    config = cp.dir / f"{name}.yaml"
    config.write_text(
        json.dumps(scheduler_config(cp.kubeconfig, scheduler_name, extender_url, nodes_to_score), indent=1)
    )
    port = free_port()
    argv: list[str | Path] = [
        k8s_bin() / "kube-scheduler",
        f"--config={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"
        + (",/debug/pprof,/debug/pprof/*" if profiling else ""),
        *args,
    ]
    return Scheduler(name, cp.processes.start(name, argv), port)


def extender_command() -> Path | None:
    """The extender's console script next to this Python (the project's venv), or on PATH."""
    beside = Path(sys.executable).parent / EXTENDER_COMMAND
    if beside.exists():
        return beside
    found = shutil.which(EXTENDER_COMMAND)
    return Path(found) if found else None


def start_extender(
    cp: ControlPlane, command: Path, port: int, report_max_age: float, name: str = EXTENDER_COMMAND
) -> int:
    """Starts the extender on 127.0.0.1:`port`; returns its pid. Replicas started under different
    `name`s elect a leader on the same Lease; the others forward to it.

    The flags are the extender's; change them here, and only here, if its command line changes."""
    return cp.processes.start(
        name,
        [
            command,
            f"--kubeconfig={cp.kubeconfig}",
            f"--listen=127.0.0.1:{port}",
            f"--report-max-age={report_max_age:.0f}s",
            "--log-level=warning",
        ],
    )
