"""Wiring: the API client, the two sources feeding the view, leader election, the HTTP server."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Any

from neuron_common.health_server import HealthServer
from neuron_common.kube import Api
from neuron_common.leader import AlwaysLeader, LeaderElector
from neuron_common.lifecycle import sleep_or_stop
from neuron_common.metrics_auth import MetricsAuthorizer
from neuron_common.reflector import Reflector, Resource
from neuron_common.runner import run_service
from neuron_common.supervisor import Loop, Supervisor
from neuron_model import report
from neuron_scheduler_extender import tls
from neuron_scheduler_extender.config import Config
from neuron_scheduler_extender.endpoints import MAX_BODY, Endpoints, Forwarder
from neuron_scheduler_extender.failures import NodeHealth, node_health
from neuron_scheduler_extender.group_health import GroupHealthMonitor, NodeHealthIndex
from neuron_scheduler_extender.metrics import Metrics
from neuron_scheduler_extender.pdbs import Budget, budget
from neuron_scheduler_extender.pods import PodRecord, ResourceNames, nomination, pod_record
from neuron_scheduler_extender.protocol import BindingArgs
from neuron_scheduler_extender.state import ClusterView, ReportRecord, report_record

# Only bound pods that still run can hold silicon; the API server filters out the rest.
BOUND_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
NEURON_NODES = Resource("neuronnodes", f"/apis/{report.GROUP}/{report.VERSION}/{report.PLURAL}")
PODS = Resource("pods", "/api/v1/pods", {"fieldSelector": BOUND_PODS})
# Pending pods kube-scheduler nominated to a node: whom each preemption was for, which the preempt
# verb alone does not tell (it answers several nodes; kube-scheduler picks one). Few at any time.
NOMINATED_PODS = Resource(
    "nominated pods", "/api/v1/pods", {"fieldSelector": "spec.nodeName=,status.nominatedNodeName!="}
)
NODES = Resource("nodes", "/api/v1/nodes")  # only for their Neuron health (failures.node_health)
# for preemption's victims, as kube-scheduler weighs them (pdbs); not needed to be ready
BUDGETS = Resource("poddisruptionbudgets", "/apis/policy/v1/poddisruptionbudgets")
MAINTENANCE_INTERVAL = 10.0

log = logging.getLogger(__name__)


class Extender:
    def __init__(self, config: Config, stop: asyncio.Event, api: Api | None = None) -> None:
        self.config = config
        self.stop = stop
        self.api = api or Api.from_kubeconfig(config.kubeconfig, config.api_timeout)
        self.names = ResourceNames.under(config.resource_prefix)
        self.view = ClusterView(report_max_age=config.report_max_age, group_ttl=config.group_reservation_ttl)
        self.metrics = Metrics()
        self.reports: Reflector[ReportRecord] = Reflector(
            self.api,
            NEURON_NODES,
            reduce=report_record,
            replace=lambda records, _: self.view.replace_reports(records),
            apply=self.view.apply_report,
        )
        self.pods: Reflector[PodRecord] = Reflector(
            self.api,
            PODS,
            reduce=lambda obj: pod_record(obj, self.names),
            replace=self.view.replace_pods,
            apply=self.view.apply_pod,
        )
        # not needed to be ready: until it has listed, a hold is shared as before any nomination shows
        self.nominated: Reflector[tuple[str, str]] = Reflector(
            self.api,
            NOMINATED_PODS,
            reduce=nomination,
            replace=lambda records, _: self.view.replace_nominations(records),
            apply=self.view.apply_nomination,
        )
        self.budgets: Reflector[Budget] = Reflector(
            self.api, BUDGETS, reduce=budget, replace=self.view.replace_budgets, apply=self.view.apply_budget
        )
        self.node_health = NodeHealthIndex(self.view.health)
        self.nodes: Reflector[NodeHealth] = Reflector(
            self.api, NODES, reduce=node_health, replace=self.node_health.replace, apply=self.node_health.apply
        )
        self.leader = LeaderElector(self.api, config.lease) if config.leader_elect else AlwaysLeader()
        self.supervisor = Supervisor(stop)
        host, port = config.listen
        self.tls_contexts: list[ssl.SSLContext] = []
        forwarder = Forwarder()
        if config.tls is not None:
            self.tls_contexts = [tls.server_context(config.tls), tls.client_context(config.tls)]
            forwarder = Forwarder(ssl_context=self.tls_contexts[1], server_name=config.tls.server_name)
        self.http = HealthServer(
            host,
            port,
            self.metrics.registry,
            live=self.supervisor.healthy,
            ready=self.ready,
            client_max_size=max(MAX_BODY.values()),
            ssl_context=self.tls_contexts[0] if self.tls_contexts else None,
            metrics_guard=MetricsAuthorizer(self.api, self.metrics.registry).guard if config.metrics_auth else None,
        )
        self.endpoints = Endpoints(
            self.view,
            self.names,
            self.metrics,
            self.leader,
            read_pod=self.read_pod,
            bind_pod=self.bind_pod,
            synced=self.synced,
            forwarder=forwarder,
            scheduler_names=config.scheduler_names,
            require_client_cert=config.tls is not None,
        )
        self.endpoints.add_routes(self.http.app)
        self.metrics.watch_view(
            lambda: self.view.stats(self.endpoints.now()),
            lambda: {"neuronnodes": self.reports.age(), "pods": self.pods.age()},
            lambda: self.leader.leading,
        )
        self.group_health = GroupHealthMonitor(
            self.api,
            self.view,
            self.node_health,
            leading=lambda: self.leader.leading,
            synced=lambda: self.synced() and self.nodes.synced,
            evict=config.evict_degraded_groups,
            identity=config.identity,
        )
        self.metrics.watch_groups(
            self.group_health.degraded,
            lambda: {
                "events": self.group_health.events_sent,
                "evictions": self.group_health.evictions,
                "failures": self.group_health.failures,
            },
        )
        self.metrics.watch_nodes(lambda: (self.view.node(n, self.endpoints.now()) for n in list(self.view.reports)))

    def synced(self) -> bool:
        return self.reports.synced and self.pods.synced

    def ready(self) -> tuple[bool, str]:
        """Ready = listed both sources, and leading or knowing the leader to forward to."""
        waiting = [r.resource.name for r in (self.reports, self.pods) if not r.synced]
        if waiting:
            errors = "; ".join(f"{r.resource.name}: {r.last_error}" for r in (self.reports, self.pods) if r.last_error)
            return False, f"listing {', '.join(waiting)} from the API server" + (f" ({errors})" if errors else "")
        if self.leader.leading:
            role = "leader"
        elif self.leader.leader_url:
            role = f"standby, forwarding to the leader at {self.leader.leader_url}"
        else:
            return False, f"standby: no leader known yet on the lease {self.config.lease}"
        stats = self.view.stats(self.endpoints.now())
        return True, (
            f"{role}; {stats.reports} NeuronNode reports ({stats.stale_reports} stale, {stats.invalid_reports} "
            f"unreadable), {stats.in_flight_pods} pods in flight"
        )

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return await self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    async def bind_pod(self, args: BindingArgs) -> None:
        await self.api.create(
            f"/api/v1/namespaces/{args.pod_namespace}/pods/{args.pod_name}/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                # the UID makes the API server refuse the binding if the pod was replaced meanwhile
                "metadata": {"name": args.pod_name, "namespace": args.pod_namespace, "uid": args.pod_uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
            },
        )

    async def maintain(self) -> None:
        while not await sleep_or_stop(self.stop, MAINTENANCE_INTERVAL):
            for key in self.view.expire_assumed(time.monotonic()):
                log.warning("pod %s was bound by this extender but never seen bound; no longer counted", key)
            self.view.expire_holds(self.endpoints.now())

    async def run(self) -> int:
        return await run_service(self.http, self.supervisor, self.stop, self._started, release=self._release)

    def _started(self) -> dict[str, Loop]:
        """Once serving: the leader advertises the port bound, and the loops start."""
        if isinstance(self.leader, LeaderElector):
            self.leader.url = self.config.advertise_url.replace("{port}", str(self.http.bound_port))
        log.info(
            "serving the scheduler extender",
            extra={
                "address": f"{self.config.listen[0]}:{self.http.bound_port}",
                "resources": ",".join(self.names.all),
                "report_max_age": self.config.report_max_age,
                "leader_elect": self.config.leader_elect,
                "evict_degraded_groups": self.config.evict_degraded_groups,
                "identity": self.config.identity,
                "url": getattr(self.leader, "url", ""),
            },
        )
        loops: dict[str, Loop] = {
            "neuronnodes": lambda: self.reports.run(self.stop),
            "pods": lambda: self.pods.run(self.stop),
            "leader-election": lambda: self.leader.run(self.stop),
            "maintenance": self.maintain,
            "nodes": lambda: self.nodes.run(self.stop),
            "poddisruptionbudgets": lambda: self.budgets.run(self.stop),
            "nominated-pods": lambda: self.nominated.run(self.stop),
            "group-health": lambda: self.group_health.run(self.stop),
        }
        if self.config.tls is not None:
            files = self.config.tls
            loops["tls-reload"] = lambda: tls.reload_on_change(files, self.tls_contexts, self.stop)
        return loops

    async def _release(self) -> None:
        await self.endpoints.forwarder.close()
        await self.api.close()
