"""A simulated Neuron node (`node`) and its command, `neuron-sim` (`cli`)."""
