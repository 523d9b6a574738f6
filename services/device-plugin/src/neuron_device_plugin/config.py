"""Flags of `neuron-device-plugin`, each with a `NEURON_DP_*` environment twin."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from neuron_common.config import (
    ApiServer,
    EnvArgumentParser,
    HostDevices,
    Node,
    ResourcePrefix,
    ServiceConfig,
    Serving,
    UltraServerLabels,
    config_parser,
    flag,
    non_negative_duration,
    parse_config,
    positive_duration,
    switch,
)
from neuron_driver import layout
from neuron_health.flags import HealthSources
from neuron_model import resources
from neuron_model.ultraserver import ENV_GROUP_SIZES

API_TIMEOUT = 5.0  # seconds, per API-server request: a /metrics review must answer within a scrape's timeout
DEFAULT_LISTEN = "0.0.0.0:9841"
ULTRASERVER_ENV_OFF = "off"
ULTRASERVER_ENV_CHOICES = (ULTRASERVER_ENV_OFF, *map(str, ENV_GROUP_SIZES))


@dataclass(frozen=True, kw_only=True)
class Config(HostDevices, Serving, ResourcePrefix, HealthSources, UltraServerLabels, Node, ApiServer, ServiceConfig):
    """Kubelet device plugin for AWS Neuron: advertises whole devices (<prefix>/neuron) and logical
    NeuronCores (<prefix>/neuroncore), allocates them topology-aware and reports their health."""

    PROG: ClassVar[str] = "neuron-device-plugin"
    ENV_PREFIX: ClassVar[str] = "NEURON_DP_"

    NODE_NAME_NEEDED_BY: ClassVar[Mapping[str, str]] = {
        "node_report": "--node-report",
        "ultraserver_labels": "--ultraserver-labels",
    }

    FLAGS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "listen": {"default": DEFAULT_LISTEN},
        "node_name": {"help": "this node's name for --node-report and --ultraserver-labels (default $NODE_NAME)"},
        "kubeconfig": {
            "help": "kubeconfig file for --node-report and --ultraserver-labels; "
            "default: the in-cluster service account"
        },
    }

    device_plugin_path: Path = flag(
        layout.DEVICE_PLUGIN_DIR, "the kubelet's device-plugins directory (kubelet.sock and plugin sockets)", type=Path
    )
    pod_resources_socket: str = flag(
        layout.POD_RESOURCES_SOCKET, "the kubelet's PodResources socket, read to learn current holdings"
    )
    neurondevice_alias: bool = switch(False, "also advertise the deprecated <prefix>/neurondevice (whole devices)")
    holdings_interval: float = flag(
        "5s",
        "time between PodResources List calls (a timer only); an own hand-out counts as held until a List shows it, "
        "or for --pending-ttl",
        type=positive_duration,
    )
    pending_ttl: float = flag(
        "1m",
        "how long an own allocation counts as held before the kubelet's List confirms it",
        type=positive_duration,
    )
    shutdown_drain: float = flag(
        "2s",
        "after SIGTERM, keep answering the kubelet this long, and until no call came for half a second (at most 4 "
        "times this), so a pod being admitted is not failed; 0: stop at once",
        type=non_negative_duration,
    )
    cdi: bool = switch(
        False,
        "return CDI device names (and write a CDI spec) instead of device nodes; the container runtime must have "
        "CDI enabled",
    )
    cdi_spec_dir: Path = flag(layout.CDI_SPEC_DIR, "where the CDI spec is written", type=Path)
    register_timeout: float = flag("10s", "how long to wait for the kubelet to answer Register", type=positive_duration)
    node_report: bool = switch(
        False,
        "publish this node's NeuronNode (free devices and cores, health, topology) to the API server for the "
        "Neuron-aware scheduler",
    )
    ultraserver_env: int | None = flag(
        ULTRASERVER_ENV_OFF,
        "give a container that holds all of this node's Neuron devices the runtime's UltraServer variables "
        "(NEURON_RT_ULTRASERVER_MODE, _SERVER_ID, _NODE_ID) for a job spanning this many nodes of its UltraServer, "
        "from the driver's identity; such a container is refused while the identity is not known yet or has no "
        "group of that size, and gets none on a node outside any UltraServer. 'off': none",
        choices=ULTRASERVER_ENV_CHOICES,
        convert=lambda size: None if size == ULTRASERVER_ENV_OFF else int(size),
    )
    node_report_interval: float = flag(
        "30s",
        "longest time between two NeuronNode writes (a heartbeat); every change is written at once",
        type=positive_duration,
    )

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
    return config_parser(Config, env)


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    return parse_config(Config, argv, env)
