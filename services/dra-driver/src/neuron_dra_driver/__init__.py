"""A DRA kubelet plugin for AWS Neuron: devices and NeuronCores as ResourceSlices, claims prepared with CDI."""
