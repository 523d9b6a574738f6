"""Flags of `neuron-problem-detector`, each with a `NEURON_NPD_*` environment twin."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from neuron_common.config import (
    EnvArgumentParser,
    MetricsSecurity,
    add_api_flags,
    add_host_flags,
    add_kernel_log_flags,
    add_node_flag,
    add_serving_flags,
    check_kernel_log,
    non_negative_duration,
    optional_path,
    parse_flags,
    positive_duration,
    positive_int,
    resolve_node_name,
    resolve_serving,
)
from neuron_driver import layout

DEFAULT_LISTEN = "0.0.0.0:9842"
API_TIMEOUT = 5.0  # seconds, one API-server call; the reporter keeps its state and retries with back-off


@dataclass(frozen=True)
class Config:
    host_root: Path
    kmsg_path: Path
    node_name: str
    kubeconfig: str | None
    rules: Path | None  # None: the default rules, made from the fault table
    listen: tuple[str, int]
    log_level: str
    lookback: float
    counter_interval: float
    heartbeat: float
    state_file: Path
    verdict_dir: Path | None
    event_namespace: str
    max_pending_events: int
    taint: bool
    cordon: bool
    metrics_security: MetricsSecurity | None = None  # --metrics-auth=kubernetes
    kernel_log_format: str = "kmsg"  # --kernel-log-format of kmsg_path


def parser(env: Mapping[str, str] | None = None) -> EnvArgumentParser:
    p = EnvArgumentParser(
        prog="neuron-problem-detector",
        description="Watches the kernel log and the Neuron driver's counters for hardware errors and reports them "
        "as a NodeCondition (NeuronHealth), Events and metrics; conditions clear on a new boot or when the "
        "driver's counters reset.",
        env_prefix="NEURON_NPD_",
        env=env,
    )
    add_host_flags(p, found="sys/, dev/ and proc/")
    add_kernel_log_flags(p, "kernel log to follow")
    add_node_flag(p)
    add_api_flags(p)
    p.add_flag(
        "--rules",
        default="",
        help="rules file (YAML); default: the built-in rules made from the fault table (see --print-default-rules)",
    )
    p.add_argument(
        "--print-default-rules", action="store_true", help="print the built-in rules as a rules file and exit"
    )
    add_serving_flags(p, DEFAULT_LISTEN)
    p.add_flag(
        "--lookback",
        default="5m",
        type=non_negative_duration,
        help="how much kernel log history to replay at start (lines already handled on this boot are skipped)",
    )
    p.add_flag(
        "--counter-interval", default="5s", type=positive_duration, help="time between reads of the driver's counters"
    )
    p.add_flag(
        "--heartbeat", default="1m", type=positive_duration, help="time between re-sends of unchanged conditions"
    )
    p.add_flag(
        "--state-file",
        default=layout.NPD_STATE_FILE,
        type=Path,
        help="where the detector keeps its problems across restarts (a host path)",
    )
    p.add_flag(
        "--verdict-dir",
        default=layout.VERDICT_DIR,
        help="per-device verdicts for the device plugin (a host path); '' disables",
    )
    p.add_flag("--event-namespace", default="default", help="namespace of the Events on the Node")
    p.add_flag(
        "--max-pending-events", default=1000, type=positive_int, help="Events kept while the API server is unreachable"
    )
    p.add_bool_flag(
        "--taint", default=False, help="taint the node aws.amazon.com/neuron-unhealthy:NoSchedule while unhealthy"
    )
    p.add_bool_flag("--cordon", default=False, help="cordon the node while unhealthy (never drains)")
    return p


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    p, a, environ = parse_flags(parser, argv, env)
    if a.print_default_rules:
        from neuron_problem_detector.rules import default_text

        sys.stdout.write(default_text())
        p.exit(0)
    node = resolve_node_name(p, a.node_name, environ)
    check_kernel_log(p, a.kmsg_path, a.kernel_log_format)
    return Config(
        host_root=a.host_root,
        kmsg_path=Path(a.kmsg_path) if a.kmsg_path else layout.HostLayout(a.host_root).kmsg,
        kernel_log_format=a.kernel_log_format,
        node_name=node,
        kubeconfig=a.kubeconfig or None,
        rules=optional_path(a.rules),
        **resolve_serving(p, a),
        lookback=a.lookback,
        counter_interval=a.counter_interval,
        heartbeat=a.heartbeat,
        state_file=a.state_file,
        verdict_dir=optional_path(a.verdict_dir),
        event_namespace=a.event_namespace,
        max_pending_events=a.max_pending_events,
        taint=a.taint,
        cordon=a.cordon,
    )
