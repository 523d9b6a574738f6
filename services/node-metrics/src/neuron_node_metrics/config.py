"""Flags of `neuron-node-metrics`, each with a `NEURON_METRICS_*` environment twin."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from neuron_common.config import (
    EnvArgumentParser,
    MetricsSecurity,
    add_api_flags,
    add_host_flags,
    add_serving_flags,
    parse_flags,
    positive_duration,
    positive_int,
    require_resource_prefix,
    resolve_serving,
)
from neuron_driver import layout
from neuron_model import resources
from neuron_node_metrics.catalogue import FAMILIES, Naming

DEFAULT_PORT = 9840
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"


@dataclass(frozen=True)
class Config:
    host_root: Path
    pod_resources_socket: str
    listen: tuple[str, int]
    attribution_interval: float
    log_level: str
    resource_prefix: str
    metrics: frozenset[str]  # native family names to export
    naming: Naming
    max_attributed_containers: int
    max_label_length: int
    metrics_security: MetricsSecurity | None = None  # --metrics-auth=kubernetes
    kubeconfig: str = ""  # for the reviews; '' is the in-cluster service account
    neuron_monitor_command: tuple[str, ...] = ()  # empty: no runtime metrics

    @property
    def resources(self) -> list[resources.Resource]:
        p = self.resource_prefix
        return [resources.neuron(p), resources.neuroncore(p), resources.neurondevice(p)]


def parser(env: Mapping[str, str] | None = None) -> EnvArgumentParser:
    p = EnvArgumentParser(
        prog="neuron-node-metrics",
        description="Prometheus exporter of the AWS Neuron driver's counters, with pod, namespace and container "
        "labels from the kubelet's PodResources API.",
        env_prefix="NEURON_METRICS_",
        env=env,
    )
    add_host_flags(p, found="sys/ and opt/aws/")
    p.add_flag(
        "--pod-resources-socket",
        default=layout.POD_RESOURCES_SOCKET,
        help="the kubelet's PodResources socket (mount its directory: the socket is recreated on restart)",
    )
    add_serving_flags(p, DEFAULT_LISTEN, what="/metrics, /healthz, /readyz")
    add_api_flags(p, purpose=" for reviewing /metrics callers' tokens (--metrics-auth=kubernetes)")
    p.add_flag(
        "--attribution-interval",
        default="10s",
        type=positive_duration,
        help="time between PodResources reads (never on the scrape path)",
    )
    p.add_flag("--resource-prefix", default=resources.DEFAULT_PREFIX, help="extended resource prefix")
    p.add_flag(
        "--metrics",
        default="all",
        help="comma-separated metric families to export (names as in "
        "--list-metrics), or 'all'; families left out are not read from sysfs either",
    )
    p.add_flag(
        "--naming",
        default=Naming.NATIVE.value,
        choices=[n.value for n in Naming],
        help="'neuron-monitor': neuron-monitor-prometheus's names and labels instead of the native ones "
        "for the families it also has (AWS's dashboard and Container Insights work unchanged); 'both': "
        "the native families and neuron-monitor's beside them, so the native boards and alerts keep "
        "working while dashboards migrate",
    )
    p.add_flag(
        "--neuron-monitor-command",
        default="",
        help="run this neuron-monitor command line (shell-style words, e.g. '/opt/aws/neuron/bin/neuron-monitor "
        "-c /etc/neuron-monitor.json') and serve its per-runtime and per-core metrics; empty: sysfs metrics only. "
        "A command that is missing or keeps exiting is retried with back-off and shown in "
        "neuron_exporter_monitor_state",
    )
    p.add_flag(
        "--max-attributed-containers",
        default=512,
        type=positive_int,
        help="cap on distinct pod/namespace/container label sets; holders beyond it stay unattributed",
    )
    p.add_flag("--max-label-length", default=128, type=positive_int, help="longer label values are cut")
    p.add_argument("--list-metrics", action="store_true", help="print the metric families as a Markdown table and exit")
    return p


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config | None:
    p, a, _ = parse_flags(parser, argv, env)
    if a.list_metrics:
        return None
    if a.metrics.strip() == "all":
        metrics = frozenset(FAMILIES)
    else:
        metrics = frozenset(m.strip() for m in a.metrics.split(",") if m.strip())
        unknown = sorted(metrics - set(FAMILIES))
        if unknown:
            p.error(
                f"--metrics: unknown famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                f"known: {', '.join(FAMILIES)}"
            )
    require_resource_prefix(p, a.resource_prefix)
    try:
        monitor_command = tuple(shlex.split(a.neuron_monitor_command))
    except ValueError as exc:
        p.error(f"--neuron-monitor-command: cannot split {a.neuron_monitor_command!r} into words: {exc}")
    return Config(
        host_root=a.host_root,
        pod_resources_socket=a.pod_resources_socket,
        **resolve_serving(p, a),
        attribution_interval=a.attribution_interval,
        kubeconfig=a.kubeconfig,
        resource_prefix=a.resource_prefix,
        metrics=metrics,
        naming=Naming(a.naming),
        max_attributed_containers=a.max_attributed_containers,
        max_label_length=a.max_label_length,
        neuron_monitor_command=monitor_command,
    )
