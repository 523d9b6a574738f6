"""Draining a node: which of its pods go, how, and when; then the API calls that make them go.

`plan` is pure: the pods bound to the node, the policy, the time and when the drain began in, the
pod operations out, with a reason for each pod that stays or waits. The API calls are `evict` and
`delete`:
- **Eviction** (the policy/v1 `Eviction` subresource of a pod): the API server checks the pod's
  PodDisruptionBudgets and answers 429 when one allows no disruption now; the pod is asked again at
  the next pass, so a budget is never broken, only waited for.
- **Stay:** pods of DaemonSets (their controller would put them back, and they tolerate the
  cordon), mirror pods of static pods (the kubelet owns them), the stack's own pods (its namespace:
  the detector and the node agents must keep reporting on the node), finished pods; with
  `--drain-pods=neuron` also every pod that holds no Neuron resource (no `<prefix>/neuron*` in its
  containers' resources and no ResourceClaim allocated by the Neuron DRA driver).
- **A pod without a controller** is deleted, as `kubectl drain --force` does (nothing recreates it),
  with an Event; with `--bare-pods=refuse` the node is not drained at all while it holds one.
- **Per namespace:** `evict` (now), `finish:<deadline>` (let the pod end by itself until the
  deadline after the drain began, then evict), `delete-after:<timeout>` (evict; a pod still there
  the timeout after the drain began is deleted, past its budget).
A pod whose deletion has begun is waited for until its grace period ends; after that the kubelet
finishes it, and the drain counts it gone.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from neuron_common.duration import DurationError, parse_duration
from neuron_common.kube import ApiError, rfc3339
from neuron_model.resources import DRA_DRIVER
from neuron_remediation.fleet import PodView

log = logging.getLogger(__name__)


class Mode(enum.StrEnum):
    EVICT = "evict"
    FINISH = "finish"
    DELETE_AFTER = "delete-after"


@dataclass(frozen=True)
class NamespacePolicy:
    mode: Mode = Mode.EVICT
    timeout: float = 0.0  # seconds: FINISH's deadline, DELETE_AFTER's timeout

    def __str__(self) -> str:
        return str(self.mode) if self.mode is Mode.EVICT else f"{self.mode}:{self.timeout:g}s"


def parse_mode(text: str) -> NamespacePolicy:
    """`evict`, `finish:<duration>` or `delete-after:<duration>`."""
    name, _, duration = text.strip().partition(":")
    try:
        mode = Mode(name)
    except ValueError:
        raise ValueError(f"{text!r}: the mode is evict, finish:<duration> or delete-after:<duration>") from None
    if mode is Mode.EVICT:
        if duration:
            raise ValueError(f"{text!r}: evict takes no duration")
        return NamespacePolicy()
    try:
        seconds = parse_duration(duration)
    except DurationError as exc:
        raise ValueError(f"{text!r}: {mode} needs a duration ({exc})") from None
    if seconds <= 0:
        raise ValueError(f"{text!r}: the duration must be greater than 0")
    return NamespacePolicy(mode, seconds)


def parse_namespace_policies(text: str) -> dict[str, NamespacePolicy]:
    """`ns=mode,ns2=mode` (see `parse_mode`); '' is none."""
    policies: dict[str, NamespacePolicy] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        namespace, sep, mode = item.partition("=")
        if not sep or not namespace.strip():
            raise ValueError(f"{item!r}: expected <namespace>=<mode>")
        if namespace.strip() in policies:
            raise ValueError(f"namespace {namespace.strip()!r} is given twice")
        policies[namespace.strip()] = parse_mode(mode)
    return policies


class BarePods(enum.StrEnum):
    DELETE = "delete"
    REFUSE = "refuse"


class Scope(enum.StrEnum):
    NEURON = "neuron"
    ALL = "all"


@dataclass(frozen=True)
class Policy:
    default: NamespacePolicy = NamespacePolicy()
    namespaces: Mapping[str, NamespacePolicy] = field(default_factory=dict)
    bare_pods: BarePods = BarePods.DELETE
    scope: Scope = Scope.NEURON
    keep_namespaces: frozenset[str] = frozenset()  # the stack's own

    def for_namespace(self, namespace: str) -> NamespacePolicy:
        return self.namespaces.get(namespace, self.default)


class Op(enum.StrEnum):
    EVICT = "evict"
    DELETE = "delete"


@dataclass(frozen=True)
class PodOp:
    pod: PodView
    op: Op
    why: str


@dataclass(frozen=True)
class DrainPlan:
    ops: tuple[PodOp, ...] = ()
    waiting: tuple[tuple[PodView, str], ...] = ()
    kept: tuple[tuple[PodView, str], ...] = ()
    refused: str = ""  # non-empty: the node is not drained, and why

    @property
    def complete(self) -> bool:
        return not self.ops and not self.waiting and not self.refused


def holds_neuron(pod: PodView, neuron_claims: frozenset[str]) -> bool:
    return pod.neuron_resources or any(f"{pod.namespace}/{c}" in neuron_claims for c in pod.claims)


def plan(
    pods: Iterable[PodView], policy: Policy, now: float, drain_since: float, neuron_claims: frozenset[str] = frozenset()
) -> DrainPlan:
    """What to do about the pods bound to a node being drained since `drain_since` (Unix times)."""
    ops: list[PodOp] = []
    waiting: list[tuple[PodView, str]] = []
    kept: list[tuple[PodView, str]] = []
    refusals: list[str] = []
    elapsed = now - drain_since
    for pod in sorted(pods, key=lambda p: p.key):
        if pod.finished:
            continue
        if pod.mirror:
            kept.append((pod, "a static pod's mirror: the kubelet owns it"))
            continue
        if pod.controller == "DaemonSet":
            kept.append((pod, "a DaemonSet's pod"))
            continue
        if pod.namespace in policy.keep_namespaces:
            kept.append((pod, f"the stack's own (namespace {pod.namespace})"))
            continue
        if policy.scope is Scope.NEURON and not holds_neuron(pod, neuron_claims):
            kept.append((pod, "holds no Neuron resource (--drain-pods=neuron)"))
            continue
        if pod.deleting_at is not None:
            if now < pod.deleting_at:
                waiting.append((pod, f"terminating, its grace period ends at {rfc3339(pod.deleting_at)}"))
            continue  # past its grace period the kubelet finishes it
        if pod.controller is None:
            if policy.bare_pods is BarePods.REFUSE:
                refusals.append(pod.key)
            else:
                ops.append(PodOp(pod, Op.DELETE, "it has no controller: deleted as kubectl drain --force does"))
            continue
        ns_policy = policy.for_namespace(pod.namespace)
        if ns_policy.mode is Mode.FINISH and elapsed < ns_policy.timeout:
            deadline = rfc3339(drain_since + ns_policy.timeout)
            waiting.append((pod, f"let finish until {deadline} (namespace policy {ns_policy})"))
        elif ns_policy.mode is Mode.DELETE_AFTER and elapsed >= ns_policy.timeout:
            ops.append(
                PodOp(pod, Op.DELETE, f"not evicted within {ns_policy.timeout:g}s (namespace policy {ns_policy})")
            )
        else:
            why = "evicted" if ns_policy.mode is not Mode.FINISH else f"not finished within {ns_policy.timeout:g}s"
            ops.append(PodOp(pod, Op.EVICT, f"{why} (namespace policy {ns_policy})"))
    if refusals:
        refused = (
            f"{len(refusals)} pod(s) without a controller ({', '.join(refusals[:5])}"
            f"{', ...' if len(refusals) > 5 else ''}) and --bare-pods=refuse"
        )
        return DrainPlan((), tuple(waiting), tuple(kept), refused)
    return DrainPlan(tuple(ops), tuple(waiting), tuple(kept))


# -- the API calls ------------------------------------------------------------------------------------


class Outcome(enum.StrEnum):
    EVICTED = "evicted"
    DELETED = "deleted"
    BLOCKED = "blocked"  # 429: a PodDisruptionBudget allows no disruption now; asked again next pass
    GONE = "gone"  # 404, or a new pod under the same name (the UID precondition failed)
    FAILED = "failed"


class PodApi(Protocol):
    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]: ...

    async def get(self, path: str) -> dict[str, Any]: ...


def _pod_path(pod: PodView) -> str:
    return f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"


async def execute(api: PodApi, op: PodOp) -> tuple[Outcome, str]:
    """One pod operation; the outcome and the API server's message."""
    pod = op.pod
    # the UID precondition: a pod re-created under the same name since the view is never touched
    options = {"preconditions": {"uid": pod.uid}} if pod.uid else {}
    try:
        if op.op is Op.EVICT:
            body = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": pod.name, "namespace": pod.namespace},
                "deleteOptions": options,
            }
            await api.request("POST", _pod_path(pod) + "/eviction", body=body)
            return Outcome.EVICTED, ""
        await api.request("DELETE", _pod_path(pod), body={"apiVersion": "v1", "kind": "DeleteOptions", **options})
        return Outcome.DELETED, ""
    except ApiError as exc:
        if exc.status == 429:
            return Outcome.BLOCKED, exc.message
        if exc.status in (404, 409):
            return Outcome.GONE, exc.message
        return Outcome.FAILED, str(exc)


async def neuron_claims(api: PodApi, pods: Iterable[PodView]) -> frozenset[str]:
    """The pods' ResourceClaims (`namespace/name`) allocated by the Neuron DRA driver. A claim that
    cannot be read counts as Neuron's: a drain that moves one pod too many is safer than one that
    leaves a pod on a failing device."""
    found: set[str] = set()
    for pod in pods:
        for claim in pod.claims:
            key = f"{pod.namespace}/{claim}"
            if key in found:
                continue
            try:
                obj = await api.get(f"/apis/resource.k8s.io/v1/namespaces/{pod.namespace}/resourceclaims/{claim}")
            except ApiError as exc:
                if exc.status == 404:
                    continue
                log.warning("cannot read ResourceClaim %s (%s): counted as a Neuron claim", key, exc)
                found.add(key)
                continue
            results = ((obj.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or ()
            if any(isinstance(r, Mapping) and r.get("driver") == DRA_DRIVER for r in results):
                found.add(key)
    return frozenset(found)
