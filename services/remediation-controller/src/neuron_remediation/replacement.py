"""How a drained node's reboot or new instance is asked for, beyond the Node itself.

The Node already asks: the problem detector's `AcceleratedHardwareReady=False` (EKS node auto repair
and Karpenter's node repair act on it) and, by default, the controller's request annotation
(`remediation.REQUEST_ANNOTATION`), which an external remediation system watches. A `Backend` is a
further step the controller takes once that patch is written; AWS Auto Scaling's
`SetInstanceHealth` (AWS's `npd.nodeRecovery.enabled`) is to be one. None is built but `NoBackend`.
"""

from __future__ import annotations

from typing import Protocol

from neuron_model.remediation import WorkflowState


class Backend(Protocol):
    name: str

    async def request(self, node: str, state: WorkflowState) -> str:
        """Ask for the node's reboot or new instance (state.rung); a sentence for the Event, or raise
        to have the request asked again at the next pass."""
        ...


class NoBackend:
    """The Node's condition and annotation are the whole request."""

    name = "none"

    async def request(self, node: str, state: WorkflowState) -> str:
        return ""
