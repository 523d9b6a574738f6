"""Shared by the neuron-helm-chart services; written once here, never copied into a service."""

__version__ = "0.1.0"
