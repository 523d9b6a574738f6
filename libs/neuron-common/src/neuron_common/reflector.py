"""Keeping the view in step with the API server: list, then watch from the list's resourceVersion.

One `Reflector` per resource (the scheduler extender's NeuronNodes, Pods and Nodes; the remediation
controller's Nodes and Pods), as client-go's reflector does it:
- list page by page, reducing each object at once to what the view keeps (`reduce`), and hand
  the whole set over (`replace`); the first list done makes the source `synced`;
- watch from the list's resourceVersion with bookmarks, applying each event (`apply`); when the
  server ends a watch, watch again from the last resourceVersion seen;
- 410 Gone (the resourceVersion is too old): list again;
- any other failure (API server down, refused, timed out): back off with jitter and try again,
  from the last resourceVersion; the view keeps what it knew.
`last_contact` says when the API server last answered: the age of the view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from neuron_common.backoff import Backoff
from neuron_common.kube import ApiError, Gone, WatchEvent
from neuron_common.lifecycle import sleep_or_stop

log = logging.getLogger(__name__)

Record = TypeVar("Record")


class ListWatch(Protocol):
    """What a reflector needs of the API server (`kube.Api`; tests use a scripted fake)."""

    def list_pages(self, path: str, params: Mapping[str, str]) -> AsyncIterator[tuple[list[Mapping[str, Any]], str]]:
        raise NotImplementedError

    def watch(
        self, path: str, params: Mapping[str, str], resource_version: str, seconds: float
    ) -> AsyncIterator[WatchEvent]:
        raise NotImplementedError


@dataclass(frozen=True)
class Resource:
    name: str  # in logs and metrics
    path: str  # the collection, e.g. /api/v1/pods
    params: Mapping[str, str] = field(default_factory=dict)  # e.g. a fieldSelector


@dataclass
class Reflector(Generic[Record]):
    api: ListWatch
    resource: Resource
    reduce: Callable[[Mapping[str, Any]], Record | None]
    replace: Callable[[list[Record], float], None]  # (records, monotonic time the list began)
    apply: Callable[[str, Record], None]  # (event type, record)
    watch_timeout: float = 300.0
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.5, maximum=30.0))
    clock: Callable[[], float] = time.monotonic
    synced: bool = False
    last_contact: float | None = None  # monotonic
    lists: int = 0
    failures: int = 0
    last_error: str = ""
    resource_version: str = ""

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop` is set."""
        body = asyncio.create_task(self._loop(stop), name=f"reflector-{self.resource.name}")
        stopped = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({body, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if body in done:
            stopped.cancel()
            body.result()
            return
        body.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await body

    async def _loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                if not self.resource_version:
                    await self.list()
                began = self.clock()
                if not await self.watch() and self.clock() - began < 1.0:
                    # a server that ends watches at once would otherwise be asked again in a tight loop
                    await sleep_or_stop(stop, self.backoff.next_delay())
            except Gone:
                log.info("%s: resourceVersion %s is gone; listing again", self.resource.name, self.resource_version)
                self.resource_version = ""
            except ApiError as exc:
                self.failures += 1
                delay = self.backoff.next_delay()
                if exc.status == 0 and self.last_error == str(exc):
                    log.debug("%s: %s; retrying in %.1fs", self.resource.name, exc, delay)
                else:
                    log.warning(
                        "%s: %s; retrying in %.1fs, the view keeps what it knew",
                        self.resource.name,
                        exc,
                        delay,
                        extra={"resource": self.resource.name, "status": exc.status},
                    )
                self.last_error = str(exc)
                await sleep_or_stop(stop, delay)

    async def list(self) -> None:
        started = self.clock()
        records: list[Record] = []
        version = ""
        async for items, page_version in self.api.list_pages(self.resource.path, self.resource.params):
            records.extend(r for r in map(self.reduce, items) if r is not None)
            version = page_version
        self.replace(records, started)
        self.resource_version = version
        self.lists += 1
        self._answered()
        if not self.synced:
            log.info(
                "%s: listed %d (resourceVersion %s)",
                self.resource.name,
                len(records),
                version,
                extra={"resource": self.resource.name},
            )
        self.synced = True

    async def watch(self) -> int:
        """One watch, until the server ends it; returns how many events it brought."""
        events = self.api.watch(self.resource.path, self.resource.params, self.resource_version, self.watch_timeout)
        count = 0
        async for event in events:
            count += 1
            meta = event.object.get("metadata")
            version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
            if event.type != "BOOKMARK":
                record = self.reduce(event.object)
                if record is not None:
                    self.apply(event.type, record)
            if isinstance(version, str) and version:
                self.resource_version = version
            self._answered()
        if count:
            self._answered()
        return count

    def _answered(self) -> None:
        self.last_contact = self.clock()
        self.backoff.reset()
        if self.last_error:
            log.info("%s: the API server answers again", self.resource.name)
            self.last_error = ""

    def age(self) -> float | None:
        """Seconds since the API server last answered this source; None before it ever did."""
        return None if self.last_contact is None else self.clock() - self.last_contact
