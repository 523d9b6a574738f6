"""Prometheus exporter of AWS Neuron driver counters, attributed to pods, namespaces and containers."""

__version__ = "0.1.0"
