"""Writes the Grafana dashboards into charts/neuron-helm-chart/dashboards/ (`make dashboards`).

Dashboards are generated so every panel follows the same conventions: the `node` and
`namespace` variables (the chart's scrape config sets `node` from the pod's node name),
`$__rate_interval` for rates, `or vector(0)` where a series may legitimately not exist yet.
A test keeps the committed JSON equal to this script's output, and another runs every
panel's query against a real Prometheus scraping the exporter.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "charts" / "neuron-helm-chart" / "dashboards"
N = 'node=~"$node"'
NS = 'namespace=~"$namespace"'


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {"datasource": {"type": "prometheus", "uid": "${datasource}"}, "expr": expr, "refId": ref}
    if legend:
        t["legendFormat"] = legend
    if instant:
        t["instant"] = True
        t["format"] = "table"
    return t


def panel(
    kind: str, title: str, targets: list[dict[str, Any]], x: int, y: int, w: int, h: int, unit: str = ""
) -> dict[str, Any]:
    p: dict[str, Any] = {
        "type": kind,
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit} if unit else {}, "overrides": []},
        "options": {},
    }
    return p


def variables(with_namespace: bool) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source", "current": {}},
        {
            "name": "node",
            "label": "Node",
            "type": "query",
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": "label_values(neuron_device_info, node)", "refId": "node"},
            "definition": "label_values(neuron_device_info, node)",
            "multi": True,
            "includeAll": True,
            "allValue": ".*",
            "refresh": 2,
            "current": {},
        },
    ]
    if with_namespace:
        result.append(
            {
                "name": "namespace",
                "label": "Namespace",
                "type": "query",
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "query": {"query": "label_values(neuron_core_allocation_info, namespace)", "refId": "namespace"},
                "definition": "label_values(neuron_core_allocation_info, namespace)",
                "multi": True,
                "includeAll": True,
                "allValue": ".*",
                "refresh": 2,
                "current": {},
            }
        )
    return result


def dashboard(uid: str, title: str, panels: list[dict[str, Any]], with_namespace: bool = False) -> dict[str, Any]:
    for i, p in enumerate(panels, start=1):
        p["id"] = i
    return {
        "uid": uid,
        "title": title,
        "tags": ["neuron", "aws"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": variables(with_namespace)},
        "annotations": {"list": []},
        "panels": panels,
    }


def node_overview() -> dict[str, Any]:
    return dashboard(
        "neuron-node-overview",
        "Neuron / Node overview",
        [
            panel("stat", "Neuron devices", [target(f"count(neuron_device_info{{{N}}})")], 0, 0, 4, 4),
            panel(
                "stat",
                "Logical NeuronCores",
                [target(f'sum(neuron_resource_capacity{{{N},resource=~".*/neuroncore"}})')],
                4,
                0,
                4,
                4,
            ),
            panel(
                "stat",
                "NeuronCores held by pods",
                [target(f"count(neuron_core_allocation_info{{{N}}}) or vector(0)")],
                8,
                0,
                4,
                4,
            ),
            panel(
                "stat",
                "Unhealthy devices",
                [target(f'sum(neuron_resource_unhealthy{{{N},resource=~".*/neuron"}}) or vector(0)')],
                12,
                0,
                4,
                4,
            ),
            panel(
                "gauge",
                "Device memory used",
                [target(f"sum(neuron_core_memory_used_bytes{{{N}}}) / sum(neuron_device_memory_total_bytes{{{N}}})")],
                16,
                0,
                4,
                4,
                "percentunit",
            ),
            panel(
                "stat",
                "Executions / s",
                [target(f'sum(rate(neuron_core_execution_status_total{{{N},status="success"}}[$__rate_interval]))')],
                20,
                0,
                4,
                4,
                "ops",
            ),
            panel(
                "timeseries",
                "Executions by status / s",
                [
                    target(
                        f"sum by (status) (rate(neuron_core_execution_status_total{{{N}}}[$__rate_interval]))",
                        "{{status}}",
                    )
                ],
                0,
                4,
                12,
                8,
                "ops",
            ),
            panel(
                "timeseries",
                "Device memory used by node",
                [target(f"sum by (node) (neuron_core_memory_used_bytes{{{N}}})", "{{node}}")],
                12,
                4,
                12,
                8,
                "bytes",
            ),
            panel("table", "Devices", [target(f"neuron_device_info{{{N}}}", instant=True)], 0, 12, 16, 8),
            panel(
                "table",
                "Exporter",
                [
                    target(f"neuron_exporter_podresources_up{{{N}}}", "PodResources up", "A", instant=True),
                    target(f"neuron_exporter_scrape_duration_seconds{{{N}}}", "scrape seconds", "B", instant=True),
                    target(f"neuron_logical_core_config{{{N}}}", "logical core config", "C", instant=True),
                ],
                16,
                12,
                8,
                8,
            ),
        ],
    )


def devices_and_cores() -> dict[str, Any]:
    return dashboard(
        "neuron-devices-cores",
        "Neuron / Devices and cores",
        [
            panel(
                "timeseries",
                "Device memory used by device",
                [target(f"sum by (node, device) (neuron_core_memory_used_bytes{{{N}}})", "{{node}} neuron{{device}}")],
                0,
                0,
                12,
                8,
                "bytes",
            ),
            panel(
                "timeseries",
                "Device memory by category",
                [target(f"sum by (category) (neuron_core_memory_used_bytes{{{N}}})", "{{category}}")],
                12,
                0,
                12,
                8,
                "bytes",
            ),
            panel(
                "timeseries",
                "Executions / s by core",
                [
                    target(
                        f'sum by (node, core) (rate(neuron_core_execution_status_total{{{N},status="success"}}[$__rate_interval]))',
                        "{{node}} core {{core}}",
                    )
                ],
                0,
                8,
                12,
                8,
                "ops",
            ),
            panel(
                "timeseries",
                "Failed executions / s by status",
                [
                    target(
                        f'sum by (status) (rate(neuron_core_execution_status_total{{{N},status!="success"}}[$__rate_interval]))',
                        "{{status}}",
                    )
                ],
                12,
                8,
                12,
                8,
                "ops",
            ),
            panel(
                "timeseries",
                "Power utilisation (avg)",
                [target(f'neuron_device_power_utilization_ratio{{{N},stat="avg"}}', "{{node}} neuron{{device}}")],
                0,
                16,
                12,
                8,
                "percentunit",
            ),
            panel(
                "timeseries",
                "Host memory held by the driver",
                [target(f"sum by (category) (neuron_device_host_memory_used_bytes{{{N}}})", "{{category}}")],
                12,
                16,
                12,
                8,
                "bytes",
            ),
        ],
    )


def pods_and_namespaces() -> dict[str, Any]:
    return dashboard(
        "neuron-pods",
        "Neuron / Pods and namespaces",
        [
            panel(
                "bargauge",
                "NeuronCores held by namespace",
                [target(f"count by (namespace) (neuron_core_allocation_info{{{N},{NS}}})", "{{namespace}}")],
                0,
                0,
                12,
                8,
            ),
            panel(
                "table",
                "NeuronCores held by pod",
                [
                    target(
                        f"count by (namespace, pod, container) (neuron_core_allocation_info{{{N},{NS}}})", instant=True
                    )
                ],
                12,
                0,
                12,
                8,
            ),
            panel(
                "timeseries",
                "Device memory used by pod",
                [
                    target(
                        f'sum by (namespace, pod) (neuron_core_memory_used_bytes{{{N},{NS},pod!=""}})',
                        "{{namespace}}/{{pod}}",
                    )
                ],
                0,
                8,
                12,
                8,
                "bytes",
            ),
            panel(
                "timeseries",
                "Executions / s by pod",
                [
                    target(
                        f'sum by (namespace, pod) (rate(neuron_core_execution_status_total{{{N},{NS},pod!="",status="success"}}[$__rate_interval]))',
                        "{{namespace}}/{{pod}}",
                    )
                ],
                12,
                8,
                12,
                8,
                "ops",
            ),
            panel(
                "timeseries",
                "Failed executions / s by pod",
                [
                    target(
                        f'sum by (namespace, pod) (rate(neuron_core_execution_status_total{{{N},{NS},pod!="",status!="success"}}[$__rate_interval]))',
                        "{{namespace}}/{{pod}}",
                    )
                ],
                0,
                16,
                12,
                8,
                "ops",
            ),
            panel(
                "timeseries",
                "Hardware errors by pod (1 h)",
                [
                    target(
                        f'sum by (namespace, pod) (increase(neuron_device_hardware_errors_total{{{N},{NS},pod!=""}}[1h])) or vector(0)',
                        "{{namespace}}/{{pod}}",
                    )
                ],
                12,
                16,
                12,
                8,
            ),
        ],
        with_namespace=True,
    )


def hardware_errors() -> dict[str, Any]:
    return dashboard(
        "neuron-hardware-errors",
        "Neuron / Hardware errors",
        [
            panel(
                "stat",
                "Uncorrectable ECC events (24 h)",
                [
                    target(
                        f'sum(increase(neuron_device_ecc_errors_total{{{N},type=~"sram_uncorrected|mem_uncorrected"}}[24h])) or vector(0)'
                    )
                ],
                0,
                0,
                6,
                4,
            ),
            panel(
                "stat",
                "Hardware errors (24 h)",
                [target(f"sum(increase(neuron_device_hardware_errors_total{{{N}}}[24h])) or vector(0)")],
                6,
                0,
                6,
                4,
            ),
            panel(
                "stat",
                "Unhealthy device IDs",
                [target(f"sum(neuron_resource_unhealthy{{{N}}}) or vector(0)")],
                12,
                0,
                6,
                4,
            ),
            panel(
                "stat",
                "Attribution age",
                [target(f"max(neuron_exporter_attribution_age_seconds{{{N}}})")],
                18,
                0,
                6,
                4,
                "s",
            ),
            panel(
                "timeseries",
                "ECC events by device and type",
                [
                    target(
                        f"sum by (node, device, type) (increase(neuron_device_ecc_errors_total{{{N}}}[$__rate_interval]))",
                        "{{node}} neuron{{device}} {{type}}",
                    )
                ],
                0,
                4,
                12,
                8,
            ),
            panel(
                "timeseries",
                "Hardware errors by device and kind",
                [
                    target(
                        f"sum by (node, device, kind) (increase(neuron_device_hardware_errors_total{{{N}}}[$__rate_interval]))",
                        "{{node}} neuron{{device}} {{kind}}",
                    )
                ],
                12,
                4,
                12,
                8,
            ),
            panel(
                "table",
                "Devices with errors (24 h)",
                [
                    target(
                        f"sum by (node, device) (increase(neuron_device_ecc_errors_total{{{N}}}[24h])) "
                        f"+ on (node, device) sum by (node, device) (increase(neuron_device_hardware_errors_total{{{N}}}[24h]))",
                        instant=True,
                    )
                ],
                0,
                12,
                12,
                8,
            ),
            panel(
                "timeseries",
                "Exporter read errors / s",
                [
                    target(
                        f"sum by (kind) (rate(neuron_exporter_read_errors_total{{{N}}}[$__rate_interval])) or vector(0)",
                        "{{kind}}",
                    )
                ],
                12,
                12,
                12,
                8,
            ),
        ],
    )


DASHBOARDS = {
    "neuron-node-overview.json": node_overview,
    "neuron-devices-cores.json": devices_and_cores,
    "neuron-pods.json": pods_and_namespaces,
    "neuron-hardware-errors.json": hardware_errors,
}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, build in DASHBOARDS.items():
        (OUT / name).write_text(render(build))
    print(f"wrote {len(DASHBOARDS)} dashboards to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
