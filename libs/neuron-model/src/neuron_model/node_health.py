"""How a Neuron node's health shows on its Node object, for every component that writes or reads it:
the problem detector sets the condition (and, with remediation on, the taint); the scheduler
extender reads both to tell a degraded UltraServer group."""

from __future__ import annotations

CONDITION = "NeuronHealth"  # the NodeCondition type; True while the node has a Neuron hardware problem
UNHEALTHY_TAINT = "aws.amazon.com/neuron-unhealthy"  # the detector's NoSchedule taint (npd.remediation.taint)
# True while a health source the stack reads is missing from the driver's tree (the layout check): the node's
# other conditions cannot say "healthy" for what is not read. About the detector's sources, not the hardware:
# no taint, cordon or remediation workflow follows it.
SOURCES_MISSING_CONDITION = "NeuronHealthSourcesMissing"
SOURCES_FOUND_REASON = "NeuronHealthSourcesFound"

# EKS's node monitoring agent's condition, which EKS node auto repair and Karpenter's node repair act on
# (shared/reference/fleet-and-scale.md): False while the node needs a reboot or a new instance.
ACCELERATED_HARDWARE_CONDITION = "AcceleratedHardwareReady"
ACCELERATED_HARDWARE_READY_REASON = "NeuronAcceleratedHardwareIsReady"
# The other conditions that agent writes on every node it runs on: where one of them is on a Node, the
# agent runs there and owns AcceleratedHardwareReady, and the problem detector leaves it alone.
EKS_NODE_MONITORING_AGENT_CONDITIONS = ("KernelReady", "NetworkingReady", "StorageReady", "ContainerRuntimeReady")

# A problem the node agent acts on first (a validation in place, a device reset) carries its job's phase
# in CONDITION's message, `<problem> (<what>: <phase>)`; the remediation controller starts its workflow
# for such a problem only once it reads the escalated phase (or AcceleratedHardwareReady=False for it).
JOB_PHASE_ESCALATED = "escalated"


def job_note(what: str, phase: str) -> str:
    """`what`: "device reset" or "validation in place"."""
    return f" ({what}: {phase})"


def escalated_in(message: str) -> bool:
    """Whether CONDITION's message says a node agent's job on one of its problems escalated."""
    return any(job_note(what, JOB_PHASE_ESCALATED) in message for what in ("device reset", "validation in place"))
