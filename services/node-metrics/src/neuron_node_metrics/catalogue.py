"""Every metric family the exporter serves: one place for names, types, labels and meaning.

docs/node-metrics.md's metric table is generated from here (`neuron-node-metrics --list-metrics`), and
a test keeps the two equal. `series()` is the exporter's catalogue as Prometheus sees it, in every
naming: tests/test_metric_names.py holds the chart's rules and dashboards to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from neuron_common import metrics_auth
from neuron_common.metrics import Series, exposed
from neuron_driver.layout import DEVICE_MEM_CATEGORIES
from neuron_health import layout_check

ATTRIBUTION = ("namespace", "pod", "container", "claim")
FIRMWARE_UNHEALTHY = "neuron_device_firmware_unhealthy"
HEARTBEAT_STALE = "neuron_device_firmware_heartbeat_stale"
MULTI_NODE_UNFIT = "neuron_device_multi_node_unfit"
FIRMWARE_FAMILIES = frozenset({FIRMWARE_UNHEALTHY, HEARTBEAT_STALE, MULTI_NODE_UNFIT})


class Naming(StrEnum):
    """Which names the exporter serves (--naming): its own, neuron-monitor-prometheus's (the drop-in
    for AWS's dashboards and CloudWatch), or both side by side."""

    NATIVE = "native"
    NEURON_MONITOR = "neuron-monitor"
    BOTH = "both"

    @property
    def serves_native(self) -> bool:
        return self in (Naming.NATIVE, Naming.BOTH)

    @property
    def serves_neuron_monitor(self) -> bool:
        return self in (Naming.NEURON_MONITOR, Naming.BOTH)


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
        "mem_repairable_uncorrected, with the fault table's fault and severity. Corrected events are "
        "neuron_device_ecc_corrected_errors_total.",
        ("device", "type", "fault", "severity", *ATTRIBUTION),
        "hardware_ecc_events_total",
    ),
    Family(
        "neuron_device_ecc_corrected_errors_total",
        "counter",
        "Corrected ECC events on a device (stats/hardware/{sram,mem}_ecc_corrected, driver 2.30.2 and later): "
        "sram_corrected, mem_corrected. No fault: a rising rate often comes before uncorrected errors.",
        ("device", "type", *ATTRIBUTION),
        "hardware_ecc_events_total",
    ),
    # The firmware's verdict (driver 2.30.2 and later, trn2 and trn3), read as every node agent reads it
    # (neuron_health.pipeline.firmware_counters, device_health.multi_node_unfit); absent where not written
    Family(
        FIRMWARE_UNHEALTHY,
        "gauge",
        "1 for each subsystem the firmware lists failing in stats/hardware/health_status/unhealthy_components "
        "(hbm, sram, axi_fabric, firmware_service_*, link_*), 0 for each it does not, with the fault table's "
        "fault and severity (empty for a subsystem the stack does not know, which is served while listed).",
        ("device", "component", "fault", "severity"),
    ),
    Family(
        HEARTBEAT_STALE,
        "gauge",
        "1 while a device's health_status/healthcheck_heartbeat, once seen to change, has stood still for "
        "--heartbeat-stale-after (the fault HEALTHCHECK_HEARTBEAT_STALE), else 0; judged at each scrape.",
        ("device",),
    ),
    Family(
        MULTI_NODE_UNFIT,
        "gauge",
        "1 while a multi-node-unfit fault (a failing link_efa, link_interserver, link_switch or link_intraserver) "
        "marks a device unfit for work spanning nodes, as the NeuronNode report's multiNodeUnfitDevices; the "
        "device stays allocatable for work on this node. Else 0.",
        ("device",),
    ),
    Family(
        "neuron_core_busy_seconds_total",
        "counter",
        "Time a logical NeuronCore spent executing (stats/other_info/nc_time_in_use of its physical cores, their "
        "mean): rate() is its busy fraction, 0-1. Driver 2.30.2 and later only, whose counter is live.",
        ("device", "core", *ATTRIBUTION),
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

# From neuron-monitor's JSON documents (--neuron-monitor-command); see runtime_metrics.py. A runtime's own
# series carry the pod that holds its cores (when one container holds them all).
RUNTIME = ("runtime_tag", "pid")
RUNTIME_FAMILIES = (
    Family(
        "neuron_core_utilization_ratio",
        "gauge",
        "Busy fraction of a logical NeuronCore over neuron-monitor's last period, 0-1, per runtime using it "
        "(neuroncore_counters). While neuron-monitor is not running, on driver 2.30.2 and later: over the time "
        "since the exporter's last read, from sysfs (runtime_tag and pid empty).",
        ("device", "core", *RUNTIME, *ATTRIBUTION),
        "neuroncore_utilization_ratio",
    ),
    Family(
        "neuron_runtime_executions_total",
        "counter",
        "Executions a Neuron runtime finished, by status (completed, completed_with_err, completed_with_num_err, "
        "timed_out, incorrect_input, failed_to_queue; execution_stats.execution_summary, summed over documents).",
        (*RUNTIME, "status", *ATTRIBUTION),
        "execution_status_total",
    ),
    Family(
        "neuron_runtime_execution_errors_total",
        "counter",
        "Execution errors of a Neuron runtime, by type (generic, numerical, transient, model, runtime, hardware; "
        "execution_stats.error_summary, summed over documents).",
        (*RUNTIME, "type", *ATTRIBUTION),
        "execution_errors_total",
    ),
    Family(
        "neuron_runtime_execution_latency_seconds",
        "gauge",
        "Execution latency percentiles of a Neuron runtime over neuron-monitor's last period: `latency` total "
        "(as the runtime measures it) or device (on the device only), `quantile` 0 to 1. Absent while no model ran.",
        (*RUNTIME, "latency", "quantile", *ATTRIBUTION),
        "execution_latency_seconds",
    ),
    Family(
        "neuron_runtime_memory_used_bytes",
        "gauge",
        "Memory a Neuron runtime uses, by location (host, device; memory_used.neuron_runtime_used_bytes).",
        (*RUNTIME, "location", *ATTRIBUTION),
        "neuron_runtime_memory_used_bytes",
    ),
    Family(
        "neuron_runtime_host_memory_used_bytes",
        "gauge",
        "Host memory a Neuron runtime uses, by category (application_memory, constants, dma_buffers, tensors).",
        (*RUNTIME, "category", *ATTRIBUTION),
    ),
    Family(
        "neuron_runtime_core_memory_used_bytes",
        "gauge",
        "Device memory a Neuron runtime uses on a logical NeuronCore, by category (constants, model_code, "
        "model_shared_scratchpad, runtime_memory, tensors).",
        ("device", "core", *RUNTIME, "category", *ATTRIBUTION),
        "neuroncore_memory_usage_<category>",
    ),
    Family(
        "neuron_runtime_vcpu_usage_ratio",
        "gauge",
        "vCPU time a Neuron runtime used over neuron-monitor's last period, 0-1 of one vCPU, by mode (user, system).",
        (*RUNTIME, "mode", *ATTRIBUTION),
        "neuron_runtime_vcpu_usage_ratio",
    ),
    Family(
        "neuron_system_vcpu_count",
        "gauge",
        "vCPUs of the node, as neuron-monitor counts them (vcpu_usage.usage_data).",
        (),
        "system_vcpu_count",
    ),
    Family(
        "neuron_system_vcpu_usage_ratio",
        "gauge",
        "Average vCPU time of the node over neuron-monitor's last period, 0-1, by mode (user, nice, system, idle, "
        "io_wait, irq, soft_irq).",
        ("mode",),
        "system_vcpu_usage_ratio",
    ),
    Family(
        "neuron_system_memory_size_bytes",
        "gauge",
        "Host memory of the node, by memory (ram, swap; memory_info).",
        ("memory",),
        "system_memory_total_bytes, system_swap_total_bytes",
    ),
    Family(
        "neuron_system_memory_used_bytes",
        "gauge",
        "Host memory in use on the node, by memory (ram, swap; memory_info).",
        ("memory",),
        "system_memory_used_bytes, system_swap_used_bytes",
    ),
    Family(
        "neuron_instance_info",
        "gauge",
        "Always 1: the EC2 instance as neuron-monitor describes it (instance_info).",
        (
            "instance_name",
            "instance_id",
            "instance_type",
            "availability_zone",
            "availability_zone_id",
            "region",
            "ami_id",
            "subnet_id",
        ),
        "instance_info",
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
    # the layout check's count, under the name every node agent gives it (neuron_health.layout_check)
    Family(f"neuron_exporter_{layout_check.GAUGE}", "gauge", layout_check.GAUGE_HELP + ".", ()),
    Family(
        "neuron_exporter_monitor_state",
        "gauge",
        "1 for the state neuron-monitor is in, 0 for the others: disabled (no --neuron-monitor-command), "
        "not_found (its binary is missing), starting (no document yet), running, exited (restarting after a "
        "back-off). Only `running` serves runtime metrics.",
        ("state",),
    ),
    Family("neuron_exporter_monitor_restarts_total", "counter", "Times neuron-monitor was started again.", ()),
    Family("neuron_exporter_monitor_documents_total", "counter", "neuron-monitor documents read.", ()),
    Family(
        "neuron_exporter_monitor_problems_total",
        "counter",
        "Parts of neuron-monitor's output that were skipped, by kind: malformed (a line that is not a JSON object), "
        "too_long (a line over 16 MiB), wrong_type (a field), group_error and runtime_error (neuron-monitor "
        "reported an error there), each costing only that part; exporter_error (a fault of the exporter's own "
        "while reading, logged with its traceback; neuron-monitor is restarted).",
        ("kind",),
    ),
)

FAMILIES: dict[str, Family] = {f.name: f for f in (*_FAMILIES, *RUNTIME_FAMILIES)}
ALL_FAMILIES: dict[str, Family] = {f.name: f for f in (*_FAMILIES, *RUNTIME_FAMILIES, *SELF_FAMILIES)}

# neuron-monitor-prometheus's one ECC family, which holds what the native names split in two
NEURON_MONITOR_ECC_HELP = (
    "ECC events on a device (stats/hardware), by event_type: the driver's file name (sram_ecc_uncorrected, "
    "mem_ecc_uncorrected, mem_ecc_repairable_uncorrected; from driver 2.30.2 sram_ecc_corrected and "
    "mem_ecc_corrected), with the fault table's fault and severity (empty for a corrected count)."
)

# neuron-monitor's execution status types, for --naming neuron-monitor
NEURON_MONITOR_STATUS = {
    "success": "completed",
    "execute_completed_with_error": "completed_with_err",
    "execute_completed_with_num_error": "completed_with_num_err",
    "timeout": "timed_out",
    "exec_bad_input": "incorrect_input",
    "execute_failed_to_queue": "failed_to_queue",
}


# Device memory categories a runtime reports per core (memory_used.usage_breakdown.neuroncore_memory_usage)
CORE_MEMORY = ("constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors")
# neuron-monitor-prometheus's instance labels: instance_info's fields, renamed as it does
NEURON_MONITOR_INSTANCE = ("instance_name", "instance_id", "instance_type", "availability_zone", "region", "subnet_id")
_RUNTIME = (*NEURON_MONITOR_INSTANCE, "runtime_tag")
# What `--naming neuron-monitor` serves besides the native families it keeps as they are: the series
# neuron-monitor-prometheus names, and the sysfs families it has no name for, under their own names
# with its `neuron_device_index` for `device`; with the labels the exporter gives them there (a
# runtime series' instance labels only while neuron-monitor runs). A test holds these to what the
# exporter serves.
NEURON_MONITOR_SERIES: tuple[Series, ...] = (
    Series("neuroncore_utilization_ratio", (*_RUNTIME, "neuroncore", *ATTRIBUTION)),
    # from the runtime while neuron-monitor runs, else from sysfs per core (`neuroncore`)
    Series("execution_status_total", (*_RUNTIME, "neuroncore", "status_type", *ATTRIBUTION)),
    Series("execution_errors_total", (*_RUNTIME, "error_type", *ATTRIBUTION)),
    Series("execution_latency_seconds", (*_RUNTIME, "percentile", *ATTRIBUTION)),
    Series("neuron_runtime_memory_used_bytes", (*_RUNTIME, "memory_location", *ATTRIBUTION)),
    Series("neuron_runtime_vcpu_usage_ratio", (*_RUNTIME, "usage_type", *ATTRIBUTION)),
    *(
        Series(f"neuroncore_memory_usage_{category}", (*_RUNTIME, "memory_location", "neuroncore", *ATTRIBUTION))
        for category in dict.fromkeys((*DEVICE_MEM_CATEGORIES, *CORE_MEMORY))
    ),
    Series("hardware_ecc_events_total", ("neuron_device_index", "event_type", "fault", "severity", *ATTRIBUTION)),
    Series(
        "neuron_hardware_info",
        (
            *NEURON_MONITOR_INSTANCE,
            "neuron_device_type",
            "neuroncore_version",
            "neuron_device_count",
            "neuroncore_per_device_count",
            "logical_neuroncore_config",
        ),
    ),
    Series("instance_info", NEURON_MONITOR_INSTANCE),
    Series("system_vcpu_count", NEURON_MONITOR_INSTANCE),
    Series("system_vcpu_usage_ratio", (*NEURON_MONITOR_INSTANCE, "usage_type")),
    *(
        Series(f"system_{kind}_{measure}_bytes", NEURON_MONITOR_INSTANCE)
        for kind in ("memory", "swap")
        for measure in ("total", "used")
    ),
    Series("neuron_device_hardware_errors_total", ("neuron_device_index", "kind", "fault", "severity", *ATTRIBUTION)),
    Series(FIRMWARE_UNHEALTHY, ("neuron_device_index", "component", "fault", "severity")),
    Series(HEARTBEAT_STALE, ("neuron_device_index",)),
    Series(MULTI_NODE_UNFIT, ("neuron_device_index",)),
    Series("neuron_device_host_memory_used_bytes", ("neuron_device_index", "category", *ATTRIBUTION)),
    Series("neuron_device_memory_total_bytes", ("neuron_device_index",)),
    Series("neuron_device_power_utilization_ratio", ("neuron_device_index", "stat")),
    Series("neuron_core_allocation_info", ("neuroncore", *ATTRIBUTION)),
    Series("neuron_core_busy_seconds_total", ("neuroncore", *ATTRIBUTION)),
)


def series() -> tuple[Series, ...]:
    """Every series the exporter serves on /metrics under any --naming, one entry a name, with every
    label it carries under some naming (with --metrics-auth=kubernetes, the authorizer's series too).
    Its counters have no `_created` series: the exporter renders its own exposition."""
    labels: dict[str, dict[str, None]] = {}
    native = (s for f in ALL_FAMILIES.values() for s in exposed(f.name, f.type, f.labels, created=False))
    for s in (*native, *NEURON_MONITOR_SERIES, *metrics_auth.catalogue()):
        labels.setdefault(s.name, {}).update(dict.fromkeys(s.labels))
    return tuple(Series(name, tuple(names)) for name, names in labels.items())


def markdown_table() -> str:
    rows = [
        "| Metric | Type | Labels | Meaning | `--naming neuron-monitor` |",
        "|---|---|---|---|---|",
    ]
    for f in ALL_FAMILIES.values():
        labels = ", ".join(f"`{label}`" for label in f.labels) or "-"
        compat = ", ".join(f"`{n}`" for n in (f.neuron_monitor_name or "").split(", ") if n) or "-"
        rows.append(f"| `{f.name}` | {f.type} | {labels} | {f.help} | {compat} |")
    return "\n".join(rows)
