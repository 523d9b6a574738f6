"""The controller's metrics, `neuron_remediation_*`: one counter per step taken, the workflows by
phase, what held a node back, and the pod operations of its drains."""

from __future__ import annotations

from neuron_common import metrics_auth
from neuron_common.metrics import MetricSet, Series
from neuron_model.remediation import Phase
from neuron_remediation import drain
from neuron_remediation.planner import Hold, Kind
from neuron_remediation.replacement import Result


class Metrics:
    def __init__(self) -> None:
        m = MetricSet("neuron_remediation")
        self.registry = m.registry
        self.steps = m.counter(
            "steps",
            "Workflow steps taken, by step (start, advance, drain, request, cancel, release) and outcome (done, "
            "conflict: the Node changed since it was read, failed)",
            ["step", "outcome"],
            shown=[(str(k), o) for k in Kind if k is not Kind.HOLD for o in ("done", "conflict", "failed")],
        )
        self.holds = m.counter(
            "holds",
            "Decisions that held a node's workflow back, by why (breaker, rate_limit, ultraserver, approval, ...)",
            ["why"],
            shown=[str(h) for h in Hold],
        )
        self.pods = m.counter(
            "pod_operations",
            "Pods a drain asked to go, by operation (evict, delete) and outcome (evicted, deleted, blocked by a "
            "PodDisruptionBudget, gone, failed)",
            ["operation", "outcome"],
            shown=[(str(op), str(o)) for op in drain.Op for o in drain.Outcome],
        )
        self.requests = m.counter(
            "replacement_requests",
            "Requests of a replacement backend (--replacement-backend) for a drained node's new instance, by backend "
            "and result (done, already Unhealthy, skipped: not its rung, no_instance, not_in_group, no_credentials, "
            "refused by AWS, unreachable, failed); every result but done, already and skipped is asked again",
            ["backend", "result"],
            shown=[("autoscaling", str(r)) for r in Result],
        )
        self.workflows = m.gauge(
            "workflows", "Nodes with a workflow, by phase", ["phase"], shown=[str(p) for p in Phase]
        )
        self.held_nodes = m.gauge("held_nodes", "Nodes the breaker counts: cordoned or draining because of us")
        self.breaker_limit = m.gauge("breaker_limit", "How many nodes the breaker lets workflows hold at once now")
        self.neuron_nodes = m.gauge("neuron_nodes", "Neuron nodes in the view")
        self.leader = m.gauge("leader", "1 while this replica holds the lease (and acts)")
        self.passes = m.counter("passes", "Passes over the fleet the leader made")
        self._set = m

    def series(self) -> tuple[Series, ...]:
        return self._set.series()


def catalogue() -> tuple[Series, ...]:
    """Every series the controller serves on /metrics (with --metrics-auth=kubernetes, the authorizer's too)."""
    return (*Metrics().series(), *metrics_auth.catalogue())
