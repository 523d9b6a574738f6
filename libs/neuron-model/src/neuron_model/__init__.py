"""The Neuron model: what a Neuron node is, independent of how it is read.

`instance_types` (the instance table, families, torus shapes, PCI ids in `pci`), `allocator`
(the rules for a valid set of devices or cores), `placement` (a whole pod on a node's free
silicon), `report` (the NeuronNode report), `resources` (the Kubernetes resource names).
Nothing here touches the host: the scheduler extender uses it without sysfs.
"""
