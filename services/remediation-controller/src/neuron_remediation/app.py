"""Wiring and I/O: the Node and Pod reflectors, leader election, the passes over the fleet that turn
the planner's decisions into Node patches, evictions, deletions, Events and metrics.

Only the leader acts. Each pass plans from the view (`planner.plan`) and carries the decisions out
one by one. A Node patch carries the resourceVersion the decision saw: where the Node changed
meanwhile (an admin's uncordon, the detector's condition) the API server refuses it with 409 and
the next pass decides again on the new Node. The patched Node the API server returns goes into the
view at once, so the next decision of the same pass (the breaker's count) sees it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from neuron_common.health_server import HealthServer
from neuron_common.kube import MERGE_PATCH, Api, ApiError, create_or_count, event_object, news_name
from neuron_common.leader import AlwaysLeader, LeaderElector
from neuron_common.lifecycle import wait_any
from neuron_common.reflector import Reflector, Resource
from neuron_common.runner import run_service
from neuron_common.supervisor import Loop, Supervisor
from neuron_model import remediation
from neuron_model.remediation import Phase
from neuron_remediation import drain, planner
from neuron_remediation.config import Config
from neuron_remediation.fleet import NodeView, PodView, node_view, pod_view
from neuron_remediation.metrics import Metrics
from neuron_remediation.planner import Action, Fleet, Kind
from neuron_remediation.replacement import Backend, BackendError, Result, make

log = logging.getLogger(__name__)

COMPONENT = "neuron-remediator"
# Pods that can still hold a node's silicon: bound, not finished; the API server filters the rest.
BOUND_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
NODES = Resource("nodes", "/api/v1/nodes")
PODS = Resource("pods", "/api/v1/pods", {"fieldSelector": BOUND_PODS})


class Remediator:
    def __init__(
        self,
        config: Config,
        stop: asyncio.Event,
        api: Api | None = None,
        *,
        backend: Backend | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.stop = stop
        self.api = api or Api.from_kubeconfig(config.kubeconfig, config.api_timeout)
        self.backend: Backend = backend or make(config)
        self.wall_clock = wall_clock
        self.metrics = Metrics()
        self.nodes: dict[str, NodeView] = {}
        self.pods: dict[str, PodView] = {}
        self.changed = asyncio.Event()
        prefix = config.resource_prefix
        self.node_source: Reflector[NodeView] = Reflector(
            self.api,
            NODES,
            reduce=lambda obj: node_view(obj, prefix),
            replace=lambda records, _: self._replace(self.nodes, {r.name: r for r in records}),
            apply=lambda event, r: self._apply(self.nodes, r.name, event, r),
        )
        self.pod_source: Reflector[PodView] = Reflector(
            self.api,
            PODS,
            reduce=lambda obj: pod_view(obj, prefix),
            replace=lambda records, _: self._replace(self.pods, {r.key: r for r in records}),
            apply=lambda event, r: self._apply(self.pods, r.key, event, r),
        )
        self.leader = LeaderElector(self.api, config.lease) if config.leader_elect else AlwaysLeader()
        self.supervisor = Supervisor(stop)
        self.http = HealthServer.for_service(
            config.listen, self.metrics.registry, self.supervisor, self.ready, config.metrics_security, api=self.api
        )
        self.starts: list[tuple[str, float]] = []  # (node, time) of the starts made here: a node gone still counts
        self.told: dict[str, str] = {}  # node -> the last hold or drain message told: told again only when it changes
        self.passes = 0

    # -- the view ------------------------------------------------------------------------------------
    def _replace(self, store: dict[str, Any], records: Mapping[str, Any]) -> None:
        store.clear()
        store.update(records)
        self.changed.set()

    def _apply(self, store: dict[str, Any], key: str, event: str, record: Any) -> None:
        if event == "DELETED":
            store.pop(key, None)
        else:
            store[key] = record
        self.changed.set()

    @property
    def synced(self) -> bool:
        return self.node_source.synced and self.pod_source.synced

    def ready(self) -> tuple[bool, str]:
        if not self.synced:
            waiting = [r.resource.name for r in (self.node_source, self.pod_source) if not r.synced]
            return False, f"listing {', '.join(waiting)} from the API server"
        role = "leader" if self.leader.leading else "standby"
        held = sum(1 for n in self.nodes.values() if n.state is not None and n.state.phase.holds_node)
        neuron = sum(1 for n in self.nodes.values() if n.neuron)
        return True, f"{role}; {neuron} Neuron nodes, {held} held by a workflow"

    def fleet(self, claims: frozenset[str] = frozenset()) -> Fleet:
        by_node: dict[str, list[PodView]] = {}
        for pod in self.pods.values():
            by_node.setdefault(pod.node, []).append(pod)
        return Fleet(dict(self.nodes), by_node, claims, tuple(self.starts))

    # -- a pass ----------------------------------------------------------------------------------------
    async def run_pass(self) -> list[Action]:
        """Plan from the view and act; the actions decided (tests read them)."""
        now = self.wall_clock()
        claims: frozenset[str] = frozenset()
        if self.config.policy.scope is drain.Scope.NEURON:
            draining = {n.name for n in self.nodes.values() if n.state is not None and n.state.phase is Phase.DRAINING}
            claims = await drain.neuron_claims(self.api, [p for p in self.pods.values() if p.node in draining])
        actions = planner.plan(self.fleet(claims), self.config.safety, self.config.policy, now)
        for action in actions:
            await self.act(action, now)
        self.passes += 1
        self.metrics.passes.inc()
        self._gauges()
        return actions

    def _gauges(self) -> None:
        phases = {str(p): 0 for p in Phase}
        for n in self.nodes.values():
            if n.state is not None:
                phases[str(n.state.phase)] += 1
        for phase, count in phases.items():
            self.metrics.workflows.labels(phase).set(count)
        neuron = sum(1 for n in self.nodes.values() if n.neuron)
        self.metrics.neuron_nodes.set(neuron)
        self.metrics.held_nodes.set(sum(1 for n in self.nodes.values() if n.state and n.state.phase.holds_node))
        self.metrics.breaker_limit.set(planner.limit(self.config.safety, neuron))

    async def act(self, action: Action, now: float) -> None:
        if action.hold is not None:
            self.metrics.holds.labels(str(action.hold)).inc()
        if action.kind is Kind.HOLD:
            await self._tell(action)
            return
        if action.kind is Kind.DRAIN:
            await self._drain(action)
            return
        node = self.nodes.get(action.node)
        if node is None:
            return
        said = ""
        if action.kind is Kind.REQUEST and action.state is not None:
            # the backend before the patch: a request not made leaves the workflow where it was, so the next
            # pass decides REQUEST again and asks again (a repeat finds the instance Unhealthy already)
            asked = await self._request(node, action)
            if asked is None:
                return
            said = asked
        try:
            patched = await self.api.patch(f"/api/v1/nodes/{action.node}", self._patch(node, action), MERGE_PATCH)
        except ApiError as exc:
            outcome = "conflict" if exc.status == 409 else "failed"
            self.metrics.steps.labels(str(action.kind), outcome).inc()
            log.log(
                logging.INFO if exc.status == 409 else logging.WARNING,
                "node %s: %s not done (%s); deciding again at the next pass", action.node, action.kind, exc,
            )  # fmt: skip
            return
        view = node_view(patched, self.config.resource_prefix)
        if view is not None:
            self.nodes[view.name] = view
        self.metrics.steps.labels(str(action.kind), "done").inc()
        if action.kind is Kind.START:
            self.starts.append((action.node, action.state.started if action.state is not None else now))
            self.starts = [(n, t) for n, t in self.starts if now - t < self.config.safety.rate_window]
        message = f"{action.message}; {said}" if said else action.message
        log.info(
            "node %s: %s", action.node, message,
            extra={"node": action.node, "step": str(action.kind), "reason": action.reason},
        )  # fmt: skip
        self.told.pop(action.node, None)
        await self._event(_node_ref(action.node), action.reason, message, warning=action.warning)

    async def _request(self, node: NodeView, action: Action) -> str | None:
        """The backend's sentence for the Event, or None when it did not make the request (said in an
        Event once per distinct failure, and asked again at the next pass)."""
        assert action.state is not None
        try:
            outcome = await self.backend.request(node, action.state)
        except Exception as exc:  # the Backend contract: raise to be asked again
            result = exc.result if isinstance(exc, BackendError) else Result.FAILED
            self.metrics.requests.labels(self.backend.name, str(result)).inc()
            message = (
                f"{action.state.fault}: drained; the {self.backend.name} backend could not ask for "
                f"{'a reboot' if action.state.rung == 'reboot' else 'a new instance'} ({result}): {exc}; asked "
                "again at the next pass"
            )
            log.warning("node %s: %s", action.node, message, extra={"node": action.node, "result": str(result)})
            await self._tell(planner.Action(action.node, Kind.REQUEST, "ReplacementRequestFailed", message))
            return None
        if outcome.result:
            self.metrics.requests.labels(self.backend.name, outcome.result).inc()
        return outcome.message

    def _patch(self, node: NodeView, action: Action) -> dict[str, Any]:
        annotations: dict[str, str | None] = {
            remediation.STATE_ANNOTATION: action.state.dump() if action.state is not None else None
        }
        if action.request is not None:
            annotations[remediation.REQUEST_ANNOTATION] = json.dumps(dict(action.request), sort_keys=True)
        if action.kind in (Kind.RELEASE, Kind.CANCEL):
            annotations[remediation.APPROVED_ANNOTATION] = None  # an approval is for one workflow
        if action.kind is Kind.RELEASE:
            annotations[remediation.REQUEST_ANNOTATION] = None
        # the resourceVersion makes the patch conditional: refused (409) when the Node changed since the view
        body: dict[str, Any] = {"metadata": {"resourceVersion": action.resource_version, "annotations": annotations}}
        spec: dict[str, Any] = {}
        if action.cordon is True:
            spec["unschedulable"] = True
        elif action.cordon is False:
            spec["unschedulable"] = None
        if action.taint is not None:
            # a Node's taints are an atomic list: the whole list is written, ours added or left out
            others = [dict(t) for t in node.taints if t.get("key") != remediation.TAINT]
            if action.taint:
                rung = action.state.rung if action.state is not None else ""
                others.append({"key": remediation.TAINT, "value": rung, "effect": "NoSchedule"})
            spec["taints"] = others or None
        if spec:
            body["spec"] = spec
        return body

    async def _drain(self, action: Action) -> None:
        plan = action.drain
        if plan is None:
            return
        told: list[str] = []
        for op in plan.ops:
            outcome, detail = await drain.execute(self.api, op)
            self.metrics.pods.labels(str(op.op), str(outcome)).inc()
            pod = op.pod
            if outcome in (drain.Outcome.EVICTED, drain.Outcome.DELETED):
                verb = "evicted" if outcome is drain.Outcome.EVICTED else "deleted"
                message = f"{verb} from node {action.node}, whose Neuron fault is being remediated: {op.why}"
                log.info("pod %s %s", pod.key, message, extra={"node": action.node, "pod": pod.key})
                bare = op.op is drain.Op.DELETE and pod.controller is None
                reason = "RemediationPodDeleted" if outcome is drain.Outcome.DELETED else "RemediationPodEvicted"
                await self._event(_pod_ref(pod), reason, message, warning=bare)
                if bare:
                    await self._event(
                        _node_ref(action.node), reason, f"pod {pod.key} {verb}: {op.why}; nothing recreates it"
                    )
            elif outcome is drain.Outcome.BLOCKED:
                told.append(f"{pod.key}: eviction refused for now ({detail})")
            elif outcome is drain.Outcome.FAILED:
                told.append(f"{pod.key}: {op.op} failed ({detail})")
        self.metrics.steps.labels(str(Kind.DRAIN), "done").inc()
        if told or plan.waiting:
            waiting = [f"{p.key}: {why}" for p, why in plan.waiting]
            message = f"{action.message}; " + "; ".join([*told, *waiting])[:900]
            await self._tell(planner.Action(action.node, Kind.DRAIN, "RemediationDrainWaiting", message))

    async def _tell(self, action: Action) -> None:
        """A hold, or a drain that waits: an Event when its message differs from the last one told."""
        if self.told.get(action.node) == action.message:
            return
        self.told[action.node] = action.message
        log.info("node %s: %s", action.node, action.message, extra={"node": action.node, "reason": action.reason})
        await self._event(_node_ref(action.node), action.reason, action.message, warning=action.warning)

    async def _event(self, involved: Mapping[str, str], reason: str, message: str, *, warning: bool = True) -> None:
        now = self.wall_clock()
        namespace = involved.get("namespace") or self.config.event_namespace
        name = news_name(involved["name"], involved["kind"], involved["name"], reason, message)
        event = event_object(
            name=name, namespace=namespace, involved=involved, reason=reason, message=message[:1024],
            type="Warning" if warning else "Normal", count=1, first=now, last=now,
            component=COMPONENT, instance=self.config.identity,
        )  # fmt: skip
        try:
            await create_or_count(self.api, event, now)
        except ApiError as exc:  # an Event lost is a message lost, never a step undone
            log.warning("could not write the Event %s on %s %s: %s", reason, involved["kind"], involved["name"], exc)

    # -- loops -----------------------------------------------------------------------------------------
    async def remediate(self) -> None:
        while not self.stop.is_set():
            await wait_any(self.stop, self.changed, timeout=self.config.resync)
            self.changed.clear()
            if self.stop.is_set():
                return
            leading = self.leader.leading
            self.metrics.leader.set(1 if leading else 0)
            if not leading or not self.synced:
                continue
            try:
                await self.run_pass()
            except ApiError as exc:
                log.warning("a pass over the fleet stopped: %s; trying again at the next", exc)
            # a burst of watch events (our own patches among them) makes one more pass, not one each
            await asyncio.sleep(0.2)

    async def run(self) -> int:
        log.info(
            "remediating Neuron nodes",
            extra={
                "leader_elect": self.config.leader_elect,
                "identity": self.config.identity,
                "max_nodes": self.config.max_nodes,
                "max_percent": self.config.max_percent,
                "approval": self.config.approval,
                "replacement_backend": self.backend.name,
            },
        )
        loops: dict[str, Loop] = {
            "nodes": lambda: self.node_source.run(self.stop),
            "pods": lambda: self.pod_source.run(self.stop),
            "leader-election": lambda: self.leader.run(self.stop),
            "remediate": self.remediate,
        }
        return await run_service(self.http, self.supervisor, self.stop, lambda: loops, release=self.release)

    async def release(self) -> None:
        await self.backend.close()
        await self.api.close()


def _node_ref(name: str) -> dict[str, str]:
    return {"apiVersion": "v1", "kind": "Node", "name": name}


def _pod_ref(pod: PodView) -> dict[str, str]:
    return {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid}
