"""Neuron hardware errors become NodeConditions, Events and metrics, and clear when they should."""

__version__ = "0.1.0"
