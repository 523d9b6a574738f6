"""Wiring: the node model and its health monitors, the claim driver, the kubelet's gRPC servers,
the slice publisher and the HTTP endpoint, every loop under one supervisor."""

from __future__ import annotations

import asyncio
import logging
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from neuron_common.health_server import HealthServer
from neuron_common.kube import Api
from neuron_common.node_labels import NodeLabeler, ultraserver_labeler
from neuron_common.runner import run_service
from neuron_common.supervisor import Loop, Supervisor
from neuron_dra_driver import servers, slices, taints
from neuron_dra_driver.config import Config
from neuron_dra_driver.driver import Driver
from neuron_dra_driver.metrics import DriverMetrics
from neuron_dra_driver.placement import NodePlacement
from neuron_dra_driver.publisher import SlicePublisher
from neuron_driver import layout
from neuron_driver.inventory import scan_at_start
from neuron_driver.ultraserver import read_ultraserver
from neuron_health import layout_check
from neuron_health.device_health import DeviceHealth
from neuron_health.kernel_log import host_timezone
from neuron_health.monitor import HealthMonitor, KmsgWatcher

log = logging.getLogger(__name__)


def own_version() -> str:
    try:
        return version("neuron-dra-driver")
    except PackageNotFoundError:  # run from a source tree
        return "0.0.0"


def driver_version(host_root: Path) -> str | None:
    try:
        return layout.HostLayout(host_root).driver_version.read_text().strip() or None
    except OSError:
        return None


class DraDriver:
    def __init__(self, config: Config, stop: asyncio.Event, api: Api) -> None:
        self.config = config
        self.stop = stop
        self.api = api
        self.metrics = DriverMetrics()
        inventory = scan_at_start(config.host_root, log)
        self.layout = layout_check.check_at_start(config.host_root, inventory, log, self.metrics.health_sources_missing)
        # Read by the slice publisher (an unhealthy device leaves the pool) and by
        # NodePrepareResources (a claim on an unhealthy device is refused with the reason).
        self.health = DeviceHealth(inventory, config.health_quiet_period, time.monotonic, logger=log)
        self.kernel_driver_version = driver_version(config.host_root)
        self.plugin_version = own_version()
        self.driver = Driver(
            node_name=config.node_name,
            api=api,
            inventory=lambda: self.health.inventory,
            unhealthy=self.health.unhealthy,
            taints=self.taints,
            ultraserver=lambda: read_ultraserver(config.host_root),
            checkpoint_file=config.checkpoint_file,
            cdi_dir=config.cdi_spec_dir,
            host_dev_root=config.host_dev_root,
            metrics=self.metrics,
            lock_file=config.serialize_lock,
        )
        self.monitor = HealthMonitor(
            self.health,
            config.host_root,
            config.health_interval,
            config.verdict_dir,
            on_error=lambda kind: self.metrics.errors.labels(kind).inc(),
            heartbeat_stale_after=config.heartbeat_stale_after,
        )
        self.publisher = SlicePublisher(api, config.node_name, self.model, self.metrics, resync=config.resync_interval)
        self.placement = NodePlacement(
            api, config.node_name, config.resync_interval, self.metrics, on_change=self.publisher.kick
        )
        self.registration = servers.RegistrationServicer(config.dra_socket, self.metrics, on_change=self.publisher.kick)
        self.labeler: NodeLabeler | None = None
        if config.ultraserver_labels:
            self.labeler = ultraserver_labeler(
                api, config.node_name, lambda: read_ultraserver(config.host_root), self.metrics.node_label_writes
            )
        self.supervisor = Supervisor(stop)
        self.http = HealthServer.for_service(
            config.listen, self.metrics.registry, self.supervisor, self.ready, config.metrics_security, api=self.api
        )

    def model(self) -> slices.NodeDevices:
        taints = self.taints()
        return slices.NodeDevices(
            self.config.node_name,
            self.health.inventory,
            tuple(d for d in self.health.unhealthy() if d not in taints),
            driver_version=self.kernel_driver_version,
            plugin_version=self.plugin_version,
            publish_cores=self.config.publish_cores,
            cores_as_capacity=self.config.cores_as_capacity,
            taints=taints,
            publish_groups=self.config.publish_groups,
            placement=self.placement.attributes,
            ultraserver=self.driver.ultraserver(),
            multi_node_unfit=dict(self.health.multi_node_unfit),
        )

    def taints(self) -> dict[int, slices.Taint]:
        """The taint of each unhealthy device, when taints are on (else none: such devices leave)."""
        if not self.config.device_taints:
            return {}
        c = self.config
        effects = taints.Effects(c.taint_effect_until_reboot, c.taint_effect_replace_instance)
        return {d: taints.taint_for(v, effects) for d, v in self.health.unhealthy_verdicts().items()}

    def ready(self) -> tuple[bool, str]:
        if not self.registration.registered:
            why = f": {self.registration.error}" if self.registration.error else ""
            return False, "not registered with the kubelet" + why
        if not self.publisher.synced:
            return False, "ResourceSlices not published yet"
        detail = f"; {self.driver.problem}" if self.driver.problem else ""
        return True, f"registered; {len(self.driver.prepared)} prepared claim(s){detail}"

    async def run(self) -> int:
        self.driver.load()
        await self.placement.refresh()  # so that the first slices carry the placement already
        return await run_service(self.http, self.supervisor, self.stop, self._loops, release=self.api.close)

    def _loops(self) -> dict[str, Loop]:
        c = self.config
        loops: dict[str, Loop] = {
            "grpc": lambda: servers.serve(
                self.driver, self.health, self.registration, c.dra_socket, c.registration_socket, c.node_name, self.stop
            ),
            "health": lambda: self.monitor.watch.run(self.stop, self.monitor.handle),
        }
        if c.kmsg_path is not None:
            kmsg = KmsgWatcher(
                self.health,
                c.kmsg_path,
                format=c.kernel_log_format,
                tz=host_timezone(c.host_root),
                on_error=lambda source: self.metrics.errors.labels(source).inc(),
            )
            loops["kmsg"] = lambda: kmsg.run(self.stop)
        if self.labeler is not None:
            labeler = self.labeler
            loops["ultraserver-labels"] = lambda: labeler.run(self.stop)
        loops["placement"] = lambda: self.placement.run(self.stop)
        loops["slices"] = lambda: self.publisher.run(self.stop, lambda: self.health.changed)
        loops["slice-deletions"] = lambda: self.publisher.watch_deletions(self.stop)
        return loops
