"""Flags of `neuron-dra-driver`, each with a `NEURON_DRA_*` environment twin."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from neuron_common.config import (
    ApiRequests,
    EnvArgumentParser,
    HostDevices,
    Node,
    ServiceConfig,
    Serving,
    UltraServerLabels,
    config_parser,
    flag,
    parse_config,
    positive_duration,
    switch,
)
from neuron_dra_driver import slices
from neuron_driver import layout
from neuron_health.flags import HealthSources

DEFAULT_LISTEN = "0.0.0.0:9844"


def _taint_effect(severity: str) -> Any:
    return flag(
        "NoSchedule",
        f"effect of the taint of a device with a fault of severity {severity} (the fault table's); NoExecute also "
        "evicts the pods using it. A missing device or the problem detector's verdict: NoSchedule",
        choices=slices.TAINT_EFFECTS,
    )


@dataclass(frozen=True, kw_only=True)
class Config(Node, HostDevices, ApiRequests, UltraServerLabels, Serving, HealthSources, ServiceConfig):
    """Kubernetes DRA kubelet plugin for AWS Neuron (driver neuron.aws.com): publishes the node's Neuron
    devices and NeuronCores as ResourceSlices and prepares allocated claims with CDI."""

    PROG: ClassVar[str] = "neuron-dra-driver"
    ENV_PREFIX: ClassVar[str] = "NEURON_DRA_"
    FLAGS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "listen": {"default": DEFAULT_LISTEN},
        "node_name": {"help": "this node's name; the pool is named after it (default $NODE_NAME)"},
    }

    plugin_dir: Path = flag(
        layout.DRA_PLUGIN_DIR,
        "the driver's directory under the kubelet's plugins/ (dra.sock, checkpoint.json)",
        type=Path,
    )
    registry_dir: Path = flag(
        layout.DRA_REGISTRY_DIR, "the kubelet's plugins_registry directory (the registration socket)", type=Path
    )
    cdi_spec_dir: Path = flag(layout.CDI_SPEC_DIR, "where claims' CDI specs are written", type=Path)
    publish_cores: bool = switch(
        True,
        "publish each NeuronCore as a device too, sharing a counter with its Neuron device (needs the "
        "DRAPartitionableDevices feature, Beta and on in Kubernetes 1.36)",
    )
    publish_groups: bool = switch(
        True,
        "on a ring (inf1, inf2) publish every arc of connected devices as one device too (neurongroup<k>-<first>), "
        "so a claim can get any arc, overlapping ones included; needs --publish-cores (the arcs share its counters)",
    )
    device_taints: bool = switch(
        True,
        "keep an unhealthy device (and its cores) in the ResourceSlices with the taint neuron.aws.com/unhealthy="
        "<fault kind> instead of leaving it out (needs DRADeviceTaints, Beta and on in Kubernetes 1.36; where the "
        "API server drops taints the driver leaves such devices out and says so)",
    )
    taint_effect_until_reboot: str = _taint_effect("until-reboot")
    taint_effect_replace_instance: str = _taint_effect("replace-instance")
    resync_interval: float = flag(
        "1m", "longest time between two checks that the ResourceSlices are as published", type=positive_duration
    )

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / Path(layout.DRA_SOCKET).name

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / Path(layout.DRA_REGISTRATION_SOCKET).name

    @property
    def checkpoint_file(self) -> Path:
        return self.plugin_dir / Path(layout.DRA_CHECKPOINT_FILE).name


def parser(env: Mapping[str, str] | None = None) -> EnvArgumentParser:
    return config_parser(Config, env)


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    return parse_config(Config, argv, env)
