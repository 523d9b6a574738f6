"""Reads the kubelet's PodResources `List` on a timer, off any request path.

The kubelet rate-limits this API node-wide (100 QPS, burst 10) and answers
`RESOURCE_EXHAUSTED` past that, so callers read the cached `latest` snapshot; the poller
backs off on that code, and retries quickly (bounded by the interval) when the kubelet is
away, e.g. restarting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field

import grpc

from kubelet_api.podresources_client import Holding, PodResourcesClient, allocatable_ids, flatten
from neuron_common.backoff import Backoff
from neuron_common.lifecycle import wait_any

log = logging.getLogger(__name__)

Wait = Callable[..., Awaitable[None]]  # wait_any(*events, timeout=...)


@dataclass(frozen=True)
class PodResourcesSnapshot:
    holdings: tuple[Holding, ...]
    allocatable: dict[str, set[str]] | None  # resource -> healthy device IDs; None when not asked
    fetched_at: float  # time.monotonic() when the answer arrived
    started_at: float  # time.monotonic() when the call was made


@dataclass(eq=False)
class PodResourcesPoller:
    client: PodResourcesClient
    interval: float
    _: KW_ONLY
    with_allocatable: bool = False
    on_update: Callable[[PodResourcesSnapshot], None] | None = None
    max_backoff: float = 60.0
    wait: Wait = wait_any  # how the loop waits out a delay (stop, timeout=...); tests pass one that skips time
    latest: PodResourcesSnapshot | None = field(default=None, init=False)
    up: bool = field(default=False, init=False)
    errors: Counter[str] = field(default_factory=Counter, init=False)
    _last_code: str = field(default="", init=False)  # the last failed call's gRPC code

    def __post_init__(self) -> None:
        self._retry = Backoff(initial=0.2, maximum=self.interval)
        self._exhausted = Backoff(initial=self.interval, maximum=self.max_backoff)

    async def refresh(self) -> bool:
        started = time.monotonic()
        try:
            listed = await self.client.list()
            allocatable = allocatable_ids(await self.client.get_allocatable()) if self.with_allocatable else None
        except grpc.aio.AioRpcError as exc:
            self._failed(exc.code().name, exc.details() or "")
            return False
        except (OSError, grpc.RpcError) as exc:
            self._failed("UNAVAILABLE", str(exc))
            return False
        if not self.up:
            log.info("PodResources API reachable", extra={"socket": self.client.socket_path})
        self.up = True
        self._retry.reset()
        self._exhausted.reset()
        self.latest = PodResourcesSnapshot(tuple(flatten(listed)), allocatable, time.monotonic(), started)
        if self.on_update is not None:
            self.on_update(self.latest)
        return True

    def _failed(self, code: str, detail: str) -> None:
        self.errors[code] += 1
        if self.up or self.errors[code] == 1:
            log.warning(
                "PodResources %s failed: %s",
                "List",
                detail or code,
                extra={"code": code, "socket": self.client.socket_path},
            )
        self.up = False
        self._last_code = code

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            ok = await self.refresh()
            if ok:
                delay = self.interval
            elif self._last_code == "RESOURCE_EXHAUSTED":
                delay = self._exhausted.next_delay()
            else:
                delay = self._retry.next_delay()
            await self.wait(stop, timeout=delay)
        await self.client.close()
