"""Flags of `neuron-dra-driver`, each with a `NEURON_DRA_*` environment twin."""

from __future__ import annotations

import argparse
import re
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

# The kubelet's seamless upgrade of DRA plugins (KEP-4381, kubelet 1.33+): each instance's sockets carry
# its pod's UID, so a new instance registers beside the old one instead of unlinking the socket the
# kubelet is using, and the kubelet falls back to the old one if the new fails. The names are the
# kubeletplugin helper's (k8s.io/dynamic-resource-allocation, RollingUpdate): `<driver>-<uid>-reg.sock`
# and `dra-<uid>.sock`; the instances serialise their calls with a lock file beside the checkpoint.
SERIALIZE_LOCK = "serialize.lock"
_UID_RE = re.compile(r"^[0-9a-zA-Z][-0-9a-zA-Z]{0,62}$")


def _pod_uid(value: str) -> str:
    if value and not _UID_RE.match(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a pod UID (letters, digits and '-')")
    return value


def _with_uid(stem: str, uid: str) -> str:
    return f"{stem}-{uid}" if uid else stem


def dra_socket_name(uid: str = "") -> str:
    return _with_uid(Path(layout.DRA_SOCKET).stem, uid) + ".sock"


def registration_socket_name(uid: str = "") -> str:
    return _with_uid(layout.DRA_DRIVER_NAME, uid) + "-reg.sock"


def is_instance_socket(name: str) -> bool:
    """A socket name some instance of this driver uses, with or without a pod UID."""
    for stem, suffix in ((Path(layout.DRA_SOCKET).stem, ".sock"), (layout.DRA_DRIVER_NAME, "-reg.sock")):
        if name == stem + suffix:
            return True
        if name.startswith(stem + "-") and name.endswith(suffix):
            return bool(_UID_RE.match(name[len(stem) + 1 : -len(suffix)]))
    return False


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
    cores_as_capacity: bool = switch(
        False,
        "with --publish-cores: publish each Neuron device once, shareable, its cores as a consumable capacity "
        "`cores` (a claim asks capacity.requests.cores: k; the driver picks which cores at prepare) instead of "
        "as devices with shared counters: no arcs, no whole UltraServer node, but on Kubernetes 1.36 far faster "
        "to schedule (needs DRAConsumableCapacity, Beta and on in 1.36; where the API server drops it the "
        "driver publishes cores as devices and says so)",
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
    pod_uid: str = flag(
        "",
        "this pod's UID (the chart passes metadata.uid): the sockets are named after it, so during a rolling "
        "update the new driver registers beside the old one and the kubelet always has one (needs a kubelet of "
        "1.33 or later); empty: the fixed names dra.sock and neuron.aws.com-reg.sock",
        type=_pod_uid,
    )

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / dra_socket_name(self.pod_uid)

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / registration_socket_name(self.pod_uid)

    @property
    def serialize_lock(self) -> Path | None:
        """The file lock two instances take around each kubelet call, or None for one instance alone."""
        return self.plugin_dir / SERIALIZE_LOCK if self.pod_uid else None

    @property
    def checkpoint_file(self) -> Path:
        return self.plugin_dir / Path(layout.DRA_CHECKPOINT_FILE).name


def parser(env: Mapping[str, str] | None = None) -> EnvArgumentParser:
    return config_parser(Config, env)


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    return parse_config(Config, argv, env)
