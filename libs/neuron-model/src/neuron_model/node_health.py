"""How a Neuron node's health shows on its Node object, for every component that writes or reads it:
the problem detector sets the condition (and, with remediation on, the taint); the scheduler
extender reads both to tell a degraded UltraServer group."""

from __future__ import annotations

CONDITION = "NeuronHealth"  # the NodeCondition type; True while the node has a Neuron hardware problem
UNHEALTHY_TAINT = "aws.amazon.com/neuron-unhealthy"  # the detector's NoSchedule taint (npd.remediation.taint)
