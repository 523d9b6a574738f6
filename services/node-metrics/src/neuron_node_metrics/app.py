"""Wiring: the attribution timer, the collectors, the HTTP endpoint."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from kubelet_api.podresources_client import PodResourcesClient
from neuron_common.health_server import HealthServer
from neuron_common.podresources import PodResourcesPoller, PodResourcesSnapshot
from neuron_common.runner import run_service
from neuron_common.supervisor import Supervisor
from neuron_driver.inventory import NodeInventory, topology_from
from neuron_model.instance_types import TopologyKind
from neuron_model.resources import Kind
from neuron_node_metrics import __version__
from neuron_node_metrics.attribution import Attribution, attribute
from neuron_node_metrics.catalogue import ALL_FAMILIES
from neuron_node_metrics.collector import NeuronCollector, Rows
from neuron_node_metrics.config import Config
from neuron_node_metrics.monitor_source import STATES, MonitorSource
from neuron_node_metrics.runtime_metrics import instance_labels, runtime_rows

log = logging.getLogger(__name__)


class Exporter:
    def __init__(self, config: Config, stop: asyncio.Event) -> None:
        self.config = config
        self.stop = stop
        self._attribution = Attribution()
        self._allocatable: dict[str, int] | None = None
        self.last_scrape_seconds = 0.0
        self.scrapes = 0
        self.poller = PodResourcesPoller(
            PodResourcesClient(config.pod_resources_socket, keep_open=False),
            config.attribution_interval,
            with_allocatable=True,
            on_update=self._on_podresources,
        )
        self.monitor = MonitorSource(config.neuron_monitor_command)
        self.collector = NeuronCollector(
            config.host_root,
            config.metrics,
            lambda: self._attribution,
            naming=config.naming,
            resources_capacity=self._capacity,
            allocatable=lambda: self._allocatable,
            runtime_rows=self._runtime_rows if config.neuron_monitor_command else None,
            instance_labels=instance_labels(self.monitor.runtime),
            heartbeat_stale_after=config.heartbeat_stale_after,
        )
        inv = self.collector.inventory
        log.info(
            "exporting %d Neuron device(s), %d logical core(s)",
            len(inv.devices),
            len(inv.cores),
            extra={"instance_type": inv.instance_type_name, "host_root": str(config.host_root)},
        )
        # /metrics renders the Neuron collector's text directly (see collector.py); `registry`
        # holds both collectors for anyone who wants prometheus-client's own exposition.
        self.self_registry = CollectorRegistry(auto_describe=False)
        self.self_registry.register(_SelfCollector(self))
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.registry.register(_SelfCollector(self))
        self.supervisor = Supervisor(stop)
        self.http = HealthServer.for_service(
            config.listen,
            self.registry,
            self.supervisor,
            self.ready,
            config.metrics_security,
            kubeconfig=config.kubeconfig,
            review_registry=self.self_registry,
            metrics_handler=self.metrics,
        )

    def _capacity(self, inv: NodeInventory) -> dict[str, int]:
        return {
            r.full_name: len(inv.devices) if r.kind is Kind.DEVICE else len(inv.cores)
            for r in self.config.resources
            if r.name != "neurondevice"
        }

    def _on_podresources(self, snapshot: PodResourcesSnapshot) -> None:
        self._attribution = attribute(
            snapshot.holdings,
            self.config.resources,
            self.collector.cores_of_device,
            max_owners=self.config.max_attributed_containers,
            max_label_length=self.config.max_label_length,
            ring=self._ring(),
        )
        if self._attribution.dropped:
            log.warning(
                "%d container(s) left unattributed: --max-attributed-containers=%d reached",
                self._attribution.dropped,
                self.config.max_attributed_containers,
            )
        if snapshot.allocatable is not None:
            self._allocatable = {name: len(ids) for name, ids in snapshot.allocatable.items()}

    def _runtime_rows(self, attribution: Attribution) -> Iterator[Rows]:
        device_of = {c.index: c.device for c in self.collector.inventory.cores}
        return runtime_rows(
            self.monitor.runtime, self.config.metrics, attribution, device_of, naming=self.config.naming
        )

    def _ring(self) -> int | None:
        """The ring's length when this node's devices are a ring (its DRA arcs name their first device)."""
        topo = topology_from(self.collector.inventory)
        return topo.device_count if topo.kind is TopologyKind.RING else None

    def attribution_age(self) -> float:
        latest = self.poller.latest
        return -1.0 if latest is None else time.monotonic() - latest.fetched_at

    def ready(self) -> tuple[bool, str]:
        devices = len(self.collector.inventory.devices)
        pr = "up" if self.poller.up else "down (metrics are served without pod labels)"
        return True, f"exporting {devices} device(s); PodResources {pr}; neuron-monitor {self.monitor.state}"

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        # Sent in pieces as made (chunked): building the whole page first held three copies of it
        # at the peak, and the allocator kept that peak as the exporter's resident memory.
        response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE_LATEST})
        await response.prepare(request)
        # the scrape duration is reading and rendering, as before; not the wait on a slow scraper
        rendering = 0.0
        pieces = self.collector.render_pieces()
        while True:
            started = time.perf_counter()
            piece = next(pieces, None)
            rendering += time.perf_counter() - started
            if piece is None:
                break
            await response.write(piece)
        await response.write(generate_latest(self.self_registry))
        await response.write_eof()
        self.last_scrape_seconds = rendering
        self.scrapes += 1
        return response

    async def run(self) -> int:
        return await run_service(
            self.http,
            self.supervisor,
            self.stop,
            lambda: {
                "attribution": lambda: self.poller.run(self.stop),
                "neuron-monitor": lambda: self.monitor.run(self.stop),
            },
        )


class _SelfCollector(Collector):
    def __init__(self, exporter: Exporter) -> None:
        self.e = exporter

    def collect(self) -> Iterator[Metric]:
        e = self.e

        def single(name: str, value: float, labels: dict[str, str] | None = None) -> Metric:
            f = ALL_FAMILIES[name]
            m = Metric(f.base_name, f.help, "counter" if f.type == "counter" else "gauge")
            m.samples.append(Sample(name, labels or {}, value))
            return m

        yield single("neuron_exporter_scrape_duration_seconds", e.last_scrape_seconds)
        yield single("neuron_exporter_scrapes_total", e.scrapes)
        yield single("neuron_exporter_attribution_age_seconds", e.attribution_age())
        yield single("neuron_exporter_podresources_up", 1 if e.poller.up else 0)
        yield single("neuron_exporter_attribution_dropped_containers", e._attribution.dropped)
        yield single("neuron_exporter_build_info", 1, {"version": __version__})
        yield single("neuron_exporter_health_sources_missing", len(e.collector.layout.missing))
        f = ALL_FAMILIES["neuron_exporter_monitor_state"]
        state = Metric(f.base_name, f.help, "gauge")
        state.samples.extend(Sample(f.name, {"state": s}, 1 if s == e.monitor.state else 0) for s in STATES)
        yield state
        yield single("neuron_exporter_monitor_restarts_total", e.monitor.restarts)
        yield single("neuron_exporter_monitor_documents_total", e.monitor.documents)
        for name, tally, label in (
            ("neuron_exporter_read_errors_total", e.collector.read_errors, "kind"),
            ("neuron_exporter_podresources_errors_total", e.poller.errors, "code"),
            ("neuron_exporter_monitor_problems_total", e.monitor.problems, "kind"),
        ):
            f = ALL_FAMILIES[name]
            m = Metric(f.base_name, f.help, "counter")
            for key, count in sorted(tally.items()):
                m.samples.append(Sample(name, {label: key}, count))
            yield m
