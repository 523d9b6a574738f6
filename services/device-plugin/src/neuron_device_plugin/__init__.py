"""Kubelet device plugin for AWS Neuron: advertises aws.amazon.com/neuron and aws.amazon.com/neuroncore."""

__version__ = "0.1.0"
