"""kube-scheduler extender for AWS Neuron: a node passes only where a connected set of devices or cores is free."""

__version__ = "0.1.0"
