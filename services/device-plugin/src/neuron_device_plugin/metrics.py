"""The plugin's own Prometheus metrics (served on /metrics)."""

from __future__ import annotations

from neuron_common import metrics_auth
from neuron_common.metrics import MetricSet, Series
from neuron_common.node_labels import ultraserver_label_writes
from neuron_health import layout_check


class PluginMetrics:
    def __init__(self) -> None:
        m = MetricSet("neuron_device_plugin")
        self.registry = m.registry
        self.series = m.series
        self.registrations = m.counter("registrations", "Successful registrations with the kubelet", ["resource"])
        self.registration_failures = m.counter("registration_failures", "Failed registration attempts", ["resource"])
        self.registered = m.gauge("registered", "1 while the resource is registered with the kubelet", ["resource"])
        self.server_restarts = m.counter(
            "server_restarts",
            "Plugin gRPC servers restarted because the kubelet restarted or removed the socket",
            ["resource"],
        )
        self.allocations = m.counter("allocations", "Containers allocated", ["resource"])
        self.allocation_errors = m.counter("allocation_errors", "Refused Allocate calls", ["resource", "reason"])
        self.preferred_invalid = m.counter(
            "preferred_allocation_invalid",
            "GetPreferredAllocation calls for which no topology-valid set existed",
            ["resource"],
        )
        self.health_transitions = m.counter("health_transitions", "Device health changes", ["device", "to"])
        self.devices = m.gauge("devices", "IDs advertised, by health", ["resource", "health"])
        self.podresources_up = m.gauge("podresources_up", "1 when the last PodResources List succeeded")
        self.node_report_writes = m.counter(
            "node_report_writes",
            "NeuronNode writes to the API server (--node-report), by result (success or error)",
            ["result"],
        )
        self.node_label_writes = ultraserver_label_writes(m)
        self.node_report_up = m.gauge("node_report_up", "1 when the last NeuronNode write succeeded (--node-report)")
        self.errors = m.counter("errors", "Internal errors by kind", ["kind"])
        self.health_sources_missing = layout_check.declare_gauge(m)


def catalogue() -> tuple[Series, ...]:
    """Every series the service serves on /metrics (with --metrics-auth=kubernetes, the authorizer's too)."""
    return (*PluginMetrics().series(), *metrics_auth.catalogue())
