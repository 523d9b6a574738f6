"""Flags of `neuron-device-plugin`, each with a `NEURON_DP_*` environment twin."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from neuron_common.config import (
    EnvArgumentParser,
    MetricsSecurity,
    add_api_flags,
    add_health_source_flags,
    add_host_flags,
    add_node_flag,
    add_serving_flags,
    add_ultraserver_labels_flag,
    non_negative_duration,
    optional_path,
    parse_flags,
    positive_duration,
    require_resource_prefix,
    resolve_health_sources,
    resolve_node_name,
    resolve_serving,
)
from neuron_driver import layout
from neuron_model import resources
from neuron_model.ultraserver import ENV_GROUP_SIZES

API_TIMEOUT = 5.0  # seconds, per API-server request: a /metrics review must answer within a scrape's timeout
DEFAULT_LISTEN = "0.0.0.0:9841"
ULTRASERVER_ENV_OFF = "off"
ULTRASERVER_ENV_CHOICES = (ULTRASERVER_ENV_OFF, *map(str, ENV_GROUP_SIZES))


@dataclass(frozen=True)
class Config:
    host_root: Path
    host_dev_root: Path  # the root the container runtime resolves DeviceSpec host paths against
    device_plugin_path: Path
    pod_resources_socket: str
    listen: tuple[str, int]
    log_level: str
    resource_prefix: str
    neurondevice_alias: bool
    health_interval: float
    health_quiet_period: float
    holdings_interval: float
    pending_ttl: float
    shutdown_drain: float
    kmsg_path: Path | None
    cdi: bool
    cdi_spec_dir: Path
    verdict_dir: Path | None
    register_timeout: float
    node_report: bool
    ultraserver_labels: bool
    node_name: str
    kubeconfig: str | None  # None: the in-cluster service account
    node_report_interval: float
    ultraserver_env: int | None = None  # --ultraserver-env: the job's nodes; None: off
    metrics_security: MetricsSecurity | None = None  # --metrics-auth=kubernetes
    kernel_log_format: str = "kmsg"  # --kernel-log-format of kmsg_path

    @property
    def resources(self) -> list[resources.Resource]:
        result = [resources.neuron(self.resource_prefix), resources.neuroncore(self.resource_prefix)]
        if self.neurondevice_alias:
            result.append(resources.neurondevice(self.resource_prefix))
        return result

    @property
    def kubelet_socket(self) -> Path:
        return self.device_plugin_path / layout.KUBELET_SOCKET_NAME


def parser(env: Mapping[str, str] | None = None) -> EnvArgumentParser:
    p = EnvArgumentParser(
        prog="neuron-device-plugin",
        description="Kubelet device plugin for AWS Neuron: advertises whole devices (<prefix>/neuron) and "
        "logical NeuronCores (<prefix>/neuroncore), allocates them topology-aware and reports their health.",
        env_prefix="NEURON_DP_",
        env=env,
    )
    add_host_flags(p, dev_root=True)
    p.add_flag(
        "--device-plugin-path",
        default=layout.DEVICE_PLUGIN_DIR,
        type=Path,
        help="the kubelet's device-plugins directory (kubelet.sock and plugin sockets)",
    )
    p.add_flag(
        "--pod-resources-socket",
        default=layout.POD_RESOURCES_SOCKET,
        help="the kubelet's PodResources socket, read to learn current holdings",
    )
    add_serving_flags(p, DEFAULT_LISTEN)
    p.add_flag("--resource-prefix", default=resources.DEFAULT_PREFIX, help="extended resource prefix")
    p.add_bool_flag(
        "--neurondevice-alias",
        default=False,
        help="also advertise the deprecated <prefix>/neurondevice (whole devices)",
    )
    add_health_source_flags(p)
    p.add_flag(
        "--holdings-interval",
        default="5s",
        type=positive_duration,
        help="time between PodResources List calls (a timer only); an own hand-out counts as held until a List "
        "shows it, or for --pending-ttl",
    )
    p.add_flag(
        "--pending-ttl",
        default="1m",
        type=positive_duration,
        help="how long an own allocation counts as held before the kubelet's List confirms it",
    )
    p.add_flag(
        "--shutdown-drain",
        default="2s",
        type=non_negative_duration,
        help="after SIGTERM, keep answering the kubelet this long, and until no call came for half a second "
        "(at most 4 times this), so a pod being admitted is not failed; 0: stop at once",
    )
    p.add_bool_flag(
        "--cdi",
        default=False,
        help="return CDI device names (and write a CDI spec) instead of "
        "device nodes; the container runtime must have CDI enabled",
    )
    p.add_flag("--cdi-spec-dir", default=layout.CDI_SPEC_DIR, type=Path, help="where the CDI spec is written")
    p.add_flag(
        "--register-timeout",
        default="10s",
        type=positive_duration,
        help="how long to wait for the kubelet to answer Register",
    )
    p.add_bool_flag(
        "--node-report",
        default=False,
        help="publish this node's NeuronNode (free devices and cores, health, topology) to the API server "
        "for the Neuron-aware scheduler",
    )
    add_ultraserver_labels_flag(p)
    p.add_flag(
        "--ultraserver-env",
        default=ULTRASERVER_ENV_OFF,
        choices=ULTRASERVER_ENV_CHOICES,
        help="give a container that holds all of this node's Neuron devices the runtime's UltraServer variables "
        "(NEURON_RT_ULTRASERVER_MODE, _SERVER_ID, _NODE_ID) for a job spanning this many nodes of its "
        "UltraServer, from the driver's identity; such a container is refused while the identity is not known "
        "yet or has no group of that size, and gets none on a node outside any UltraServer. 'off': none",
    )
    add_node_flag(p, " for --node-report and --ultraserver-labels")
    add_api_flags(p, purpose=" for --node-report and --ultraserver-labels")
    p.add_flag(
        "--node-report-interval",
        default="30s",
        type=positive_duration,
        help="longest time between two NeuronNode writes (a heartbeat); every change is written at once",
    )
    return p


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    p, a, environ = parse_flags(parser, argv, env)
    require_resource_prefix(p, a.resource_prefix)
    health = resolve_health_sources(p, a, layout.HostLayout(a.host_root).kmsg)
    wanted = (("--node-report", a.node_report), ("--ultraserver-labels", a.ultraserver_labels))
    needed_by = " and ".join(flag for flag, on in wanted if on)
    node = resolve_node_name(p, a.node_name, environ, needed_by=needed_by) if needed_by else ""
    return Config(
        host_root=a.host_root,
        host_dev_root=optional_path(a.host_dev_root) or a.host_root,
        device_plugin_path=a.device_plugin_path,
        pod_resources_socket=a.pod_resources_socket,
        **resolve_serving(p, a),
        resource_prefix=a.resource_prefix,
        neurondevice_alias=a.neurondevice_alias,
        **health,
        holdings_interval=a.holdings_interval,
        shutdown_drain=a.shutdown_drain,
        pending_ttl=a.pending_ttl,
        cdi=a.cdi,
        cdi_spec_dir=a.cdi_spec_dir,
        register_timeout=a.register_timeout,
        node_report=a.node_report,
        ultraserver_labels=a.ultraserver_labels,
        node_name=node,
        kubeconfig=a.kubeconfig or None,
        node_report_interval=a.node_report_interval,
        ultraserver_env=None if a.ultraserver_env == ULTRASERVER_ENV_OFF else int(a.ultraserver_env),
    )
