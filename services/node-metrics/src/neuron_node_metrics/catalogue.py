"""Every metric family the exporter serves: one place for names, types, labels and meaning.

docs/node-metrics.md's metric table is generated from here (`neuron-node-metrics --list-metrics`), and
a test keeps the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass

ATTRIBUTION = ("namespace", "pod", "container", "claim")


@dataclass(frozen=True)
class Family:
    name: str  # full exposition name (counters end in _total)
    type: str  # counter or gauge
    help: str
    labels: tuple[str, ...]
    neuron_monitor_name: str | None = None  # the name under --naming neuron-monitor, where one exists

    @property
    def base_name(self) -> str:
        """The name prometheus_client's family classes take (without _total)."""
        return self.name.removesuffix("_total") if self.type == "counter" else self.name


_FAMILIES = (
    Family(
        "neuron_core_execution_status_total",
        "counter",
        "Executions a logical NeuronCore finished, by status (stats/status/<status>/total, summed over the "
        "physical cores behind the logical core; older infer_* names are reported under the current ones).",
        ("device", "core", "status", *ATTRIBUTION),
        "execution_status_total",
    ),
    Family(
        "neuron_device_hardware_errors_total",
        "counter",
        "Hardware errors the driver counted on a device's cores, by kind (the hw_* execution statuses), with the "
        "fault table's fault and severity (transient, until-reboot, replace-instance; empty for a status behind "
        "no fault).",
        ("device", "kind", "fault", "severity", *ATTRIBUTION),
    ),
    Family(
        "neuron_device_ecc_errors_total",
        "counter",
        "Uncorrected ECC events on a device (stats/hardware): sram_uncorrected, mem_uncorrected, "
        "mem_repairable_uncorrected, with the fault table's fault and severity.",
        ("device", "type", "fault", "severity", *ATTRIBUTION),
        "hardware_ecc_events_total",
    ),
    Family(
        "neuron_core_memory_used_bytes",
        "gauge",
        "Device memory a logical NeuronCore uses, by category (memory_usage/device_mem/<category>/present).",
        ("device", "core", "category", *ATTRIBUTION),
        "neuroncore_memory_usage_<category>",
    ),
    Family(
        "neuron_device_memory_total_bytes",
        "gauge",
        "Device memory of a Neuron device (the sum of its cores' device_mem totals).",
        ("device",),
    ),
    Family(
        "neuron_device_host_memory_used_bytes",
        "gauge",
        "Host memory the driver holds for a device, by category (memory_usage/host_mem/<category>/present).",
        ("device", "category", *ATTRIBUTION),
    ),
    Family(
        "neuron_device_power_utilization_ratio",
        "gauge",
        "Power utilisation of a device over the driver's last sampling window (stats/power/utilization), "
        "0-1, by stat: min, max, avg. Absent while the driver marks the sample invalid.",
        ("device", "stat"),
    ),
    Family(
        "neuron_device_info",
        "gauge",
        "Always 1: a Neuron device and what it is.",
        ("device", "arch_type", "family", "device_name", "instance_type", "serial", "numa_node"),
        "neuron_hardware_info",
    ),
    Family(
        "neuron_logical_core_config",
        "gauge",
        "Physical NeuronCores per logical NeuronCore on this node (1 or 2).",
        (),
    ),
    Family(
        "neuron_core_allocation_info",
        "gauge",
        "Always 1 for each logical NeuronCore a container holds (as a whole device or as a core).",
        ("device", "core", *ATTRIBUTION),
    ),
    Family(
        "neuron_resource_capacity",
        "gauge",
        "IDs of an extended resource this node's devices imply (neuron: devices, neuroncore: logical cores).",
        ("resource",),
    ),
    Family(
        "neuron_resource_allocatable",
        "gauge",
        "Healthy IDs of an extended resource, per the kubelet's PodResources GetAllocatableResources.",
        ("resource",),
    ),
    Family(
        "neuron_resource_allocated",
        "gauge",
        "IDs of an extended resource held by containers, per the kubelet's PodResources List.",
        ("resource",),
    ),
    Family(
        "neuron_resource_unhealthy",
        "gauge",
        "IDs of an extended resource that exist but are not allocatable (capacity - allocatable).",
        ("resource",),
    ),
)

SELF_FAMILIES = (
    Family("neuron_exporter_scrape_duration_seconds", "gauge", "Time the last scrape took to read and render.", ()),
    Family("neuron_exporter_scrapes_total", "counter", "Scrapes served.", ()),
    Family(
        "neuron_exporter_read_errors_total",
        "counter",
        "sysfs values that could not be read or parsed, by kind (missing, unreadable, malformed, vanished); "
        "the series is skipped, the scrape still answers.",
        ("kind",),
    ),
    Family(
        "neuron_exporter_attribution_age_seconds",
        "gauge",
        "Age of the pod attribution data (time since the last successful PodResources List); -1 before the first.",
        (),
    ),
    Family("neuron_exporter_podresources_up", "gauge", "1 when the last PodResources call succeeded.", ()),
    Family(
        "neuron_exporter_podresources_errors_total",
        "counter",
        "Failed PodResources calls, by gRPC code (RESOURCE_EXHAUSTED is the kubelet's rate limit).",
        ("code",),
    ),
    Family(
        "neuron_exporter_attribution_dropped_containers",
        "gauge",
        "Containers left unattributed because --max-attributed-containers was reached.",
        (),
    ),
    Family("neuron_exporter_build_info", "gauge", "Always 1, with the exporter's version.", ("version",)),
)

FAMILIES: dict[str, Family] = {f.name: f for f in _FAMILIES}
ALL_FAMILIES: dict[str, Family] = {f.name: f for f in (*_FAMILIES, *SELF_FAMILIES)}

# neuron-monitor's execution status types, for --naming neuron-monitor
NEURON_MONITOR_STATUS = {
    "success": "completed",
    "execute_completed_with_error": "completed_with_err",
    "execute_completed_with_num_error": "completed_with_num_err",
    "timeout": "timed_out",
    "exec_bad_input": "incorrect_input",
    "execute_failed_to_queue": "failed_to_queue",
}


def markdown_table() -> str:
    rows = [
        "| Metric | Type | Labels | Meaning | `--naming neuron-monitor` |",
        "|---|---|---|---|---|",
    ]
    for f in ALL_FAMILIES.values():
        labels = ", ".join(f"`{label}`" for label in f.labels) or "-"
        compat = f"`{f.neuron_monitor_name}`" if f.neuron_monitor_name else "-"
        rows.append(f"| `{f.name}` | {f.type} | {labels} | {f.help} | {compat} |")
    return "\n".join(rows)
