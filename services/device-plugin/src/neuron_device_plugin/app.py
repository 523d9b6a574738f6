"""Wiring: state, one server and registrar per resource, the monitors, the HTTP endpoint."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

from kubelet_api.podresources_client import PodResourcesClient
from neuron_common.health_server import HealthServer
from neuron_common.kube import Api
from neuron_common.node_labels import NodeLabeler, ultraserver_labeler
from neuron_common.podresources import PodResourcesPoller, PodResourcesSnapshot
from neuron_common.runner import run_service
from neuron_common.supervisor import Loop, Supervisor
from neuron_device_plugin import cdi, registration
from neuron_device_plugin.config import API_TIMEOUT, Config
from neuron_device_plugin.drain import Drain
from neuron_device_plugin.metrics import PluginMetrics
from neuron_device_plugin.node_report import NodeReportPublisher, ServerSideApply, build_report
from neuron_device_plugin.registration import Registrar, ResourceServer
from neuron_device_plugin.server import DevicePluginServicer
from neuron_device_plugin.state import PluginState
from neuron_driver.inventory import scan_at_start
from neuron_driver.ultraserver import read_ultraserver
from neuron_health import layout_check
from neuron_health.kernel_log import host_timezone
from neuron_health.monitor import HealthMonitor, KmsgWatcher

log = logging.getLogger(__name__)


class Plugin:
    def __init__(
        self,
        config: Config,
        stop: asyncio.Event,
        *,
        api: Api | None = None,
        clock: Callable[[], float] = time.monotonic,
        kmsg_file_poll: float = 1.0,
    ) -> None:
        """`api`: the API-server client for --node-report, --ultraserver-labels and --metrics-auth; by
        default made from --kubeconfig or the pod's service account when one of them is on.
        `clock`: the health quiet periods' and pending hand-outs' clock, for tests to move past them.
        `kmsg_file_poll`: how often a kernel-log file (a simulated node's) is read; not /dev/kmsg's."""
        self.config = config
        self.kmsg_file_poll = kmsg_file_poll
        self.stop = stop
        self.metrics = PluginMetrics()
        inventory = scan_at_start(config.host_root, log, host_root=str(config.host_root))
        self.layout = layout_check.check_at_start(config.host_root, inventory, log, self.metrics.health_sources_missing)
        self.state = PluginState(
            inventory,
            config.resources,
            self.metrics,
            quiet_period=config.health_quiet_period,
            pending_ttl=config.pending_ttl,
            clock=clock,
        )
        self.poller = PodResourcesPoller(
            PodResourcesClient(config.pod_resources_socket, keep_open=False),
            config.holdings_interval,
            on_update=self._on_holdings,
        )
        # The poller calls back only on a List that answered: a failed one shows in `up` alone.
        self.metrics.podresources_up.set_function(lambda: 1.0 if self.poller.up else 0.0)
        self.registrars: list[Registrar] = []
        self.drain = Drain(config.shutdown_drain)
        self.cdi_spec = (
            cdi.SpecKeeper(config.cdi_spec_dir, config.resource_prefix, config.host_dev_root) if config.cdi else None
        )
        for resource in config.resources:
            registrar: list[Registrar] = []  # the factory's servicer reports a lost stream to it

            def factory(resource=resource, registrar=registrar) -> DevicePluginServicer:  # type: ignore[no-untyped-def]
                return DevicePluginServicer(
                    resource,
                    self.state,
                    self.metrics,
                    self.stop,
                    host_dev_root=config.host_dev_root,
                    cdi=self.cdi_spec,
                    ultraserver_nodes=config.ultraserver_env,
                    ultraserver=lambda: read_ultraserver(config.host_root),
                    drain=self.drain,
                    on_stream_lost=registrar[0].stream_lost,  # made by the time the server starts
                )

            server = ResourceServer(resource, config.device_plugin_path, factory)
            registrar.append(
                Registrar(server, config.kubelet_socket, self.metrics, register_timeout=config.register_timeout)
            )
            self.registrars.append(registrar[0])
        # The monitors feed the device health the state holds (which wakes the streams on a change);
        # a new inventory goes through the state, which keeps its device list from it.
        self.monitor = HealthMonitor(
            self.state.health,
            config.host_root,
            config.health_interval,
            config.verdict_dir,
            on_error=lambda kind: self.metrics.errors.labels(kind).inc(),
            after_tick=self.state.expire_pending,
            on_inventory=self.state.set_inventory,
            heartbeat_stale_after=config.heartbeat_stale_after,
        )
        self.kube = api
        if self.kube is None and (config.node_report or config.ultraserver_labels or config.metrics_security):
            self.kube = Api.from_kubeconfig(config.kubeconfig, API_TIMEOUT)
        self.report: NodeReportPublisher | None = None
        if config.node_report and self.kube is not None:
            self.report = NodeReportPublisher(
                self._report_object, ServerSideApply(self.kube), self.metrics, interval=config.node_report_interval
            )
        self.labeler: NodeLabeler | None = None
        if config.ultraserver_labels and self.kube is not None:
            self.labeler = ultraserver_labeler(
                self.kube, config.node_name, lambda: read_ultraserver(config.host_root), self.metrics.node_label_writes
            )
        self.supervisor = Supervisor(stop)
        self.http = HealthServer.for_service(
            config.listen, self.metrics.registry, self.supervisor, self.ready, config.metrics_security, api=self.kube
        )

    def _on_holdings(self, snapshot: PodResourcesSnapshot) -> None:
        self.state.set_kubelet_holdings(snapshot.holdings, snapshot.started_at)

    def _report_object(self) -> dict[str, Any]:
        now = dt.datetime.now(dt.UTC)
        return build_report(self.state, self.config.node_name, now, read_ultraserver(self.config.host_root)).to_object()

    def ready(self) -> tuple[bool, str]:
        missing = [r.resource.full_name for r in self.registrars if not r.registered]
        if missing:
            return False, "not registered with the kubelet: " + ", ".join(missing)
        return True, "registered: " + ", ".join(r.resource.full_name for r in self.registrars)

    async def run(self) -> int:
        if self.cdi_spec is not None:
            self.cdi_spec.ensure(self.state.known)
            log.info("wrote CDI spec %s", self.cdi_spec.path)
        return await run_service(self.http, self.supervisor, self.stop, self._loops, release=self._release)

    async def _release(self) -> None:
        if self.kube is not None:
            await self.kube.close()

    def _loops(self) -> dict[str, Loop]:
        # Stopping `registration` keeps the servers answering the kubelet until the drain settles
        # (drain.py), then unregisters and closes the plugin sockets with a grace period, so RPCs in
        # flight complete.
        loops: dict[str, Loop] = {
            "registration": lambda: registration.watch(self.registrars, self.stop, drain=self.drain),
            "health": lambda: self.monitor.watch.run(self.stop, self.monitor.handle),
            "holdings": self._poll_holdings,
        }
        # The kernel log: with the problem detector (the chart's default: --kmsg-path=none) a kernel
        # line reaches health as the detector's verdict file, read by `health` each interval
        # (docs/ARCHITECTURE.md draws the path); without it the plugin follows the log itself.
        if self.config.kmsg_path is not None:
            kmsg = KmsgWatcher(
                self.state.health,
                self.config.kmsg_path,
                file_poll=self.kmsg_file_poll,
                format=self.config.kernel_log_format,
                tz=host_timezone(self.config.host_root),
                on_error=lambda source: self.metrics.errors.labels(source).inc(),
            )
            loops["kmsg"] = lambda: kmsg.run(self.stop)
        if self.labeler is not None:
            labeler = self.labeler
            loops["ultraserver-labels"] = lambda: labeler.run(self.stop)
        if self.report is not None:
            report = self.report
            loops["node-report"] = lambda: report.run(self.stop, lambda: self.state.changed)
        return loops

    async def _poll_holdings(self) -> None:
        await self.poller.run(self.stop)
        self.metrics.podresources_up.set_function(lambda: 0.0)
