"""The extender's Prometheus metrics: request latency per verb, refusals by reason, bindings, and the
state of its view (reports known and stale, pods in flight, age of each source, leadership, what
each node has free as the filter sees it) read at scrape time."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from neuron_common import metrics_auth
from neuron_common.metrics import MetricSet, Series, exposed
from neuron_scheduler_extender.failures import DegradedGroup
from neuron_scheduler_extender.state import NodeState, RefusalKind, ViewStats

PREFIX = "neuron_scheduler_extender"
# kube-scheduler waits `httpTimeout` (5 s by default) for an answer; the target is 20 ms at 1,000 nodes
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
VERBS = ("filter", "prioritize", "bind", "preempt")
# what the preempt verb did with each candidate node kube-scheduler sent
PREEMPTION_RESULTS = ("kept", "changed", "dropped")
BIND_FAILURES = (
    "no_longer_fits",
    "not_leader",
    "not_ready",
    "unknown_pod",
    "api_error",
    "malformed",
    "foreign_scheduler",  # the pod names another scheduler
    "no_neuron_request",  # the pod asks for no Neuron resource: not the extender's to bind
)
# Requests refused before they are read: no client certificate (with TLS), or a body over the limit.
REQUEST_REFUSALS = ("unauthenticated", "too_large")
# The families computed at scrape time (the collectors below): suffix -> (type, labels). The
# collectors take their labels from here and the catalogue its series.
COMPUTED: dict[str, tuple[str, tuple[str, ...]]] = {
    "groups_degraded": ("gauge", ()),
    "group_degraded": ("gauge", ("group", "ultraserver", "nodes")),
    "group_failure_actions": ("counter", ("action",)),
    **dict.fromkeys(
        (
            "reports",
            "reports_stale",
            "reports_invalid",
            "pods_bound",
            "pods_in_flight",
            "pods_assumed",
            "group_reservations",
            "groups_partial",
            "leader",
        ),
        ("gauge", ()),
    ),
    "view_age_seconds": ("gauge", ("source",)),
    "node_cores": ("gauge", ("node",)),
    "node_free_cores": ("gauge", ("node",)),
    "node_free_device_groups": ("gauge", ("node", "size")),
}


def _gauge(suffix: str, documentation: str, value: float | None = None) -> GaugeMetricFamily:
    kind, labels = COMPUTED[suffix]
    assert kind == "gauge", suffix
    if value is not None:
        return GaugeMetricFamily(f"{PREFIX}_{suffix}", documentation, value=value)
    return GaugeMetricFamily(f"{PREFIX}_{suffix}", documentation, labels=labels)


def _counter(suffix: str, documentation: str) -> CounterMetricFamily:
    kind, labels = COMPUTED[suffix]
    assert kind == "counter", suffix
    return CounterMetricFamily(f"{PREFIX}_{suffix}", documentation, labels=labels)


def catalogue() -> tuple[Series, ...]:
    """Every series the extender serves on /metrics (with --metrics-auth=kubernetes, the authorizer's too)."""
    computed = (s for suffix, (kind, labels) in COMPUTED.items() for s in exposed(f"{PREFIX}_{suffix}", kind, labels,
                created=False))  # fmt: skip
    return (*Metrics().series(), *computed, *metrics_auth.catalogue())


class Metrics:
    def __init__(self) -> None:
        m = MetricSet(PREFIX)
        self.registry = m.registry
        self.series = m.series
        self.latency = m.histogram(
            "request_duration_seconds",
            "Time to answer kube-scheduler, per verb",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            shown=VERBS,
        )
        self.errors = m.counter(
            "request_errors_total",
            "Requests answered with an error (malformed, or the pod cannot be read), per verb",
            ["verb"],
            shown=VERBS,
        )
        self.nodes_refused = m.counter(
            "nodes_refused_total", "Nodes the filter refused, by reason class", ["reason"], shown=map(str, RefusalKind)
        )
        self.pods_bound = m.counter("pods_bound_total", "Pods bound to a node by this extender")
        self.preemption_nodes = m.counter(
            "preemption_nodes_total",
            "Candidate nodes of kube-scheduler's preemption, by what the preempt verb did: kept its victims, "
            "changed them to free a valid set, or dropped the node (no valid set would follow)",
            ["result"],
            shown=PREEMPTION_RESULTS,
        )
        self.bind_failures = m.counter(
            "bind_failures_total", "Bindings refused or failed, by reason", ["reason"], shown=BIND_FAILURES
        )
        self.refused_requests = m.counter(
            "refused_requests_total",
            "Requests to the extender verbs refused before being read: without a client certificate "
            "(TLS on) or with a body over the limit, per verb",
            ["verb", "reason"],
            shown=itertools.product(VERBS, REQUEST_REFUSALS),
        )
        self.forwarded = m.counter(
            "forwarded_total",
            "Requests a standby forwarded to the leader: relayed, or failed (then answered by the standby)",
            ["verb", "result"],
            shown=itertools.product(VERBS, ("relayed", "failed")),
        )

    def watch_view(
        self,
        stats: Callable[[], ViewStats],
        source_ages: Callable[[], Mapping[str, float | None]],
        leading: Callable[[], bool],
    ) -> None:
        """Gauges computed at scrape time from the live view."""
        self.registry.register(_ViewCollector(stats, source_ages, leading))

    def watch_nodes(self, nodes: Callable[[], Iterable[NodeState]]) -> None:
        """Per-node gauges computed at scrape time from the nodes' states (refused nodes have none)."""
        self.registry.register(_NodeCollector(nodes))

    def watch_groups(
        self, degraded: Callable[[], Mapping[str, DegradedGroup]], actions: Callable[[], Mapping[str, int]]
    ) -> None:
        """UltraServer groups of pods degraded now (computed at scrape time), and what was done about them."""
        self.registry.register(_GroupCollector(degraded, actions))


class _GroupCollector(Collector):
    def __init__(
        self, degraded: Callable[[], Mapping[str, DegradedGroup]], actions: Callable[[], Mapping[str, int]]
    ) -> None:
        self._degraded, self._actions = degraded, actions

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        groups = self._degraded()
        yield _gauge(
            "groups_degraded",
            "UltraServer groups of pods with a node of their UltraServer unhealthy (NeuronHealth condition, "
            "the problem detector's taint, or unhealthy devices in its report)",
            len(groups),
        )
        info = _gauge(
            "group_degraded", "1 per degraded UltraServer group of pods: its name, its UltraServer, its unhealthy nodes"
        )
        for group in sorted(groups.values(), key=lambda g: g.group.key):
            info.add_metric([group.group.name, group.group.ultraserver, ",".join(f.node for f in group.failures)], 1)
        yield info
        counts = self._actions()
        actions = _counter(
            "group_failure_actions",
            "What the leader did about degraded groups: Events created, pods evicted, API calls that failed",
        )
        for action in ("events", "evictions", "failures"):
            actions.add_metric([action], counts.get(action, 0))
        yield actions


@dataclass(frozen=True, eq=False)  # a collector is registered as itself
class _ViewCollector(Collector):
    stats: Callable[[], ViewStats]
    source_ages: Callable[[], Mapping[str, float | None]]
    leading: Callable[[], bool]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self.stats()
        view = (
            ("reports", "NeuronNode reports known (readable)", s.reports),
            ("reports_stale", "Known reports older than --report-max-age", s.stale_reports),
            ("reports_invalid", "NeuronNode objects that cannot be read", s.invalid_reports),
            ("pods_bound", "Bound, running pods asking for Neuron resources, from the watch", s.bound_pods),
            (
                "pods_in_flight",
                "Pods bound to a node that its report does not list yet, counted as admitted",
                s.in_flight_pods,
            ),
            ("pods_assumed", "Pods this extender bound that the watch has not shown yet", s.assumed_pods),
            (
                "group_reservations",
                "UltraServer groups of nodes held for a group of pods until its pods are bound",
                s.group_reservations,
            ),
            ("groups_partial", "UltraServer groups of pods with some pods bound and some not (yet)", s.groups_partial),
        )
        for name, documentation, value in view:
            yield _gauge(name, documentation, value)
        age = _gauge(
            "view_age_seconds",
            "Seconds since the API server last answered each source (list, event or bookmark); "
            "absent before the first answer",
        )
        for source, seconds in sorted(self.source_ages().items()):
            if seconds is not None:
                age.add_metric([source], seconds)
        yield age
        yield _gauge("leader", "1 while this replica holds the lease (and answers)", int(self.leading()))


class _NodeCollector(Collector):
    def __init__(self, nodes: Callable[[], Iterable[NodeState]]) -> None:
        self._nodes = nodes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        cores = _gauge("node_cores", "NeuronCores of the node's healthy devices, from its report")
        free_cores = _gauge(
            "node_free_cores", "NeuronCores free on the node as the filter sees it: its report, less the pods in flight"
        )
        free_groups = _gauge(
            "node_free_device_groups",
            "Valid connected device groups of `size` devices entirely free on the node, as the filter sees it: "
            "how many pods of that many devices it can still take",
        )
        for state in self._nodes():
            if state.topology is None or state.free is None or state.capacity is None:
                continue
            topo = state.topology
            cores.add_metric([state.node], len(state.capacity.cores))
            free_cores.add_metric([state.node], len(state.free.cores))
            left = dict(state.free.leftover(topo).groups)
            for size in topo.group_masks:
                free_groups.add_metric([state.node, str(size)], left.get(size, 0))
        yield cores
        yield free_cores
        yield free_groups
