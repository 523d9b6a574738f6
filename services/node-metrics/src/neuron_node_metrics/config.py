"""Flags of `neuron-node-metrics`, each with a `NEURON_METRICS_*` environment twin."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from neuron_common.config import (
    ApiServer,
    EnvArgumentParser,
    Host,
    ResourcePrefix,
    ServiceConfig,
    Serving,
    config_from_args,
    config_parser,
    flag,
    positive_duration,
    positive_int,
)
from neuron_driver import layout
from neuron_health.flags import Heartbeat
from neuron_model import resources
from neuron_node_metrics.catalogue import FAMILIES, Naming

DEFAULT_PORT = 9840
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"


def metric_families(text: str) -> frozenset[str]:
    """--metrics: 'all', or a comma-separated list of the native family names."""
    if text.strip() == "all":
        return frozenset(FAMILIES)
    chosen = frozenset(m.strip() for m in text.split(",") if m.strip())
    unknown = sorted(chosen - set(FAMILIES))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; known: {', '.join(FAMILIES)}"
        )
    return chosen


def command_words(text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"cannot split {text!r} into words: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class Config(Host, Serving, ApiServer, ResourcePrefix, Heartbeat, ServiceConfig):
    """Prometheus exporter of the AWS Neuron driver's counters, with pod, namespace and container labels
    from the kubelet's PodResources API."""

    PROG: ClassVar[str] = "neuron-node-metrics"
    ENV_PREFIX: ClassVar[str] = "NEURON_METRICS_"
    FLAGS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "host_root": {"help": "host root where sys/ and opt/aws/ are found"},
        "listen": {"default": DEFAULT_LISTEN, "help": "address of /metrics, /healthz, /readyz"},
        "kubeconfig": {
            "help": "kubeconfig file for reviewing /metrics callers' tokens (--metrics-auth=kubernetes); "
            "default: the in-cluster service account"
        },
    }

    pod_resources_socket: str = flag(
        layout.POD_RESOURCES_SOCKET,
        "the kubelet's PodResources socket (mount its directory: the socket is recreated on restart)",
    )
    attribution_interval: float = flag(
        "10s", "time between PodResources reads (never on the scrape path)", type=positive_duration
    )
    metrics: frozenset[str] = flag(
        "all",
        "comma-separated metric families to export (names as in --list-metrics), or 'all'; families left out are "
        "not read from sysfs either",
        type=metric_families,
    )  # native family names to export
    naming: Naming = flag(
        Naming.NATIVE.value,
        "'neuron-monitor': neuron-monitor-prometheus's names and labels instead of the native ones for the families "
        "it also has (AWS's dashboard and Container Insights work unchanged); 'both': the native families and "
        "neuron-monitor's beside them, so the native boards and alerts keep working while dashboards migrate",
        choices=[n.value for n in Naming],
        convert=Naming,
    )
    neuron_monitor_command: tuple[str, ...] = flag(
        "",
        "run this neuron-monitor command line (shell-style words, e.g. '/opt/aws/neuron/bin/neuron-monitor -c "
        "/etc/neuron-monitor.json') and serve its per-runtime and per-core metrics; empty: sysfs metrics only. A "
        "command that is missing or keeps exiting is retried with back-off and shown in "
        "neuron_exporter_monitor_state",
        type=command_words,
    )  # empty: no runtime metrics
    max_attributed_containers: int = flag(
        512,
        "cap on distinct pod/namespace/container label sets; holders beyond it stay unattributed",
        type=positive_int,
    )
    max_label_length: int = flag(128, "longer label values are cut", type=positive_int)

    @property
    def resources(self) -> list[resources.Resource]:
        p = self.resource_prefix
        return [resources.neuron(p), resources.neuroncore(p), resources.neurondevice(p)]


def parser(env: Mapping[str, str] | None = None) -> EnvArgumentParser:
    p = config_parser(Config, env)
    p.add_argument("--list-metrics", action="store_true", help="print the metric families as a Markdown table and exit")
    return p


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config | None:
    p = parser(env)
    args = p.parse_args(argv)
    return None if args.list_metrics else config_from_args(Config, p, args, env)
