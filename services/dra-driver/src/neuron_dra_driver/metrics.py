"""The driver's Prometheus metrics (served on /metrics). The names are a contract: the dashboards use them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from neuron_common.node_labels import ultraserver_label_writes


class DriverMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.prepare_duration = Histogram(
            "neuron_dra_prepare_duration_seconds",
            "Time to prepare or unprepare one claim (NodePrepareResources / NodeUnprepareResources)",
            ["operation"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        for operation in ("prepare", "unprepare"):
            # exposed at zero from the start: rate() sees a node's first claim only if it saw the count before it
            self.prepare_duration.labels(operation)
        self.prepared_claims = Gauge("neuron_dra_prepared_claims", "Claims prepared on this node", registry=r)
        self.published_devices = Gauge(
            "neuron_dra_published_devices",
            "Devices in this node's ResourceSlices, by kind (device: a Neuron device, core: a NeuronCore, "
            "group: a ring arc of connected devices)",
            ["kind"],
            registry=r,
        )
        self.unhealthy_devices = Gauge(
            "neuron_dra_unhealthy_devices",
            "Neuron devices unhealthy: tainted in the ResourceSlices, or left out of them (taints off or dropped)",
            registry=r,
        )
        self.tainted_devices = Gauge(
            "neuron_dra_tainted_devices",
            "Published devices and cores carrying the unhealthy taint (device taints on)",
            registry=r,
        )
        self.counters_kept = Gauge(
            "neuron_dra_shared_counters_kept",
            "1 while the API server keeps shared counters; 0 when it drops them (DRAPartitionableDevices off) "
            "and only whole devices are published, so a device and its cores are never handed out together",
            registry=r,
        )
        self.taints_kept = Gauge(
            "neuron_dra_device_taints_kept",
            "1 while the API server keeps device taints; 0 when it drops them (DRADeviceTaints off) "
            "and unhealthy devices are left out of the slices instead",
            registry=r,
        )
        self.slice_updates = Counter(
            "neuron_dra_slice_updates", "Times this node's ResourceSlices were written with new content", registry=r
        )
        self.refusals = Counter(
            "neuron_dra_prepare_refusals", "Claims refused by NodePrepareResources", ["reason"], registry=r
        )
        self.cdi_specs_restored = Counter(
            "neuron_dra_cdi_specs_restored",
            "Prepared claims whose CDI spec was missing (as after a reboot: /var/run/cdi is a tmpfs) "
            "and was written again from the checkpoint",
            registry=r,
        )
        self.node_label_writes = ultraserver_label_writes("neuron_dra", r)
        self.errors = Counter("neuron_dra_errors", "Internal errors by kind", ["kind"], registry=r)
        self.registered = Gauge("neuron_dra_registered", "1 while the kubelet has registered the driver", registry=r)
