"""The plugin's own Prometheus metrics (served on /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from neuron_common.node_labels import ultraserver_label_writes


class PluginMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.registrations = Counter(
            "neuron_device_plugin_registrations", "Successful registrations with the kubelet", ["resource"], registry=r
        )
        self.registration_failures = Counter(
            "neuron_device_plugin_registration_failures", "Failed registration attempts", ["resource"], registry=r
        )
        self.registered = Gauge(
            "neuron_device_plugin_registered",
            "1 while the resource is registered with the kubelet",
            ["resource"],
            registry=r,
        )
        self.server_restarts = Counter(
            "neuron_device_plugin_server_restarts",
            "Plugin gRPC servers restarted because the kubelet restarted or removed the socket",
            ["resource"],
            registry=r,
        )
        self.allocations = Counter("neuron_device_plugin_allocations", "Containers allocated", ["resource"], registry=r)
        self.allocation_errors = Counter(
            "neuron_device_plugin_allocation_errors", "Refused Allocate calls", ["resource", "reason"], registry=r
        )
        self.preferred_invalid = Counter(
            "neuron_device_plugin_preferred_allocation_invalid",
            "GetPreferredAllocation calls for which no topology-valid set existed",
            ["resource"],
            registry=r,
        )
        self.health_transitions = Counter(
            "neuron_device_plugin_health_transitions", "Device health changes", ["device", "to"], registry=r
        )
        self.devices = Gauge(
            "neuron_device_plugin_devices", "IDs advertised, by health", ["resource", "health"], registry=r
        )
        self.podresources_up = Gauge(
            "neuron_device_plugin_podresources_up", "1 when the last PodResources List succeeded", registry=r
        )
        self.node_report_writes = Counter(
            "neuron_device_plugin_node_report_writes",
            "NeuronNode writes to the API server (--node-report), by result (success or error)",
            ["result"],
            registry=r,
        )
        self.node_label_writes = ultraserver_label_writes("neuron_device_plugin", r)
        self.node_report_up = Gauge(
            "neuron_device_plugin_node_report_up",
            "1 when the last NeuronNode write succeeded (--node-report)",
            registry=r,
        )
        self.errors = Counter("neuron_device_plugin_errors", "Internal errors by kind", ["kind"], registry=r)
