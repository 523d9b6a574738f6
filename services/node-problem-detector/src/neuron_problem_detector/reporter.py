"""Talks to the API server: NodeConditions, Events, and optional remediation.

- Conditions go to `nodes/<name>/status` as a strategic merge patch, which merges the
  conditions list by `type`, so the kubelet's own conditions survive (a JSON merge patch
  would replace the whole list). `lastTransitionTime` changes only with the status; the
  heartbeat re-sends the conditions every `--heartbeat`.
- Events are on the Node (involvedObject the node), de-duplicated (a repeat within ten
  minutes bumps `count` on the existing Event) and rate-limited (a token bucket).
- While the API server is unreachable the latest desired conditions and up to
  `--max-pending-events` Events are kept in memory (the oldest Events are dropped first, counted) and
  delivered with back-off when it returns. An Event create answered 409 (a create whose reply
  was lost, retried under its deterministic name) counts as delivered; an Event the API server
  keeps refusing (403, 422, ...) is dropped after `EVENT_ATTEMPTS` tries and counted, so one bad
  Event never holds up the ones behind it, and Events never hold up conditions or remediation.
  The de-duplication memory keeps at most `DEDUPE_ENTRIES` Events, none older than its window.
- Remediation (off by default): a `NoSchedule` taint and/or cordon while a condition is unhealthy
  (never `NeuronHealthSourcesMissing`, which is about the detector's sources: `remediates=False`),
  removed when it clears; a cordon the detector did not make is never undone; never a drain.
- `AcceleratedHardwareReady` (`--accelerated-hardware-condition=auto`) is left to EKS's node monitoring
  agent wherever that agent runs: its other conditions on the Node say so, read at start and at every
  heartbeat. Two writers of one condition would flip it at each other's heartbeat, and a node that
  flips is one Karpenter's repair toleration never sees False for long enough.

Every call goes through neuron_common.kube, the services' one API client: objects stay plain JSON,
and no call waits in a thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from neuron_common.backoff import Backoff
from neuron_common.kube import MERGE_PATCH, STRATEGIC_MERGE_PATCH, ApiError, event_object, rfc3339
from neuron_model import node_health, remediation
from neuron_problem_detector.config import Reporting
from neuron_problem_detector.detector import ConditionStatus

log = logging.getLogger(__name__)

TAINT_KEY = node_health.UNHEALTHY_TAINT
CORDON_ANNOTATION = "neuron.aws/cordoned-by"
SELF = "neuron-problem-detector"
DEDUPE_WINDOW = 600.0
DEDUPE_ENTRIES = 1000
EVENT_ATTEMPTS = 5


@dataclass
class PendingEvent:
    reason: str
    message: str
    type: str  # Normal or Warning
    first: float
    last: float
    count: int = 1
    attempts: int = 0

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.reason}\0{self.message}".encode()).hexdigest()[:16]


class TokenBucket:
    def __init__(self, burst: int, per_second: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.rate, self.clock = burst, per_second, clock
        self.tokens = float(burst)
        self.last = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class NodeApi(Protocol):
    """What the reporter needs of neuron_common.kube.Api; each call raises its ApiError."""

    async def get(self, path: str) -> dict[str, Any]: ...

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def patch(self, path: str, body: Mapping[str, Any], content_type: str) -> dict[str, Any]: ...


class Reporter:
    def __init__(
        self,
        api: NodeApi,
        node: str,
        source: str,
        reporting: Reporting,
        *,
        event_burst: int = 25,
        event_rate: float = 0.1,
    ) -> None:
        """`api`'s own timeout bounds each call (the detector's is config.API_TIMEOUT)."""
        self.api = api
        self.node = node
        self.source = source
        self.reporting = reporting
        self._node_path = f"/api/v1/nodes/{node}"
        self._events_path = f"/api/v1/namespaces/{reporting.event_namespace}/events"
        self.desired: dict[str, ConditionStatus] = {}
        self.pending: deque[PendingEvent] = deque(maxlen=reporting.max_pending_events)
        self.dropped_events = 0  # the oldest, while the API server was away
        self.failed_events = 0  # refused EVENT_ATTEMPTS times
        self._in_flight: PendingEvent | None = None  # taken from `pending` while its call is on its way
        # key -> (event name, last sent, count), oldest first; bounded by DEDUPE_ENTRIES
        self.sent: OrderedDict[str, tuple[str, float, int]] = OrderedDict()
        self.bucket = TokenBucket(event_burst, event_rate)
        self.api_up = False
        self.api_errors: dict[str, int] = {}
        self.synced_conditions: dict[str, ConditionStatus] = {}
        self._last_heartbeat = 0.0
        self._node_uid: str | None = None
        self._remediated: bool | None = None
        # None: not known yet; True: EKS's node monitoring agent runs here and owns AcceleratedHardwareReady
        self.agent_owns_accelerated_hardware: bool | None = None
        self._backoff = Backoff(initial=0.5, maximum=30.0)
        self.wake = asyncio.Event()

    # -- inputs ----------------------------------------------------------------------------------
    def set_conditions(self, conditions: list[ConditionStatus]) -> None:
        new = {c.type: c for c in conditions}
        if new != self.desired:
            self.desired = new
            self.wake.set()

    @property
    def wanted(self) -> dict[str, ConditionStatus]:
        """The conditions this detector writes: the desired ones less any another agent owns."""
        if self.agent_owns_accelerated_hardware:
            return {t: c for t, c in self.desired.items() if t != node_health.ACCELERATED_HARDWARE_CONDITION}
        return self.desired

    @property
    def unhealthy(self) -> bool:
        """What --taint and --cordon follow: a condition about the hardware (not NeuronHealthSourcesMissing)."""
        return any(c.unhealthy and c.remediates for c in self.desired.values())

    def event(self, reason: str, message: str, warning: bool = True) -> None:
        now = time.time()
        for pending in self.pending:
            if pending.reason == reason and pending.message == message:
                pending.count += 1
                pending.last = now
                return
        if len(self.pending) == self.pending.maxlen:
            self.dropped_events += 1
        self.pending.append(PendingEvent(reason, message, "Warning" if warning else "Normal", now, now))
        self.wake.set()

    def _requeue(self, event: PendingEvent) -> None:
        """An Event not delivered goes back to the front: it is the oldest, so a queue that filled up
        while it was on its way drops it."""
        if len(self.pending) == self.pending.maxlen:
            self.dropped_events += 1
            return
        self.pending.appendleft(event)

    @property
    def up_to_date(self) -> bool:
        """The API server holds everything decided so far: the conditions, the taint or cordon, every
        Event. Tests wait on this where they would otherwise sleep and hope the reporter had run."""
        if not self.api_up or self.pending or self._in_flight or self.synced_conditions != self.wanted:
            return False
        if self.reporting.taint or self.reporting.cordon:
            return self._remediated == self.unhealthy
        return True

    # -- API calls -------------------------------------------------------------------------------------
    async def _read_node(self) -> dict[str, Any]:
        return await self.api.get(self._node_path)

    async def current_conditions(self) -> dict[str, dict[str, Any]]:
        node = await self._read_node()
        self._node_uid = (node.get("metadata") or {}).get("uid")
        current = {c["type"]: c for c in (node.get("status") or {}).get("conditions") or [] if "type" in c}
        if self.reporting.accelerated_hardware_condition == "auto":
            owned = any(t in current for t in node_health.EKS_NODE_MONITORING_AGENT_CONDITIONS)
            if owned != self.agent_owns_accelerated_hardware:
                log.info(
                    "%s: %s",
                    node_health.ACCELERATED_HARDWARE_CONDITION,
                    "left to EKS's node monitoring agent, which runs on this node"
                    if owned
                    else "written by this detector (EKS's node monitoring agent does not run on this node)",
                    extra={"node": self.node},
                )
            self.agent_owns_accelerated_hardware = owned
        else:
            self.agent_owns_accelerated_hardware = False
        return current

    async def _patch_conditions(self, conditions: dict[str, ConditionStatus]) -> None:
        now = rfc3339(time.time())
        body = {
            "status": {
                "conditions": [
                    {
                        "type": c.type,
                        "status": c.status,
                        "reason": c.reason,
                        "message": c.message,
                        "lastTransitionTime": rfc3339(c.last_transition),
                        "lastHeartbeatTime": now,
                    }
                    for c in conditions.values()
                ]
            }
        }
        await self.api.patch(f"{self._node_path}/status", body, STRATEGIC_MERGE_PATCH)

    def _remember(self, key: str, name: str, count: int) -> None:
        now = time.time()
        self.sent[key] = (name, now, count)
        self.sent.move_to_end(key)
        while self.sent and (
            len(self.sent) > DEDUPE_ENTRIES or now - next(iter(self.sent.values()))[1] >= DEDUPE_WINDOW
        ):
            self.sent.popitem(last=False)

    async def _send_event(self, e: PendingEvent) -> None:
        previous = self.sent.get(e.key)
        if previous is not None and time.time() - previous[1] < DEDUPE_WINDOW:
            name, _, count = previous
            body = {"count": count + e.count, "lastTimestamp": rfc3339(e.last), "message": e.message}
            try:
                await self.api.patch(f"{self._events_path}/{name}", body, MERGE_PATCH)
                self._remember(e.key, name, count + e.count)
                return
            except ApiError as exc:
                if exc.status != 404:
                    raise
                # the Event expired (the API server keeps them an hour by default): a new one
                del self.sent[e.key]
        name = f"{self.node}.{e.key}.{int(e.first * 1000):x}"
        involved = {"kind": "Node", "name": self.node, "apiVersion": "v1"}
        if self._node_uid:
            involved["uid"] = self._node_uid
        event = event_object(
            name=name, namespace=self.reporting.event_namespace, involved=involved, reason=e.reason,
            message=e.message, type=e.type, count=e.count, first=e.first, last=e.last, component=self.source,
            instance=self.node, host=self.node,
        )  # fmt: skip
        try:
            await self.api.create(self._events_path, event)
        except ApiError as exc:
            if exc.status != 409:
                raise
            # AlreadyExists: an earlier create of this very Event landed though its reply was lost
        self._remember(e.key, name, e.count)

    def _cancelled(self, node: Mapping[str, Any]) -> bool:
        """The remediation controller's workflow for this fault was cancelled on this boot (an admin
        uncordoned the node, or opted it out): the admin's word stands, so no cordon again for it."""
        text = ((node.get("metadata") or {}).get("annotations") or {}).get(remediation.STATE_ANNOTATION)
        if not text:
            return False
        try:
            state = remediation.load(text)
        except remediation.StateError:
            return False
        boot = ((node.get("status") or {}).get("nodeInfo") or {}).get("bootID")
        cancelled = (
            state.phase is remediation.Phase.CANCELLED
            and state.boot_id == boot
            and any(c.reason == state.reason for c in self.desired.values())
        )
        if cancelled:
            log.warning(
                "remediation: not cordoning node %s: its workflow for %s was cancelled on this boot (%s)",
                self.node, state.reason, state.why or "uncordoned by an admin",
            )  # fmt: skip
        return cancelled

    async def _remediate(self, unhealthy: bool) -> None:
        node = await self._read_node()
        metadata, spec = node.get("metadata") or {}, node.get("spec") or {}
        taints: list[dict[str, Any]] = list(spec.get("taints") or [])
        has_taint = any(t.get("key") == TAINT_KEY for t in taints)
        annotations = dict(metadata.get("annotations") or {})
        patch: dict[str, Any] = {"metadata": {"resourceVersion": metadata.get("resourceVersion")}}
        # a merge patch replaces the whole list: the other taints go back as they were read
        if self.reporting.taint and unhealthy and not has_taint:
            taints.append({"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"})
            patch.setdefault("spec", {})["taints"] = taints
        if has_taint and not unhealthy:
            patch.setdefault("spec", {})["taints"] = [t for t in taints if t.get("key") != TAINT_KEY]
        if self.reporting.cordon and unhealthy and not spec.get("unschedulable") and not self._cancelled(node):
            patch.setdefault("spec", {})["unschedulable"] = True
            patch["metadata"]["annotations"] = {CORDON_ANNOTATION: SELF}
        if not unhealthy and annotations.get(CORDON_ANNOTATION) == SELF:
            patch.setdefault("spec", {})["unschedulable"] = False  # only a cordon we made is undone
            patch["metadata"]["annotations"] = {CORDON_ANNOTATION: None}
        if "spec" in patch or "annotations" in patch["metadata"]:
            # resourceVersion makes this a compare-and-swap: a concurrent change fails with 409
            await self.api.patch(self._node_path, patch, MERGE_PATCH)
            log.warning(
                "remediation: node %s %s",
                self.node,
                "tainted/cordoned" if unhealthy else "taint/cordon removed",
                extra={"taint": self.reporting.taint, "cordon": self.reporting.cordon},
            )

    # -- the loop --------------------------------------------------------------------------------
    async def sync_once(self) -> bool:
        """One attempt to bring the API server up to date; False when it failed."""
        try:
            due = time.monotonic() - self._last_heartbeat >= self.reporting.heartbeat
            if self._node_uid is None or (due and self.reporting.accelerated_hardware_condition == "auto"):
                await self.current_conditions()  # at each heartbeat too: has the agent come or gone?
            if self.wanted and (self.wanted != self.synced_conditions or due):
                # what is sent is what counts as synced: a change made while the patch is on its way
                # (the loop keeps deciding) is sent by the next attempt, not marked sent unsent
                sending = dict(self.wanted)
                await self._patch_conditions(sending)
                self.synced_conditions = sending
                self._last_heartbeat = time.monotonic()
            if self.reporting.taint or self.reporting.cordon:  # before the Events: remediation never waits on them
                unhealthy = self.unhealthy
                if unhealthy != self._remediated:
                    await self._remediate(unhealthy)
                    self._remediated = unhealthy
            while self.pending and self.bucket.take():
                # Out of the queue while on its way: a repeat meanwhile is a count not yet sent (merged
                # into this one it was lost), and a full queue's oldest is then not this one (dropping it
                # lost the next instead).
                event = self._in_flight = self.pending.popleft()
                done = False
                try:
                    await self._send_event(event)
                    done = True
                except ApiError as exc:
                    if 400 <= exc.status < 500 and exc.status not in (408, 429):
                        event.attempts += 1  # refused, not unreachable: bounded tries
                        if event.attempts >= EVENT_ATTEMPTS:
                            done = True
                            self.failed_events += 1
                            log.error(
                                "Event %s dropped after %d refusals (HTTP %s): %s",
                                event.reason,
                                event.attempts,
                                exc.status,
                                exc.message[:200],
                            )
                            continue
                    raise
                finally:
                    self._in_flight = None
                    if not done:
                        self._requeue(event)
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:  # all mean "try again"
            kind = _error_kind(exc)
            self.api_errors[kind] = self.api_errors.get(kind, 0) + 1
            if self.api_up or sum(self.api_errors.values()) == 1:
                log.warning("API server call failed (%s): %s; keeping state and retrying", kind, str(exc)[:300])
            self.api_up = False
            return False
        if not self.api_up:
            log.info("API server reachable; node %s is up to date", self.node)
        self.api_up = True
        self._backoff.reset()
        return True

    async def run(self, stop: asyncio.Event) -> None:
        from neuron_common.lifecycle import wait_any

        while not stop.is_set():
            self.wake.clear()
            ok = await self.sync_once()
            if ok:
                until_heartbeat = self.reporting.heartbeat - (time.monotonic() - self._last_heartbeat)
                delay = min(max(until_heartbeat, 0.05), 1.0 if self.pending else self.reporting.heartbeat)
            else:
                delay = self._backoff.next_delay()
            await wait_any(stop, self.wake if ok else stop, timeout=delay)


def _error_kind(exc: BaseException) -> str:
    """What `api_errors` counts: the HTTP status, or what kept the answer away (ApiError's status 0
    wraps aiohttp's error: ClientConnectorError, ServerDisconnectedError, TimeoutError, ...)."""
    if isinstance(exc, ApiError):
        if exc.status:
            return f"HTTP {exc.status}"
        exc = exc.__cause__ or exc
    return type(exc).__name__
