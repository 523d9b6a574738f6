"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

Only the leader acts: the scheduler extender's leader alone remembers the pods it bound a moment
ago, and the remediation controller's alone cordons, drains and counts against its breaker. The
leader writes the URL it serves at into the Lease (annotation `LEADER_URL`; the extender's standby
forwards what it receives there), and a standby watches the same sources and takes over when the
lease expires (or at once, when the leader releases it on SIGTERM).
- A replica that finds the lease free, expired or released writes itself in as holder; the write
  carries the lease's resourceVersion, so of two replicas racing, one wins and the other gets 409.
- Expiry is judged by this replica's own clock: the lease is expired when its record has not
  changed for `lease_duration` since this replica first saw it, so clock skew between the
  replicas does not matter.
- The leader renews every `retry_period`; when no renewal has succeeded for `renew_deadline`
  (shorter than `lease_duration`) it stops being the leader *before* another replica can take the
  lease, so there is never a moment with two leaders.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from neuron_common.config import derived, flag, positive_duration, switch
from neuron_common.kube import ApiError
from neuron_common.lifecycle import sleep_or_stop

log = logging.getLogger(__name__)

LEADER_URL = "neuron.aws.com/leader-url"


class LeaseApi(Protocol):
    async def get(self, path: str) -> dict[str, Any]: ...

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def update(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


def micro_time(when: dt.datetime) -> str:
    """metav1.MicroTime's RFC 3339 form with microseconds."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Lease:
    """The Lease the replicas elect on, this replica's name in it, and the timing (client-go's)."""

    namespace: str
    name: str
    identity: str
    duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def collection(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"

    @property
    def path(self) -> str:
        return f"{self.collection}/{self.name}"


@dataclass
class LeaderElector:
    api: LeaseApi
    lease: Lease
    url: str = ""  # where this replica serves; the standby forwards requests to the leader's
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
    on_change: Callable[[bool], None] = lambda leading: None
    _leading: bool = False
    _renewed_at: float = 0.0  # monotonic, last successful write of ourselves as holder
    _observed: tuple[str, str, str] | None = None  # (holder, renewTime, resourceVersion) last seen
    _observed_at: float = 0.0
    _leader_url: str = ""  # the URL the current holder wrote into the lease, as last read
    transitions: int = field(default=0)

    @property
    def leading(self) -> bool:
        """Whether this replica holds the lease now (checked at the moment of asking, so a leader
        cut off from the API server stops counting as one after `renew_deadline`)."""
        if self._leading and self.clock() - self._renewed_at >= self.lease.renew_deadline:
            self._set_leading(False, f"no renewal for {self.lease.renew_deadline:g}s")
        return self._leading

    @property
    def leader_url(self) -> str:
        """Where the leader serves: this replica's own URL while it leads, else the URL the holder
        wrote into the lease while that lease has not expired; "" when no leader is known."""
        if self.leading:
            return self.url
        holder = self._observed[0] if self._observed else ""
        if not holder or holder == self.lease.identity or self.clock() - self._observed_at >= self.lease.duration:
            return ""
        return self._leader_url

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                acquired = await self.try_acquire_or_renew()
            except ApiError as exc:
                acquired = False
                log.warning("lease %s: %s", self.lease, exc)
            if acquired:
                self._renewed_at = self.clock()
                self._set_leading(True, "acquired the lease")
            _ = self.leading  # steps down once the renew deadline has passed without a renewal
            await sleep_or_stop(stop, self.lease.retry_period)
        await self.release()

    async def try_acquire_or_renew(self) -> bool:
        now_wall = micro_time(self.wall_clock())
        try:
            lease = await self.api.get(self.lease.path)
        except ApiError as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.lease.name,
                    "namespace": self.lease.namespace,
                    "annotations": {LEADER_URL: self.url},
                },
                "spec": self._spec(now_wall, now_wall, 0),
            }
            try:
                await self.api.create(self.lease.collection, body)
            except ApiError as create_error:
                if create_error.status == 409:  # another replica created it first
                    return False
                raise
            return True
        spec = lease.get("spec") or {}
        meta = lease.get("metadata") or {}
        holder = str(spec.get("holderIdentity") or "")
        observed = (holder, str(spec.get("renewTime") or ""), str(meta.get("resourceVersion") or ""))
        if observed != self._observed:
            self._observed, self._observed_at = observed, self.clock()
        annotations = meta.get("annotations") or {}
        self._leader_url = str(annotations.get(LEADER_URL) or "") if holder != self.lease.identity else self.url
        if holder and holder != self.lease.identity and self.clock() - self._observed_at < self.lease.duration:
            self._set_leading(False, f"the lease is held by {holder}")
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.lease.identity:
            acquired = str(spec.get("acquireTime") or now_wall)
        else:
            acquired, transitions = now_wall, transitions + 1
        annotations = dict(meta.get("annotations") or {}, **{LEADER_URL: self.url})
        updated = dict(
            lease, metadata=dict(meta, annotations=annotations), spec=self._spec(acquired, now_wall, transitions)
        )
        try:
            result = await self.api.update(self.lease.path, updated)
        except ApiError as exc:
            if exc.status == 409:  # someone wrote it since we read it
                return False
            raise
        result_meta = result.get("metadata") or {}
        self._observed = (self.lease.identity, now_wall, str(result_meta.get("resourceVersion") or ""))
        self._observed_at = self.clock()
        return True

    async def release(self) -> None:
        """Give the lease up (on shutdown) so the standby need not wait for it to expire."""
        if not self._leading:
            return
        self._set_leading(False, "shutting down")
        try:
            lease = await self.api.get(self.lease.path)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.lease.identity:
                return
            now_wall = micro_time(self.wall_clock())
            released = dict(spec, holderIdentity="", leaseDurationSeconds=1, renewTime=now_wall, acquireTime=now_wall)
            await self.api.update(self.lease.path, dict(lease, spec=released))
            log.info("released lease %s", self.lease)
        except ApiError as exc:
            log.warning("could not release lease %s: %s (it expires by itself)", self.lease, exc)

    def _spec(self, acquired: str, renewed: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.lease.identity,
            "leaseDurationSeconds": max(1, round(self.lease.duration)),
            "acquireTime": acquired,
            "renewTime": renewed,
            "leaseTransitions": transitions,
        }

    def _set_leading(self, leading: bool, why: str) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        self.transitions += 1
        log.info(
            "%s the leader (%s)",
            "became" if leading else "stopped being",
            why,
            extra={"lease": str(self.lease), "identity": self.lease.identity},
        )
        self.on_change(leading)


class AlwaysLeader:
    """With leader election off (one replica): always the leader."""

    leading = True
    leader_url = ""

    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()


@dataclass(frozen=True, kw_only=True)
class LeaderElection:
    """The flags of leader election on a Lease, for a service's config (neuron_common.config); the
    service words --leader-elect and sets --lease-name's default in its `FLAGS`. `lease` is made from
    them, and the timing is checked at start."""

    leader_elect: bool = switch(True, "take part in leader election on a Lease; only the leader acts")
    lease_name: str = flag("", "name of the Lease")
    lease_namespace: str = flag(
        "", "namespace of the Lease (default $POD_NAMESPACE, which the chart sets, else default)"
    )
    identity: str = flag(
        "", "this replica's name in the Lease (default $POD_NAME or the host name, plus a random suffix)"
    )
    lease_duration: float = flag(
        "15s",
        "how long a standby waits after the last renewal it saw before taking the lease",
        type=positive_duration,
    )
    renew_deadline: float = flag(
        "10s",
        "the leader stops leading when it could not renew for this long (less than --lease-duration)",
        type=positive_duration,
    )
    retry_period: float = flag("2s", "time between attempts to take or renew the lease", type=positive_duration)
    lease: Lease = derived()

    @classmethod
    def resolve(cls, p: argparse.ArgumentParser, v: dict[str, Any], environ: Mapping[str, str]) -> None:
        if v["leader_elect"] and not v["renew_deadline"] < v["lease_duration"]:
            p.error(
                f"--renew-deadline ({v['renew_deadline']:g}s) must be shorter than --lease-duration "
                f"({v['lease_duration']:g}s): a leader cut off from the API server must stop before a standby can "
                "take over"
            )
        if v["leader_elect"] and not v["retry_period"] < v["renew_deadline"]:
            p.error(
                f"--retry-period ({v['retry_period']:g}s) must be shorter than --renew-deadline "
                f"({v['renew_deadline']:g}s)"
            )
        if v["leader_elect"] and not v["lease_name"]:
            p.error("--lease-name must not be empty")
        v["identity"] = v["identity"] or f"{environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        v["lease_namespace"] = v["lease_namespace"] or environ.get("POD_NAMESPACE") or "default"
        v["lease"] = Lease(
            v["lease_namespace"],
            v["lease_name"],
            v["identity"],
            v["lease_duration"],
            v["renew_deadline"],
            v["retry_period"],
        )
