"""Flags of `neuron-remediator`, each with a `NEURON_REMEDIATION_*` environment twin."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from neuron_common.config import (
    ApiRequests,
    EnvArgumentParser,
    ResourcePrefix,
    ServiceConfig,
    Serving,
    config_parser,
    derived,
    flag,
    parse_config,
    positive_duration,
    positive_int,
    switch,
)
from neuron_common.leader import LeaderElection
from neuron_model import remediation
from neuron_remediation import drain
from neuron_remediation.planner import Safety

DEFAULT_LISTEN = "0.0.0.0:9845"


def percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage, got {text!r}") from None
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"must be greater than 0 and at most 100, got {text!r}")
    return value


def _mode(text: str) -> drain.NamespacePolicy:
    try:
        return drain.parse_mode(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _namespace_policies(text: str) -> dict[str, drain.NamespacePolicy]:
    try:
        return drain.parse_namespace_policies(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _namespaces(text: str) -> frozenset[str]:
    return frozenset(n.strip() for n in text.split(",") if n.strip())


@dataclass(frozen=True, kw_only=True)
class Config(LeaderElection, Serving, ApiRequests, ResourcePrefix, ServiceConfig):
    """The cluster-level remediation controller for AWS Neuron nodes: a node whose Neuron fault needs a
    reboot or a new instance (the problem detector's NeuronHealth condition, the fault table's ladder)
    is cordoned and tainted, drained through the Eviction API (PodDisruptionBudgets honoured), and
    marked for a reboot or a new instance; a breaker, a rate limit, an approval mode and an opt-out
    label bound what it does, and an admin's uncordon cancels it. Serves /healthz, /readyz and
    /metrics."""

    PROG: ClassVar[str] = "neuron-remediator"
    ENV_PREFIX: ClassVar[str] = "NEURON_REMEDIATION_"
    FLAGS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "listen": {"default": DEFAULT_LISTEN},
        "leader_elect": {
            "help": "take part in leader election on a Lease; only the leader acts (run 2 replicas for availability)"
        },
        "lease_name": {"default": "neuron-remediation"},
        "resource_prefix": {"help": "prefix of the Neuron resources a pod holds (<prefix>/neuron*)"},
    }

    max_nodes: int = flag(
        1, "breaker: at most this many nodes cordoned or draining because of this controller at once", type=positive_int
    )
    max_percent: float = flag(
        25.0,
        "breaker: at most this share (in %%) of the Neuron nodes cordoned or draining because of this controller at "
        "once (rounded down: 25 %% of 4 nodes is 1, of 3 nodes 0)",
        type=percent,
    )
    rate_limit: int = flag(3, "at most this many workflows started within --rate-window", type=positive_int)
    rate_window: float = flag("1h", "the window of --rate-limit", type=positive_duration)
    approval: bool = switch(
        False,
        f"wait for the annotation {remediation.APPROVED_ANNOTATION} on the node before any drain or replacement "
        "request (cordon and taint happen at once)",
    )
    replacement: str = flag(
        "annotation",
        "how a drained node asks for its reboot or new instance: 'annotation' (AcceleratedHardwareReady=False, which "
        f"the problem detector writes, plus the annotation {remediation.REQUEST_ANNOTATION} for an external system) "
        "or 'condition' (the condition alone, for EKS node auto repair or Karpenter)",
        choices=["annotation", "condition"],
    )
    replacement_backend: str = flag(
        "none",
        "what else asks for a drained node's new instance: 'none' (the Node's condition and annotation alone) or "
        "'autoscaling' (AWS Auto Scaling's SetInstanceHealth marks its instance Unhealthy, and its group replaces it; "
        "AWS's npd.nodeRecovery.enabled). A failed request is retried at every pass",
        choices=["none", "autoscaling"],
    )
    aws_region: str = flag(
        "", "the Auto Scaling backend's region (default: the node's zone in spec.providerID, else $AWS_REGION)"
    )
    autoscaling_endpoint: str = flag(
        "",
        "the Auto Scaling endpoint URL (default: $AWS_ENDPOINT_URL_AUTO_SCALING, $AWS_ENDPOINT_URL, else the "
        "region's public one); for a VPC endpoint, or a stand-in in tests",
    )
    sts_endpoint: str = flag(
        "",
        "the STS endpoint URL IRSA's web identity is exchanged at (default: $AWS_ENDPOINT_URL_STS, "
        "$AWS_ENDPOINT_URL, else the region's)",
    )
    respect_grace_period: bool = switch(
        False,
        "SetInstanceHealth's ShouldRespectGracePeriod: with it, Auto Scaling ignores the mark on an instance still "
        "in its group's health check grace period, and the drained node would wait for nothing",
    )
    autoscaling_reboot: bool = switch(
        False,
        "also mark a node on the reboot rung Unhealthy (a new instance instead of its reboot); by default the "
        "Auto Scaling backend acts on the replace rung only",
    )
    validate_after_reboot: bool = switch(
        False,
        "a node that booted again stays cordoned and tainted until the problem detector's verdict on the new boot "
        f"(its {remediation.VALIDATED_CONDITION} condition; the detector's --validate-after-reboot): a pass ends the "
        "workflow, a failure asks for a new instance (the replace rung); by default a new boot ends it",
    )
    verdict_timeout: float = flag(
        "20m",
        "with --validate-after-reboot: time a rebooted node waits for the detector's verdict before it is escalated "
        "to the replace rung",
        type=positive_duration,
    )
    drain_policy: drain.NamespacePolicy = flag(
        "evict",
        "how pods are drained where --namespace-drain-policy names nothing else: 'evict' (now), 'finish:<duration>' "
        "(let them end by themselves until the deadline after the drain began, then evict), 'delete-after:<duration>' "
        "(evict; delete a pod still there the duration after the drain began, past its PodDisruptionBudget)",
        type=_mode,
    )
    namespace_drain_policy: Mapping[str, drain.NamespacePolicy] = flag(
        "", "per-namespace drain policies, e.g. training=finish:2h,batch=delete-after:30m", type=_namespace_policies
    )
    bare_pods: str = flag(
        "delete",
        "a pod without a controller on a node being drained: 'delete' (as kubectl drain --force; it is not recreated; "
        "an Event says so) or 'refuse' (the node is not drained while it holds one)",
        choices=[str(b) for b in drain.BarePods],
    )
    drain_pods: str = flag(
        "neuron",
        "which pods a drain moves: 'neuron' (those holding <prefix>/neuron* resources or a ResourceClaim of the "
        "Neuron DRA driver) or 'all'",
        choices=[str(s) for s in drain.Scope],
    )
    keep_namespaces: frozenset[str] = flag(
        "",
        "namespaces whose pods a drain never moves, comma-separated (default $POD_NAMESPACE: the stack's own)",
        type=_namespaces,
    )
    event_namespace: str = flag("default", "namespace of the Events on Nodes")
    resync: float = flag(
        "10s", "time between passes over the fleet when no change arrives (a drain is retried as often)",
        type=positive_duration,
    )  # fmt: skip
    safety: Safety = derived()
    policy: drain.Policy = derived()

    @classmethod
    def resolve(cls, p: argparse.ArgumentParser, v: dict[str, Any], environ: Mapping[str, str]) -> None:
        keep = v["keep_namespaces"] or _namespaces(environ.get("POD_NAMESPACE", ""))
        v["keep_namespaces"] = keep
        v["safety"] = Safety(
            max_nodes=v["max_nodes"],
            max_percent=v["max_percent"],
            rate_limit=v["rate_limit"],
            rate_window=v["rate_window"],
            approval=v["approval"],
            request_annotation=v["replacement"] == "annotation",
            validate_after_reboot=v["validate_after_reboot"],
            verdict_timeout=v["verdict_timeout"],
        )
        v["policy"] = drain.Policy(
            default=v["drain_policy"],
            namespaces=dict(v["namespace_drain_policy"]),
            bare_pods=drain.BarePods(v["bare_pods"]),
            scope=drain.Scope(v["drain_pods"]),
            keep_namespaces=keep,
        )


def parser(env: Mapping[str, str] | None = None) -> EnvArgumentParser:
    return config_parser(Config, env)


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    return parse_config(Config, argv, env)
