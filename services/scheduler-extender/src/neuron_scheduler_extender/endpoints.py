"""The extender's HTTP verbs, as kube-scheduler calls them: POST /filter, /prioritize, /bind and /preempt.

Every request is answered, never crashed on: a malformed one gets the protocol's `Error` (filter,
bind) or a 400 (prioritize, whose errors kube-scheduler ignores), with a message saying what is wrong.

Only the leader decides. Both replicas are Ready (a Deployment, `helm --wait` and a
PodDisruptionBudget all count on every replica becoming Ready), so the Service may send a request
to the standby: the standby forwards it to the URL the leader wrote into the Lease and relays the
answer. Should the leader not answer, the standby answers filter and prioritize from its own view
(the leader's bind checks again) and refuses bind, which kube-scheduler retries.

Bind is where the decision becomes authoritative. kube-scheduler filters the next pod as soon as
it has *assumed* the previous one, before that pod's binding reaches the API server, let alone
the watch; two filters can therefore pass the same free silicon. Bind is the one point every pod
goes through one at a time here: it asks the question again on the view as it is now, including
the pods this extender bound a moment ago that no watch has shown yet, and only then writes the
Binding. A pod that no longer fits is refused with an `Error`; kube-scheduler un-reserves it and
schedules it again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import ssl
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import orjson
from aiohttp import web

from neuron_common.kube import ApiError
from neuron_model.placement import PodRequest
from neuron_scheduler_extender import decisions, protocol
from neuron_scheduler_extender.groups import GroupError, GroupRequest, group_request
from neuron_scheduler_extender.metrics import Metrics
from neuron_scheduler_extender.pods import (
    PodError,
    ResourceNames,
    neuron_request,
    nominated_node,
    pod_key,
    pod_priority,
    pod_uid,
    scheduler_name,
)
from neuron_scheduler_extender.protocol import BindingArgs, ProtocolError
from neuron_scheduler_extender.state import ClusterView

log = logging.getLogger(__name__)

REMEMBERED_REQUESTS = 10_000  # pods filtered lately, so bind need not fetch them again


FORWARDED = "X-Neuron-Extender-Forwarded"  # on a forwarded request: never forwarded twice
FORWARD_TIMEOUT = 5.0
# Largest body a verb reads. kube-scheduler sends node names only (nodeCacheCapable: the chart's
# setting), about 40 bytes a node: 4 MiB is some 100,000 nodes. A binding is a few hundred bytes.
# Preemption: at most some hundred candidate nodes (kube-scheduler's dry run stops at max(100, 10 %)
# of the nodes), each with its victims' UIDs, about 50 bytes a victim.
MAX_BODY = {"filter": 4 * 1024**2, "prioritize": 4 * 1024**2, "bind": 64 * 1024, "preempt": 4 * 1024**2}


class Leadership(Protocol):
    @property
    def leading(self) -> bool: ...

    @property
    def leader_url(self) -> str: ...


class Forwarder:
    """Relays a request to the leader (with mutual TLS, this replica's certificate as the client's)."""

    def __init__(
        self, timeout: float = FORWARD_TIMEOUT, ssl_context: ssl.SSLContext | None = None, server_name: str = ""
    ) -> None:
        self.timeout = timeout
        self.ssl_context = ssl_context
        self.server_name = server_name
        self._session: aiohttp.ClientSession | None = None

    async def post(self, url: str, verb: str, body: bytes) -> tuple[int, bytes]:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        tls: dict[str, Any] = {}
        if self.ssl_context is not None:
            tls["ssl"] = self.ssl_context
            if self.server_name:
                tls["server_hostname"] = self.server_name
        try:
            async with self._session.post(
                f"{url}/{verb}",
                data=body,
                headers={FORWARDED: "1", "Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                **tls,
            ) as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(0, f"{type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


@dataclass(eq=False)
class _Wave:
    """Writes for one key decided one after another with the same shape: written at once."""

    shape: Hashable
    after: list[asyncio.Future[None]]  # the ends of the wave before: this one writes once they are done
    ends: list[asyncio.Future[None]] = field(default_factory=list)


class InOrder:
    """Runs the writes for one key in the order they were asked for.

    The view simulates the pods in flight on a node in the order this extender bound them, and the
    node admits them in the order their bindings reach the API server; two Binding POSTs to one
    node in flight at once could land the other way round, and the allocator's choice for the
    second can depend on what the first took. So a node's bindings are written in the order they
    were decided; bindings to different nodes still overlap. Writes of the same `shape` (the pod
    request) decided one after another form a wave written at once: the allocator hands identical
    requests the same sets whichever lands first, so their order cannot matter, and a node packed
    with small pods would otherwise make each binding wait for every one before it, past
    kube-scheduler's bind timeout when the API server is slow."""

    def __init__(self) -> None:
        self._tail: dict[str, _Wave] = {}  # key -> its latest wave

    async def run(self, key: str, write: Callable[[], Awaitable[None]], shape: Hashable | None = None) -> None:
        # Nothing awaits before the write joins its wave: the caller's order is the queue's.
        wave = self._tail.get(key)
        if wave is None or shape is None or wave.shape != shape:
            wave = self._tail[key] = _Wave(shape, list(wave.ends) if wave is not None else [])
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        wave.ends.append(done)
        try:
            if wave.after:
                await asyncio.wait(wave.after)  # however they ended
            await write()
        finally:
            done.set_result(None)
            if self._tail.get(key) is wave and all(end.done() for end in wave.ends):
                del self._tail[key]

    @property
    def busy(self) -> bool:
        """Whether some write is queued or running."""
        return bool(self._tail)


# (namespace, name) -> the Pod object; (binding) -> None. Both raise kube.ApiError.
PodReader = Callable[[str, str], Awaitable[dict[str, Any]]]
Binder = Callable[[BindingArgs], Awaitable[None]]


@dataclass
class Endpoints:
    view: ClusterView
    names: ResourceNames
    metrics: Metrics
    leadership: Leadership
    read_pod: PodReader
    bind_pod: Binder
    synced: Callable[[], bool]
    forwarder: Forwarder = field(default_factory=Forwarder)
    scheduler_names: frozenset[str] = frozenset({"neuron-scheduler"})  # the schedulerNames whose pods /bind binds
    require_client_cert: bool = False  # mutual TLS: the verbs answer only a verified client certificate
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
    monotonic: Callable[[], float] = time.monotonic
    # uid -> (key, request, schedulerName, UltraServer group, priority)
    _requests: OrderedDict[str, tuple[str, PodRequest, str, GroupRequest | None, int]] = field(
        default_factory=OrderedDict
    )
    _in_order: InOrder = field(default_factory=InOrder)

    def add_routes(self, app: web.Application) -> None:
        for verb, answer in (
            ("filter", self.filter),
            ("prioritize", self.prioritize),
            ("bind", self.bind),
            ("preempt", self.preempt),
        ):
            app.router.add_post(f"/{verb}", self._handler(verb, answer))

    def _handler(
        self, verb: str, answer: Callable[[bytes], Awaitable[web.Response]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        """The verb's route: timed, and handing `answer` the body only when this replica answers it."""

        async def handle(request: web.Request) -> web.Response:
            with self.metrics.latency.labels(verb).time():
                body = await self._body_to_answer(verb, request)
                return body if isinstance(body, web.Response) else await answer(body)

        return handle

    # --- filter ----------------------------------------------------------------------------------
    async def filter(self, body: bytes) -> web.Response:
        try:
            args, pod, group = self._extender_args(body)
        except (ProtocolError, PodError, GroupError) as exc:
            return self._error("filter", protocol.filter_error(f"neuron-scheduler-extender: {exc}"))
        if not self.synced():
            return self._error(
                "filter",
                protocol.filter_error(
                    "neuron-scheduler-extender has not read the cluster's NeuronNodes and pods yet; retrying"
                ),
            )
        key = pod_key(args.pod) if group is not None else ""
        who = (pod_key(args.pod), pod_priority(args.pod))
        nominated = nominated_node(args.pod)
        if nominated:
            self.view.nominated(who[0], nominated)
        outcome = decisions.filter_nodes(self.view, pod, args.node_names, self.now(), group, key, who)
        refused_by_kind = Counter(r.kind for r in outcome.unresolvable.values())
        for kind, count in refused_by_kind.items():
            self.metrics.nodes_refused.labels(str(kind)).inc(count)
        log.debug(
            "filter %s: %d of %d nodes pass",
            args.pod_label,
            len(outcome.passed),
            len(args.node_names),
            extra={"pod": args.pod_label, "passed": len(outcome.passed), "nodes": len(args.node_names)},
        )
        return _reply(
            protocol.filter_result(
                args,
                outcome.passed,
                {n: r.reason for n, r in outcome.unresolvable.items()},
            )
        )

    # --- prioritize ------------------------------------------------------------------------------
    async def prioritize(self, body: bytes) -> web.Response:
        try:
            args, pod, group = self._extender_args(body)
        except (ProtocolError, PodError, GroupError) as exc:
            # kube-scheduler ignores a failed prioritize: the other scores decide alone
            self.metrics.errors.labels("prioritize").inc()
            return _reply({"error": str(exc)}, status=400)
        scores = decisions.prioritize(self.view, pod, args.node_names, self.now(), group)
        return _reply(protocol.priority_list(scores))

    # --- preempt ---------------------------------------------------------------------------------
    async def preempt(self, body: bytes) -> web.Response:
        """kube-scheduler's candidate nodes, kept where evicting pods of lower priority frees a valid
        set for the pod, with the victims that do (`decisions.preempt`). An error is a non-200
        answer (the result has no Error field): kube-scheduler then fails this attempt's
        preemption and tries again at the next. Before the view is read nothing is evicted."""
        try:
            args = protocol.preemption_args(_json(body))
            pod, group = self._request_of(args.pod), group_request(args.pod)
        except (ProtocolError, PodError, GroupError) as exc:
            self.metrics.errors.labels("preempt").inc()
            log.warning("preempt: %s", exc)
            return _reply({"error": str(exc)}, status=400)
        if not self.synced():
            self.metrics.preemption_nodes.labels("dropped").inc(len(args.nodes))
            return _reply(protocol.preemption_result({}))
        key = pod_key(args.pod)
        answer = decisions.preempt(
            self.view, pod, pod_priority(args.pod), args.nodes, self.now(), group, key if group else "", key
        )
        for node, asked in args.nodes.items():
            given = answer.get(node)
            result = "dropped" if given is None else "kept" if set(given.uids) == set(asked.uids) else "changed"
            self.metrics.preemption_nodes.labels(result).inc()
        log.info(
            "preempt %s: %d of %d candidate nodes kept",
            args.pod_label,
            len(answer),
            len(args.nodes),
            extra={"pod": args.pod_label, "kept": len(answer), "nodes": len(args.nodes)},
        )
        return _reply(protocol.preemption_result(answer))

    # --- bind ------------------------------------------------------------------------------------
    async def bind(self, body: bytes) -> web.Response:
        try:
            args = protocol.binding_args(_json(body))
        except ProtocolError as exc:
            return self._bind_failure("malformed", f"neuron-scheduler-extender: {exc}")
        if not self.leadership.leading:
            leader = self.leadership.leader_url
            return self._bind_failure(
                "not_leader",
                "this neuron-scheduler-extender replica is not the leader and "
                + (f"the leader at {leader} did not answer" if leader else "no leader is elected")
                + "; retrying",
            )
        if not self.synced():
            return self._bind_failure("not_ready", "neuron-scheduler-extender has not read the cluster yet; retrying")
        if not args.pod_uid:
            return self._bind_failure("malformed", "neuron-scheduler-extender: ExtenderBindingArgs.PodUID: missing")
        found = await self._pod_request(args)
        if isinstance(found, str):
            return self._bind_failure("unknown_pod", found)
        pod, pod_scheduler, group, priority = found
        if pod_scheduler not in self.scheduler_names:
            names = " or ".join(repr(n) for n in sorted(self.scheduler_names))
            return self._bind_failure(
                "foreign_scheduler",
                f"pod {args.key} is scheduled by {pod_scheduler!r}, "
                f"not {names}: this extender binds only its scheduler's pods",
            )
        if not (pod.effective.devices or pod.effective.cores):
            return self._bind_failure(
                "no_neuron_request", f"pod {args.key} asks for no Neuron resource: not this extender's to bind"
            )
        # No await from the check to `assume`: no other bind can slip in between.
        refused = decisions.bind_refusal(self.view, pod, args.key, args.node, self.now(), group, priority)
        if refused is not None:
            log.info(
                "refusing to bind %s to %s: %s",
                args.key,
                args.node,
                refused.reason,
                extra={"pod": args.key, "node": args.node, "reason": str(refused.kind)},
            )
            return self._bind_failure(
                "no_longer_fits", f"pod {args.key} no longer fits node {args.node}: {refused.reason}"
            )
        self.view.assume(args.key, args.pod_uid, args.node, pod, self.monotonic(), group)
        try:
            await self._in_order.run(args.node, lambda: self.bind_pod(args), pod)
        except ApiError as exc:
            self.view.forget(args.key, args.pod_uid)
            return self._bind_failure("api_error", f"binding {args.key} to {args.node} failed: {exc}")
        self.metrics.pods_bound.inc()
        effective = pod.effective
        log.info(
            "bound %s to %s",
            args.key,
            args.node,
            extra={"pod": args.key, "node": args.node, "devices": effective.devices, "cores": effective.cores},
        )
        return _reply(protocol.binding_result())

    async def _body_to_answer(self, verb: str, request: web.Request) -> bytes | web.Response:
        """The body of a verb this replica answers; else the response to send: the refusal of the
        request (`_read`), or the leader's answer to it (`_to_leader`)."""
        body = await self._read(verb, request)
        if isinstance(body, web.Response):
            return body
        relayed = await self._to_leader(verb, request, body)
        return body if relayed is None else relayed

    def _extender_args(self, body: bytes) -> tuple[protocol.ExtenderArgs, PodRequest, GroupRequest | None]:
        """What /filter and /prioritize are asked: the arguments, the pod's Neuron request and its
        UltraServer group; raises ProtocolError, PodError or GroupError."""
        args = protocol.extender_args(_json(body))
        return args, self._request_of(args.pod), group_request(args.pod)

    async def _to_leader(self, verb: str, request: web.Request, body: bytes) -> web.Response | None:
        """The leader's answer, when this replica is not the leader; None: answer here."""
        if self.leadership.leading or FORWARDED in request.headers:
            return None
        leader = self.leadership.leader_url
        if not leader:
            return None
        try:
            status, payload = await self.forwarder.post(leader, verb, body)
        except ApiError as exc:
            self.metrics.forwarded.labels(verb, "failed").inc()
            log.warning("%s: the leader at %s did not answer (%s); answering here", verb, leader, exc.message)
            return None
        self.metrics.forwarded.labels(verb, "relayed").inc()
        return web.Response(status=status, body=payload, content_type="application/json")

    async def _read(self, verb: str, request: web.Request) -> bytes | web.Response:
        """The body, or the refusal: no verified client certificate (TLS on), or over the verb's
        limit (answered 413 from the Content-Length before the body is read, or when it passes it)."""
        if self.require_client_cert and not has_client_certificate(request.transport):
            return self._refuse(verb, "unauthenticated", 403, "a client certificate the extender's CA issued")
        limit = MAX_BODY[verb]
        if request.content_length is not None and request.content_length > limit:
            return self._refuse(verb, "too_large", 413, f"a body of at most {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > limit:
                return self._refuse(verb, "too_large", 413, f"a body of at most {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def _refuse(self, verb: str, reason: str, status: int, needs: str) -> web.Response:
        self.metrics.refused_requests.labels(verb, reason).inc()
        log.warning("%s refused (%s): it needs %s", verb, reason, needs, extra={"verb": verb, "reason": reason})
        return web.Response(status=status, text=f"neuron-scheduler-extender: {verb} needs {needs}\n")

    async def _pod_request(self, args: BindingArgs) -> tuple[PodRequest, str, GroupRequest | None, int] | str:
        """The pod's request, schedulerName, group and priority, remembered from filter or read from
        the API server; or why not."""
        remembered = self._requests.get(args.pod_uid)
        if remembered is not None and remembered[0] == args.key:
            return remembered[1], remembered[2], remembered[3], remembered[4]
        try:
            obj = await self.read_pod(args.pod_namespace, args.pod_name)
        except ApiError as exc:
            return f"cannot read pod {args.key}: {exc}"
        if args.pod_uid and pod_uid(obj) != args.pod_uid:
            return f"pod {args.key} was replaced (uid {pod_uid(obj)}, binding asked for {args.pod_uid})"
        try:
            return self._request_of(obj), scheduler_name(obj), group_request(obj), pod_priority(obj)
        except (PodError, GroupError) as exc:
            return f"pod {args.key}: {exc}"

    def _request_of(self, pod: Any) -> PodRequest:
        result = neuron_request(pod, self.names)
        uid = pod_uid(pod)
        if uid:
            try:
                group = group_request(pod)
            except GroupError:
                group = None  # filter refuses it with the reason
            self._requests[uid] = (pod_key(pod), result, scheduler_name(pod), group, pod_priority(pod))
            self._requests.move_to_end(uid)
            while len(self._requests) > REMEMBERED_REQUESTS:
                self._requests.popitem(last=False)
        return result

    def _error(self, verb: str, body: dict[str, Any]) -> web.Response:
        self.metrics.errors.labels(verb).inc()
        log.warning("%s: %s", verb, body.get("Error"))
        return _reply(body)

    def _bind_failure(self, reason: str, message: str) -> web.Response:
        self.metrics.bind_failures.labels(reason).inc()
        if reason != "no_longer_fits":
            self.metrics.errors.labels("bind").inc()
            log.warning("bind: %s", message, extra={"reason": reason})
        return _reply(protocol.binding_result(message))


def _json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"the request body is not JSON: {exc}") from None


def _reply(answer: Any, status: int = 200) -> web.Response:
    """`answer` as JSON; orjson, as a filter's answer about a thousand nodes is sent per pod scheduled."""
    return web.Response(status=status, body=orjson.dumps(answer), content_type="application/json")


def has_client_certificate(transport: Any) -> bool:
    """Whether the connection presented a client certificate (with CERT_OPTIONAL, one the CA did
    not issue fails the handshake, so any certificate seen here is verified)."""
    if transport is None:
        return False
    return bool(transport.get_extra_info("peercert"))
