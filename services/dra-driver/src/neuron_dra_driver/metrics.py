"""The driver's Prometheus metrics (served on /metrics). The names are a contract: the dashboards use them."""

from __future__ import annotations

from neuron_common import metrics_auth
from neuron_common.metrics import MetricSet, Series
from neuron_common.node_labels import ultraserver_label_writes
from neuron_health import layout_check


class DriverMetrics:
    def __init__(self) -> None:
        m = MetricSet("neuron_dra")
        self.registry = m.registry
        self.series = m.series
        self.prepare_duration = m.histogram(
            "prepare_duration_seconds",
            "Time to prepare or unprepare one claim (NodePrepareResources / NodeUnprepareResources)",
            ["operation"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            shown=("prepare", "unprepare"),
        )
        self.prepared_claims = m.gauge("prepared_claims", "Claims prepared on this node")
        self.published_devices = m.gauge(
            "published_devices",
            "Devices in this node's ResourceSlices, by kind (device: a Neuron device, core: a NeuronCore, "
            "group: a ring arc of connected devices)",
            ["kind"],
        )
        self.unhealthy_devices = m.gauge(
            "unhealthy_devices",
            "Neuron devices unhealthy: tainted in the ResourceSlices, or left out of them (taints off or dropped)",
        )
        self.tainted_devices = m.gauge(
            "tainted_devices", "Published devices and cores carrying the unhealthy taint (device taints on)"
        )
        self.counters_kept = m.gauge(
            "shared_counters_kept",
            "1 while the API server keeps shared counters; 0 when it drops them (DRAPartitionableDevices off) "
            "and only whole devices are published, so a device and its cores are never handed out together",
        )
        self.shares_kept = m.gauge(
            "shareable_devices_kept",
            "1 while the API server keeps devices that allow several allocations; 0 when it drops them "
            "(DRAConsumableCapacity off) and cores are published as devices with shared counters instead",
        )
        self.taints_kept = m.gauge(
            "device_taints_kept",
            "1 while the API server keeps device taints; 0 when it drops them (DRADeviceTaints off) "
            "and unhealthy devices are left out of the slices instead",
        )
        self.slice_updates = m.counter(
            "slice_updates", "Times this node's ResourceSlices were written with new content"
        )
        self.refusals = m.counter("prepare_refusals", "Claims refused by NodePrepareResources", ["reason"])
        self.stale_claims_forgotten = m.counter(
            "stale_claims_forgotten",
            "Prepared claims taken out of the checkpoint because their ResourceClaim is gone, was recreated "
            "or is no longer allocated to this node, found when their cores refused another claim",
        )
        self.cdi_specs_restored = m.counter(
            "cdi_specs_restored",
            "Prepared claims whose CDI spec was missing (as after a reboot: /var/run/cdi is a tmpfs) "
            "and was written again from the checkpoint",
        )
        self.node_label_writes = ultraserver_label_writes(m)
        self.errors = m.counter("errors", "Internal errors by kind", ["kind"])
        self.health_sources_missing = layout_check.declare_gauge(m)
        self.registered = m.gauge("registered", "1 while the kubelet has registered the driver")


def catalogue() -> tuple[Series, ...]:
    """Every series the service serves on /metrics (with --metrics-auth=kubernetes, the authorizer's too)."""
    return (*DriverMetrics().series(), *metrics_auth.catalogue())
