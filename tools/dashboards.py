"""Writes the Grafana dashboards into charts/neuron-helm-chart/dashboards/ (`make dashboards`).

Built with Grafana's own typed builders (grafana-foundation-sdk, pinned in constraints.txt), so
what is written is what Grafana's schema describes. The conventions every board follows live in
the few helpers below: a `datasource` variable every query uses, a `node` variable (the chart's
scrape config sets `node` from the pod's node name; the extender labels its per-node series
with it) and `namespace` where pods are shown, `$__rate_interval` for rates, `or vector(0)` where
a series may legitimately not exist yet, uids and panel ids that never change (users link to them).
A test keeps the committed JSON equal to this script's output; others run every panel's query
against a real Prometheus scraping real processes of the components named as the board's `sources`.
Before writing, every series a panel or variable reads is looked up in the catalogues of the board's
`sources` (tools/metric_names.py): a board naming a series they do not serve is not written.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import metric_names
from grafana_foundation_sdk.builders import bargauge, gauge, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders import dashboard as grafana
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard, DataSourceRef, VariableRefresh
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUT = Path(__file__).resolve().parent.parent / "charts" / "neuron-helm-chart" / "dashboards"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
N = 'node=~"$node"'
NS = 'namespace=~"$namespace"'
EXTENDER = "neuron_scheduler_extender"
# neuron-monitor's series (utilization, executions, latency) exist only where the exporter reads it
# (--neuron-monitor-command). There a missing one is a zero (no runtime on a core: idle); elsewhere
# it is unknown, so a panel shows no data rather than a zero: `or 0 * MONITORED`, not `or vector(0)`.
MONITORED = f'max by (node) (neuron_exporter_monitor_state{{{N},state="running"}} == 1)'
UTIL = "neuron_core_utilization_ratio"
LOGICAL_CORES = f'sum by (node) (neuron_resource_capacity{{{N},resource=~".*/neuroncore"}})'
LATENCY = "neuron_runtime_execution_latency_seconds"

PanelBuilder = timeseries.Panel | stat.Panel | gauge.Panel | bargauge.Panel | table.Panel


def query(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    if legend:
        q = q.legend_format(legend)
    if instant:
        q = q.instant().format(PromQueryFormat.TABLE)
    return q


def panel(
    kind: PanelBuilder, title: str, queries: Sequence[prometheus.Dataquery], w: int, h: int, unit: str = ""
) -> PanelBuilder:
    """A panel `w` columns wide and `h` rows high; the board lays panels out left to right, row by row."""
    p = kind.title(title).datasource(DATASOURCE).span(w).height(h)
    for q in queries:
        p = p.with_target(q)
    return p.unit(unit) if unit else p


def node_variable(metric: str) -> grafana.QueryVariable:
    return (
        grafana.QueryVariable("node")
        .label("Node")
        .datasource(DATASOURCE)
        .query({"query": f"label_values({metric}, node)", "refId": "node"})
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
    )


def namespace_variable() -> grafana.QueryVariable:
    return (
        grafana.QueryVariable("namespace")
        .label("Namespace")
        .datasource(DATASOURCE)
        .query({"query": "label_values(neuron_core_allocation_info, namespace)", "refId": "namespace"})
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
    )


def board(
    uid: str,
    title: str,
    panels: Sequence[PanelBuilder],
    *,
    nodes_from: str = "neuron_device_info",
    with_namespace: bool = False,
    extra_variables: Sequence[grafana.TextBoxVariable] = (),
) -> Dashboard:
    """A dashboard with the shared settings and variables; panel ids count from 1 in order, so a
    panel keeps its id (and users' `viewPanel` links) as long as panels are only appended."""
    d = (
        grafana.Dashboard(title)
        .uid(uid)
        .tags(["neuron", "aws"])
        .timezone("browser")
        .editable()
        .refresh("30s")
        .time("now-6h", "now")
        .version(1)
        .with_variable(grafana.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(node_variable(nodes_from))
    )
    if with_namespace:
        d = d.with_variable(namespace_variable())
    for variable in extra_variables:
        d = d.with_variable(variable)
    for number, p in enumerate(panels, start=1):
        d = d.with_panel(p.id(number))
    return d.build()


def node_overview() -> Dashboard:
    return board(
        "neuron-node-overview",
        "Neuron / Node overview",
        [
            panel(stat.Panel(), "Neuron devices", [query(f"count(neuron_device_info{{{N}}})")], 4, 4),
            panel(
                stat.Panel(),
                "Logical NeuronCores",
                [query(f'sum(neuron_resource_capacity{{{N},resource=~".*/neuroncore"}})')],
                4,
                4,
            ),
            panel(
                stat.Panel(),
                "NeuronCores held by pods",
                [query(f"count(neuron_core_allocation_info{{{N}}}) or vector(0)")],
                4,
                4,
            ),
            panel(
                stat.Panel(),
                "Unhealthy devices",
                [query(f'sum(neuron_resource_unhealthy{{{N},resource=~".*/neuron"}}) or vector(0)')],
                4,
                4,
            ),
            panel(
                gauge.Panel(),
                "Device memory used",
                [query(f"sum(neuron_core_memory_used_bytes{{{N}}}) / sum(neuron_device_memory_total_bytes{{{N}}})")],
                4,
                4,
                "percentunit",
            ),
            panel(
                stat.Panel(),
                "Executions / s",
                [query(f'sum(rate(neuron_core_execution_status_total{{{N},status="success"}}[$__rate_interval]))')],
                4,
                4,
                "ops",
            ),
            panel(
                timeseries.Panel(),
                "Executions by status / s",
                [
                    query(
                        f"sum by (status) (rate(neuron_core_execution_status_total{{{N}}}[$__rate_interval]))",
                        "{{status}}",
                    )
                ],
                12,
                8,
                "ops",
            ),
            panel(
                timeseries.Panel(),
                "Device memory used by node",
                [query(f"sum by (node) (neuron_core_memory_used_bytes{{{N}}})", "{{node}}")],
                12,
                8,
                "bytes",
            ),
            panel(table.Panel(), "Devices", [query(f"neuron_device_info{{{N}}}", instant=True)], 16, 8),
            panel(
                table.Panel(),
                "Exporter",
                [
                    query(f"neuron_exporter_podresources_up{{{N}}}", "PodResources up", "A", instant=True),
                    query(f"neuron_exporter_scrape_duration_seconds{{{N}}}", "scrape seconds", "B", instant=True),
                    query(f"neuron_logical_core_config{{{N}}}", "logical core config", "C", instant=True),
                ],
                8,
                8,
            ),
            # From neuron-monitor (no data on nodes where the exporter does not read it).
            panel(
                gauge.Panel(),
                "NeuronCore utilization (neuron-monitor)",
                [
                    query(
                        f"(sum({UTIL}{{{N}}}) or 0 * sum({MONITORED})) / sum({LOGICAL_CORES} and on (node) {MONITORED})"
                    )
                ],
                6,
                4,
                "percentunit",
            ),
            panel(
                stat.Panel(),
                "Runtime executions / s",
                [query(f"sum(rate(neuron_runtime_executions_total{{{N}}}[$__rate_interval])) or 0 * sum({MONITORED})")],
                6,
                4,
                "ops",
            ),
            panel(
                stat.Panel(),
                "Runtime execution errors (1 h)",
                [query(f"sum(increase(neuron_runtime_execution_errors_total{{{N}}}[1h])) or 0 * sum({MONITORED})")],
                6,
                4,
            ),
            panel(
                stat.Panel(),
                "Execution latency p99 (slowest runtime)",
                [query(f'max({LATENCY}{{{N},latency="total",quantile="0.99"}})')],
                6,
                4,
                "s",
            ),
            panel(
                timeseries.Panel(),
                "NeuronCore utilization by node",
                [query(f"(sum by (node) ({UTIL}{{{N}}}) or 0 * {MONITORED}) / on (node) {LOGICAL_CORES}", "{{node}}")],
                12,
                8,
                "percentunit",
            ),
            panel(
                timeseries.Panel(),
                "Execution latency by node (slowest runtime)",
                [
                    query(
                        f'max by (node) ({LATENCY}{{{N},latency="total",quantile="{q}"}})',
                        f"{{{{node}}}} p{round(float(q) * 100)}",
                        ref,
                    )
                    for q, ref in (("0.5", "A"), ("0.99", "B"))
                ],
                12,
                8,
                "s",
            ),
            panel(
                timeseries.Panel(),
                "Runtime executions / s by status",
                [
                    query(
                        f"sum by (status) (rate(neuron_runtime_executions_total{{{N}}}[$__rate_interval]))",
                        "{{status}}",
                    )
                ],
                12,
                8,
                "ops",
            ),
            panel(
                timeseries.Panel(),
                "Runtime execution errors / s by node and type",
                [
                    query(
                        f"sum by (node, type) (rate(neuron_runtime_execution_errors_total{{{N}}}[$__rate_interval]))",
                        "{{node}} {{type}}",
                    )
                ],
                12,
                8,
                "ops",
            ),
        ],
    )


def devices_and_cores() -> Dashboard:
    return board(
        "neuron-devices-cores",
        "Neuron / Devices and cores",
        [
            panel(
                timeseries.Panel(),
                "Device memory used by device",
                [query(f"sum by (node, device) (neuron_core_memory_used_bytes{{{N}}})", "{{node}} neuron{{device}}")],
                12,
                8,
                "bytes",
            ),
            panel(
                timeseries.Panel(),
                "Device memory by category",
                [query(f"sum by (category) (neuron_core_memory_used_bytes{{{N}}})", "{{category}}")],
                12,
                8,
                "bytes",
            ),
            panel(
                timeseries.Panel(),
                "Executions / s by core",
                [
                    query(
                        f'sum by (node, core) (rate(neuron_core_execution_status_total{{{N},status="success"}}[$__rate_interval]))',
                        "{{node}} core {{core}}",
                    )
                ],
                12,
                8,
                "ops",
            ),
            panel(
                timeseries.Panel(),
                "Failed executions / s by status",
                [
                    query(
                        f'sum by (status) (rate(neuron_core_execution_status_total{{{N},status!="success"}}[$__rate_interval]))',
                        "{{status}}",
                    )
                ],
                12,
                8,
                "ops",
            ),
            panel(
                timeseries.Panel(),
                "Power utilisation (avg)",
                [query(f'neuron_device_power_utilization_ratio{{{N},stat="avg"}}', "{{node}} neuron{{device}}")],
                12,
                8,
                "percentunit",
            ),
            panel(
                timeseries.Panel(),
                "Host memory held by the driver",
                [query(f"sum by (category) (neuron_device_host_memory_used_bytes{{{N}}})", "{{category}}")],
                12,
                8,
                "bytes",
            ),
            # From neuron-monitor: a core no runtime reports on counts as idle where it runs.
            panel(
                timeseries.Panel(),
                "NeuronCore utilization by device",
                [
                    query(
                        f"(sum by (node, device) ({UTIL}{{{N}}})"
                        f" or 0 * (max by (node, device) (neuron_device_info{{{N}}}) and on (node) {MONITORED}))"
                        f" / on (node) group_left () ({LOGICAL_CORES} / count by (node) (neuron_device_info{{{N}}}))",
                        "{{node}} neuron{{device}}",
                    )
                ],
                12,
                8,
                "percentunit",
            ),
            panel(
                timeseries.Panel(),
                "NeuronCore utilization by core (cores a runtime uses)",
                [query(f"max by (node, device, core) ({UTIL}{{{N}}})", "{{node}} neuron{{device}} core {{core}}")],
                12,
                8,
                "percentunit",
            ),
        ],
    )


def pods_and_namespaces() -> Dashboard:
    return board(
        "neuron-pods",
        "Neuron / Pods and namespaces",
        [
            panel(
                bargauge.Panel(),
                "NeuronCores held by namespace",
                [query(f"count by (namespace) (neuron_core_allocation_info{{{N},{NS}}})", "{{namespace}}")],
                12,
                8,
            ),
            panel(
                table.Panel(),
                "NeuronCores held by pod",
                [
                    query(
                        f"count by (namespace, pod, container) (neuron_core_allocation_info{{{N},{NS}}})", instant=True
                    )
                ],
                12,
                8,
            ),
            panel(
                timeseries.Panel(),
                "Device memory used by pod",
                [
                    query(
                        f'sum by (namespace, pod) (neuron_core_memory_used_bytes{{{N},{NS},pod!=""}})',
                        "{{namespace}}/{{pod}}",
                    )
                ],
                12,
                8,
                "bytes",
            ),
            panel(
                timeseries.Panel(),
                "Executions / s by pod",
                [
                    query(
                        f'sum by (namespace, pod) (rate(neuron_core_execution_status_total{{{N},{NS},pod!="",status="success"}}[$__rate_interval]))',
                        "{{namespace}}/{{pod}}",
                    )
                ],
                12,
                8,
                "ops",
            ),
            panel(
                timeseries.Panel(),
                "Failed executions / s by pod",
                [
                    query(
                        f'sum by (namespace, pod) (rate(neuron_core_execution_status_total{{{N},{NS},pod!="",status!="success"}}[$__rate_interval]))',
                        "{{namespace}}/{{pod}}",
                    )
                ],
                12,
                8,
                "ops",
            ),
            panel(
                timeseries.Panel(),
                "Hardware errors by pod (1 h)",
                [
                    query(
                        f'sum by (namespace, pod) (increase(neuron_device_hardware_errors_total{{{N},{NS},pod!=""}}[1h])) or vector(0)',
                        "{{namespace}}/{{pod}}",
                    )
                ],
                12,
                8,
            ),
            # From neuron-monitor: the pod's share of busy time over the cores it holds (a held core
            # no runtime reports on is idle where neuron-monitor runs).
            panel(
                timeseries.Panel(),
                "NeuronCore utilization by pod",
                [
                    query(
                        f'(sum by (node, namespace, pod) ({UTIL}{{{N},{NS},pod!=""}})'
                        f' or 0 * count by (node, namespace, pod) (neuron_core_allocation_info{{{N},{NS},pod!=""}}'
                        f" and on (node) {MONITORED}))"
                        f' / count by (node, namespace, pod) (neuron_core_allocation_info{{{N},{NS},pod!=""}})',
                        "{{namespace}}/{{pod}}",
                    )
                ],
                12,
                8,
                "percentunit",
            ),
            panel(
                timeseries.Panel(),
                "Execution latency by pod (slowest runtime)",
                [
                    query(
                        f'max by (namespace, pod) ({LATENCY}{{{N},{NS},pod!="",latency="total",quantile="{q}"}})',
                        f"{{{{namespace}}}}/{{{{pod}}}} p{round(float(q) * 100)}",
                        ref,
                    )
                    for q, ref in (("0.5", "A"), ("0.99", "B"))
                ],
                12,
                8,
                "s",
            ),
            panel(
                timeseries.Panel(),
                "Runtime executions / s by pod and status",
                [
                    query(
                        f'sum by (namespace, pod, status) (rate(neuron_runtime_executions_total{{{N},{NS},pod!=""}}[$__rate_interval]))',
                        "{{namespace}}/{{pod}} {{status}}",
                    )
                ],
                12,
                8,
                "ops",
            ),
            panel(
                timeseries.Panel(),
                "Runtime execution errors / s by pod and type",
                [
                    query(
                        f'sum by (namespace, pod, type) (rate(neuron_runtime_execution_errors_total{{{N},{NS},pod!=""}}[$__rate_interval]))',
                        "{{namespace}}/{{pod}} {{type}}",
                    )
                ],
                12,
                8,
                "ops",
            ),
        ],
        with_namespace=True,
    )


def hardware_errors() -> Dashboard:
    return board(
        "neuron-hardware-errors",
        "Neuron / Hardware errors",
        [
            panel(
                stat.Panel(),
                "Uncorrectable ECC events (24 h)",
                [
                    query(
                        f'sum(increase(neuron_device_ecc_errors_total{{{N},type=~"sram_uncorrected|mem_uncorrected"}}[24h])) or vector(0)'
                    )
                ],
                6,
                4,
            ),
            panel(
                stat.Panel(),
                "Hardware errors (24 h)",
                [query(f"sum(increase(neuron_device_hardware_errors_total{{{N}}}[24h])) or vector(0)")],
                6,
                4,
            ),
            panel(
                stat.Panel(),
                "Unhealthy device IDs",
                [query(f"sum(neuron_resource_unhealthy{{{N}}}) or vector(0)")],
                6,
                4,
            ),
            panel(
                stat.Panel(),
                "Attribution age",
                [query(f"max(neuron_exporter_attribution_age_seconds{{{N}}})")],
                6,
                4,
                "s",
            ),
            panel(
                timeseries.Panel(),
                "ECC events by device and type",
                [
                    query(
                        f"sum by (node, device, type) (increase(neuron_device_ecc_errors_total{{{N}}}[$__rate_interval]))",
                        "{{node}} neuron{{device}} {{type}}",
                    )
                ],
                12,
                8,
            ),
            panel(
                timeseries.Panel(),
                "Corrected ECC events / h by device and type (driver 2.30.2+)",
                [
                    query(
                        f"sum by (node, device, type) (increase(neuron_device_ecc_corrected_errors_total{{{N}}}[1h]))",
                        "{{node}} neuron{{device}} {{type}}",
                    )
                ],
                12,
                8,
            ),
            panel(
                timeseries.Panel(),
                "Hardware errors by device and kind",
                [
                    query(
                        f"sum by (node, device, kind) (increase(neuron_device_hardware_errors_total{{{N}}}[$__rate_interval]))",
                        "{{node}} neuron{{device}} {{kind}}",
                    )
                ],
                12,
                8,
            ),
            panel(
                table.Panel(),
                "Devices with errors (24 h)",
                [
                    query(
                        f"sum by (node, device) (increase(neuron_device_ecc_errors_total{{{N}}}[24h])) "
                        f"+ on (node, device) sum by (node, device) (increase(neuron_device_hardware_errors_total{{{N}}}[24h]))",
                        instant=True,
                    )
                ],
                12,
                8,
            ),
            panel(
                timeseries.Panel(),
                "Exporter read errors / s",
                [
                    query(
                        f"sum by (kind) (rate(neuron_exporter_read_errors_total{{{N}}}[$__rate_interval])) or vector(0)",
                        "{{kind}}",
                    )
                ],
                12,
                8,
            ),
        ],
    )


def latency(verb: str) -> list[prometheus.Dataquery]:
    """Quantiles of the extender's answers to one verb, over every replica (what kube-scheduler waits for)."""
    buckets = f'sum by (le) (rate({EXTENDER}_request_duration_seconds_bucket{{verb="{verb}"}}[$__rate_interval]))'
    return [
        query(f"histogram_quantile({q}, {buckets})", f"p{round(q * 100)}", ref)
        for q, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))
    ]


def scheduling() -> Dashboard:
    """The scheduler extender (neuron-scheduler's filter, prioritize and bind), and the pods
    neuron-scheduler holds back, from its own kube-scheduler metrics (selected by profile: the
    scheduler's scrape job is the user's). Gauges of the extender's view are taken with `max`:
    every replica keeps the same view, only the leader decides."""
    attempts = 'scheduler_schedule_attempts_total{profile="$profile"}'

    return board(
        "neuron-scheduling",
        "Neuron / Scheduling",
        [
            panel(stat.Panel(), "Leading replicas", [query(f"sum({EXTENDER}_leader)")], 4, 4),
            panel(stat.Panel(), "NeuronNode reports", [query(f"max({EXTENDER}_reports)")], 4, 4),
            panel(
                stat.Panel(),
                "Reports stale or unreadable",
                [query(f"max({EXTENDER}_reports_stale) + max({EXTENDER}_reports_invalid)")],
                4,
                4,
            ),
            panel(stat.Panel(), "Neuron pods running", [query(f"max({EXTENDER}_pods_bound)")], 4, 4),
            panel(
                stat.Panel(),
                "Pods bound, not admitted yet",
                [query(f"max({EXTENDER}_pods_in_flight) + max({EXTENDER}_pods_assumed)")],
                4,
                4,
            ),
            panel(
                stat.Panel(),
                "Oldest view of the API server",
                [query(f"max({EXTENDER}_view_age_seconds)")],
                4,
                4,
                "s",
            ),
            panel(timeseries.Panel(), "Filter latency", latency("filter"), 8, 8, "s"),
            panel(timeseries.Panel(), "Prioritize latency", latency("prioritize"), 8, 8, "s"),
            panel(timeseries.Panel(), "Bind latency", latency("bind"), 8, 8, "s"),
            panel(
                timeseries.Panel(),
                "Pods waiting in neuron-scheduler, by queue",
                # scheduler_pending_pods has no profile label: the processes that run the profile
                [query(f"sum by (queue) (scheduler_pending_pods and on (job, instance) {attempts})", "{{queue}}")],
                8,
                8,
            ),
            panel(
                timeseries.Panel(),
                "Pods unschedulable, by plugin (Extender: refused by the extender)",
                [
                    query(
                        'sum by (plugin) (scheduler_unschedulable_pods{profile="$profile"}) or vector(0)',
                        "{{plugin}}",
                    )
                ],
                8,
                8,
            ),
            panel(
                timeseries.Panel(),
                "Scheduling attempts / s by result",
                [query(f"sum by (result) (rate({attempts}[$__rate_interval]))", "{{result}}")],
                8,
                8,
                "ops",
            ),
            panel(
                timeseries.Panel(),
                "Nodes refused / s by reason",
                [query(f"sum by (reason) (rate({EXTENDER}_nodes_refused_total[$__rate_interval]))", "{{reason}}")],
                12,
                8,
                "ops",
            ),
            panel(
                timeseries.Panel(),
                "Pods bound / s, and bindings refused by reason",
                [
                    query(f"sum(rate({EXTENDER}_pods_bound_total[$__rate_interval]))", "bound", "A"),
                    query(
                        f"sum by (reason) (rate({EXTENDER}_bind_failures_total[$__rate_interval]))",
                        "refused: {{reason}}",
                        "B",
                    ),
                ],
                12,
                8,
                "ops",
            ),
            panel(
                timeseries.Panel(),
                "Requests / s by verb, and errors",
                [
                    query(
                        f"sum by (verb) (rate({EXTENDER}_request_duration_seconds_count[$__rate_interval]))",
                        "{{verb}}",
                        "A",
                    ),
                    query(
                        f"sum by (verb) (rate({EXTENDER}_request_errors_total[$__rate_interval]))",
                        "{{verb}} errors",
                        "B",
                    ),
                ],
                12,
                8,
                "ops",
            ),
            panel(
                timeseries.Panel(),
                "Requests forwarded to the leader / s",
                [
                    query(
                        f"sum by (verb, result) (rate({EXTENDER}_forwarded_total[$__rate_interval]))",
                        "{{verb}} {{result}}",
                    )
                ],
                12,
                8,
                "ops",
            ),
            panel(
                timeseries.Panel(),
                "Free NeuronCores by node",
                [query(f"max by (node) ({EXTENDER}_node_free_cores{{{N}}})", "{{node}}")],
                12,
                8,
            ),
            panel(
                bargauge.Panel(),
                "Free connected device groups, by size",
                [
                    query(
                        f"sum by (size) (max by (node, size) ({EXTENDER}_node_free_device_groups{{{N}}}))",
                        "{{size}} devices",
                    )
                ],
                12,
                8,
            ),
            panel(
                table.Panel(),
                "Free connected device groups per node",
                [query(f"max by (node, size) ({EXTENDER}_node_free_device_groups{{{N}}})", instant=True)],
                24,
                8,
            ),
            panel(
                timeseries.Panel(),
                "UltraServer groups: UltraServers held for a group, groups partly bound, groups degraded "
                "(a node of their UltraServer unhealthy)",
                [
                    query(f"max({EXTENDER}_group_reservations)", "held", "A"),
                    query(f"max({EXTENDER}_groups_partial)", "partly bound", "B"),
                    query(f"max({EXTENDER}_groups_degraded)", "degraded", "C"),
                ],
                24,
                8,
            ),
        ],
        nodes_from=f"{EXTENDER}_node_cores",
        extra_variables=[
            grafana.TextBoxVariable("profile")
            .label("Scheduler profile")
            .description("neuron-scheduler's profile: the chart's scheduler.schedulerName")
            .default_value("neuron-scheduler")
        ],
    )


def dra() -> Dashboard:
    """The DRA driver (its metrics contract: prepare/unprepare latency, prepared claims, published
    devices and cores, unhealthy devices, ResourceSlice updates)."""
    return board(
        "neuron-dra",
        "Neuron / Dynamic resource allocation",
        [
            panel(
                stat.Panel(),
                "Prepared claims",
                [query(f"sum(neuron_dra_prepared_claims{{{N}}}) or vector(0)")],
                6,
                4,
            ),
            panel(
                stat.Panel(),
                "Devices published",
                [query(f'sum(neuron_dra_published_devices{{{N},kind="device"}})')],
                6,
                4,
            ),
            panel(
                stat.Panel(),
                "Cores published",
                [query(f'sum(neuron_dra_published_devices{{{N},kind="core"}})')],
                6,
                4,
            ),
            panel(
                stat.Panel(),
                "Unhealthy devices",
                [query(f"sum(neuron_dra_unhealthy_devices{{{N}}}) or vector(0)")],
                6,
                4,
            ),
            panel(
                timeseries.Panel(),
                "Prepare latency",
                [
                    query(
                        f'histogram_quantile({q}, sum by (le) (rate(neuron_dra_prepare_duration_seconds_bucket{{{N},operation="prepare"}}[$__rate_interval])))',
                        f"p{round(q * 100)}",
                        ref,
                    )
                    for q, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))
                ],
                12,
                8,
                "s",
            ),
            panel(
                timeseries.Panel(),
                "Unprepare latency",
                [
                    query(
                        f'histogram_quantile({q}, sum by (le) (rate(neuron_dra_prepare_duration_seconds_bucket{{{N},operation="unprepare"}}[$__rate_interval])))',
                        f"p{round(q * 100)}",
                        ref,
                    )
                    for q, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))
                ],
                12,
                8,
                "s",
            ),
            panel(
                timeseries.Panel(),
                "Prepared claims by node",
                [query(f"sum by (node) (neuron_dra_prepared_claims{{{N}}})", "{{node}}")],
                12,
                8,
            ),
            panel(
                timeseries.Panel(),
                "ResourceSlice updates / s by node",
                [query(f"sum by (node) (rate(neuron_dra_slice_updates_total{{{N}}}[$__rate_interval]))", "{{node}}")],
                12,
                8,
                "ops",
            ),
        ],
        nodes_from="neuron_dra_published_devices",
    )


@dataclass(frozen=True)
class Board:
    build: Callable[[], Dashboard]
    # The components whose /metrics serve every series the panels read (their scrape jobs in the
    # tests); a board no test checks against real processes of all of them fails the tests.
    sources: frozenset[str]


NODE_METRICS = "neuron-node-metrics"
SCHEDULER_EXTENDER = "neuron-scheduler-extender"
KUBE_SCHEDULER = "kube-scheduler"  # neuron-scheduler, the chart's second kube-scheduler
DRA_DRIVER = "neuron-dra-driver"

# Every board the chart ships, by file name. Register a board here only once a test runs real
# processes of all its `sources` under a real Prometheus (tests/prometheus_server.py: TESTED_SOURCES);
# a board over an optional component ships with it only (the chart's $shippedWith,
# templates/node-metrics/dashboards.yaml).
BOARDS: dict[str, Board] = {
    "neuron-node-overview.json": Board(node_overview, frozenset({NODE_METRICS})),
    "neuron-devices-cores.json": Board(devices_and_cores, frozenset({NODE_METRICS})),
    "neuron-pods.json": Board(pods_and_namespaces, frozenset({NODE_METRICS})),
    "neuron-hardware-errors.json": Board(hardware_errors, frozenset({NODE_METRICS})),
    "neuron-scheduling.json": Board(scheduling, frozenset({SCHEDULER_EXTENDER, KUBE_SCHEDULER})),
    "neuron-dra.json": Board(dra, frozenset({DRA_DRIVER})),
}


def render(build: Callable[[], Dashboard]) -> str:
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def unserved(name: str, text: str) -> list[str]:
    """What the board `name` (its JSON `text`) reads that its sources do not serve."""
    board = json.loads(text)
    exprs = [
        (f"{name} {p['title']}", metric_names.grafana_concrete(t["expr"]))
        for p in board["panels"]
        for t in p["targets"]
    ]
    for variable in board.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            exprs.append((f"{name} variable {variable['name']}", variable["query"]["query"]))
    return metric_names.problems(exprs, BOARDS[name].sources, metric_names.catalogues())


def main() -> int:
    rendered = {name: render(entry.build) for name, entry in BOARDS.items()}
    wrong = [problem for name, text in rendered.items() for problem in unserved(name, text)]
    if wrong:
        print("not written: the boards read series their sources do not serve:", *wrong, sep="\n  ", file=sys.stderr)
        return 1
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (OUT / name).write_text(text)
    stale = sorted(p.name for p in OUT.glob("*.json") if p.name not in BOARDS)
    for name in stale:
        (OUT / name).unlink()
    print(f"wrote {len(BOARDS)} dashboards to {OUT}" + (f", removed {', '.join(stale)}" if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
