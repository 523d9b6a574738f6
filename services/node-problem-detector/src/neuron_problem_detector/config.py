"""Flags of `neuron-problem-detector`, each with a `NEURON_NPD_*` environment twin."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from neuron_common.config import (
    ApiServer,
    EnvArgumentParser,
    Node,
    ServiceConfig,
    Serving,
    config_from_args,
    config_parser,
    flag,
    non_negative_duration,
    optional_path,
    positive_duration,
    positive_int,
    switch,
)
from neuron_driver import layout
from neuron_health.flags import Heartbeat, KernelLog

DEFAULT_LISTEN = "0.0.0.0:9842"
API_TIMEOUT = 5.0  # seconds, one API-server call; the reporter keeps its state and retries with back-off


@dataclass(frozen=True, kw_only=True)
class Reporting:
    """How the reporter keeps the API server told: conditions re-sent, Events kept through an outage,
    and the remediation it may apply."""

    heartbeat: float = flag("1m", "time between re-sends of unchanged conditions", type=positive_duration)
    event_namespace: str = flag("default", "namespace of the Events on the Node")
    max_pending_events: int = flag(1000, "Events kept while the API server is unreachable", type=positive_int)
    taint: bool = switch(False, "taint the node aws.amazon.com/neuron-unhealthy:NoSchedule while unhealthy")
    cordon: bool = switch(False, "cordon the node while unhealthy (never drains)")
    accelerated_hardware_condition: str = flag(
        "auto",
        "write EKS's AcceleratedHardwareReady condition beside the rules' (False while a fault needs a reboot or a "
        "new instance, which EKS node auto repair and Karpenter act on): 'auto' unless EKS's node monitoring agent "
        "runs on the node (its KernelReady, NetworkingReady, StorageReady or ContainerRuntimeReady condition is "
        "there), which then owns it; 'on' always; 'off' never",
        choices=["auto", "on", "off"],
    )


@dataclass(frozen=True, kw_only=True)
class DeviceReset:
    """The device-reset rung and the validation step (docs/remediation.md): off by default."""

    device_reset: bool = switch(
        False,
        "reset a device whose fault is on the device-reset rung, or whose firmware heartbeat stalled, once no pod "
        "holds it (the kubelet's PodResources), through the driver's reset node; then validate it",
    )
    pod_resources_socket: Path = flag(
        layout.POD_RESOURCES_SOCKET,
        "the kubelet's PodResources socket, asked which pods hold a device before its reset",
        type=Path,
    )
    reset_timeout: float = flag("2m", "time the driver has to finish a device reset", type=positive_duration)
    validation_window: float = flag(
        "1m",
        "time after a device reset without a new error on the device, at whose end its health sources must be healthy",
        type=non_negative_duration,
    )
    validation_command: str = flag(
        "",
        "a command run once the validation window passed (split into words as a shell does, run without one; "
        "NEURON_RESET_DEVICE and NEURON_RT_VISIBLE_CORES name the device): exit 0 passes, else the fault "
        "escalates; '' runs none",
    )
    validation_timeout: float = flag("10m", "time the validation command may run", type=positive_duration)
    validate_after_reboot: bool = switch(
        False,
        "once at start on a new boot that the remediation controller's workflow asked for (its state annotation on "
        "the Node), validate the node: --validation-window without a new error, every device's health sources "
        "healthy, then --validation-command; the verdict is the Node's NeuronValidated condition, which the "
        "controller's --validate-after-reboot waits for",
    )


@dataclass(frozen=True, kw_only=True)
class Config(KernelLog, Heartbeat, Node, ApiServer, Serving, Reporting, DeviceReset, ServiceConfig):
    """Watches the kernel log and the Neuron driver's counters for hardware errors and reports them as a
    NodeCondition (NeuronHealth), Events and metrics; conditions clear on a new boot or when the
    driver's counters reset."""

    PROG: ClassVar[str] = "neuron-problem-detector"
    ENV_PREFIX: ClassVar[str] = "NEURON_NPD_"
    FLAGS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "listen": {"default": DEFAULT_LISTEN},
        "host_root": {"help": "host root where sys/, dev/ and proc/ are found"},
    }

    rules: Path | None = flag(
        "",
        "rules file (YAML); default: the built-in rules made from the fault table (see --print-default-rules)",
        type=optional_path,
    )  # None: the default rules, made from the fault table
    lookback: float = flag(
        "5m",
        "how much kernel log history to replay at start (lines already handled on this boot are skipped)",
        type=non_negative_duration,
    )
    counter_interval: float = flag("5s", "time between reads of the driver's counters", type=positive_duration)
    state_file: Path = flag(
        layout.NPD_STATE_FILE, "where the detector keeps its problems across restarts (a host path)", type=Path
    )
    verdict_dir: Path | None = flag(
        layout.VERDICT_DIR, "per-device verdicts for the device plugin (a host path); '' disables", type=optional_path
    )


def parser(env: Mapping[str, str] | None = None) -> EnvArgumentParser:
    p = config_parser(Config, env)
    p.add_argument(
        "--print-default-rules", action="store_true", help="print the built-in rules as a rules file and exit"
    )
    return p


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    p = parser(env)
    args = p.parse_args(argv)
    if args.print_default_rules:
        from neuron_problem_detector.rules import default_text

        sys.stdout.write(default_text())
        p.exit(0)
    return config_from_args(Config, p, args, env)
