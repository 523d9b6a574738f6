"""Flags of `neuron-dra-driver`, each with a `NEURON_DRA_*` environment twin."""

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
    optional_path,
    parse_flags,
    positive_duration,
    resolve_health_sources,
    resolve_node_name,
    resolve_serving,
)
from neuron_dra_driver import slices
from neuron_driver import layout

DEFAULT_LISTEN = "0.0.0.0:9844"


@dataclass(frozen=True)
class Config:
    node_name: str
    host_root: Path
    host_dev_root: Path  # the root the container runtime resolves /dev/neuronN against
    plugin_dir: Path  # dra.sock and the checkpoint
    registry_dir: Path  # the kubelet's plugins_registry
    cdi_spec_dir: Path
    kubeconfig: str | None  # None: the in-cluster service account
    listen: tuple[str, int]
    log_level: str
    health_interval: float
    health_quiet_period: float
    kmsg_path: Path | None
    verdict_dir: Path | None
    publish_cores: bool
    publish_groups: bool
    device_taints: bool
    taint_effect_until_reboot: str
    taint_effect_replace_instance: str
    resync_interval: float
    api_timeout: float
    metrics_security: MetricsSecurity | None = None  # --metrics-auth=kubernetes
    ultraserver_labels: bool = False
    kernel_log_format: str = "kmsg"  # --kernel-log-format of kmsg_path

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
    p = EnvArgumentParser(
        prog="neuron-dra-driver",
        description="Kubernetes DRA kubelet plugin for AWS Neuron (driver neuron.aws.com): publishes the node's "
        "Neuron devices and NeuronCores as ResourceSlices and prepares allocated claims with CDI.",
        env_prefix="NEURON_DRA_",
        env=env,
    )
    add_node_flag(p, "; the pool is named after it")
    add_host_flags(p, dev_root=True)
    p.add_flag(
        "--plugin-dir",
        default=layout.DRA_PLUGIN_DIR,
        type=Path,
        help="the driver's directory under the kubelet's plugins/ (dra.sock, checkpoint.json)",
    )
    p.add_flag(
        "--registry-dir",
        default=layout.DRA_REGISTRY_DIR,
        type=Path,
        help="the kubelet's plugins_registry directory (the registration socket)",
    )
    p.add_flag("--cdi-spec-dir", default=layout.CDI_SPEC_DIR, type=Path, help="where claims' CDI specs are written")
    add_api_flags(p, timeout="10s")
    add_ultraserver_labels_flag(p)
    add_serving_flags(p, DEFAULT_LISTEN)
    add_health_source_flags(p)
    p.add_bool_flag(
        "--publish-cores",
        default=True,
        help="publish each NeuronCore as a device too, sharing a counter with its Neuron device "
        "(needs the DRAPartitionableDevices feature, Beta and on in Kubernetes 1.36)",
    )
    p.add_bool_flag(
        "--publish-groups",
        default=True,
        help="on a ring (inf1, inf2) publish every arc of connected devices as one device too "
        "(neurongroup<k>-<first>), so a claim can get any arc, overlapping ones included; needs --publish-cores "
        "(the arcs share its counters)",
    )
    p.add_bool_flag(
        "--device-taints",
        default=True,
        help="keep an unhealthy device (and its cores) in the ResourceSlices with the taint neuron.aws.com/unhealthy="
        "<fault kind> instead of leaving it out (needs DRADeviceTaints, Beta and on in Kubernetes 1.36; where the API "
        "server drops taints the driver leaves such devices out and says so)",
    )
    for severity, default in (("until-reboot", "NoSchedule"), ("replace-instance", "NoSchedule")):
        p.add_flag(
            f"--taint-effect-{severity}",
            default=default,
            choices=slices.TAINT_EFFECTS,
            help=f"effect of the taint of a device with a fault of severity {severity} (the fault table's); "
            "NoExecute also evicts the pods using it. A missing device or the problem detector's verdict: NoSchedule",
        )
    p.add_flag(
        "--resync-interval",
        default="1m",
        type=positive_duration,
        help="longest time between two checks that the ResourceSlices are as published",
    )
    return p


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    p, a, environ = parse_flags(parser, argv, env)
    health = resolve_health_sources(p, a, layout.HostLayout(a.host_root).kmsg)
    node = resolve_node_name(p, a.node_name, environ)
    return Config(
        node_name=node,
        host_root=a.host_root,
        host_dev_root=optional_path(a.host_dev_root) or a.host_root,
        plugin_dir=a.plugin_dir,
        registry_dir=a.registry_dir,
        cdi_spec_dir=a.cdi_spec_dir,
        kubeconfig=a.kubeconfig or None,
        **resolve_serving(p, a),
        **health,
        publish_cores=a.publish_cores,
        publish_groups=a.publish_groups,
        device_taints=a.device_taints,
        taint_effect_until_reboot=a.taint_effect_until_reboot,
        taint_effect_replace_instance=a.taint_effect_replace_instance,
        resync_interval=a.resync_interval,
        api_timeout=a.api_timeout,
        ultraserver_labels=a.ultraserver_labels,
    )
