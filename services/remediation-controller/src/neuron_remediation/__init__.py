"""The cluster-level remediation controller: from a Neuron fault to a drained node marked for a reboot or a
new instance."""
