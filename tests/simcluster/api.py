"""A small asyncio client for the simulation's API server: JSON over aiohttp, client certificates.

Just what the simulation calls (create, server-side apply, strategic-merge status patches, list,
watch), with bounded concurrency and a retry on the answers a busy API server gives (429, 5xx,
a dropped connection), so thousands of writes go out in parallel without a thread per request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import aiohttp

from simcluster.controlplane import ControlPlane

T = TypeVar("T")
APPLY = "application/apply-patch+yaml"  # JSON is YAML
STRATEGIC = "application/strategic-merge-patch+json"
RETRIES = 8
REQUEST_TIMEOUT = 30.0


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: {status} {body[:500]}")
        self.status = status


class Api:
    def __init__(self, cp: ControlPlane, connections: int = 16) -> None:
        self.server = cp.server
        self._ssl = cp.credentials.ssl_context()
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Api:
        connector = aiohttp.TCPConnector(ssl=self._ssl, limit=self._connections)
        self._session = aiohttp.ClientSession(connector=connector)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use Api as an async context manager"
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
        accept_conflict: bool = False,
    ) -> dict[str, Any]:
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        for attempt in range(RETRIES):
            try:
                async with self.session.request(
                    method,
                    self.server + path,
                    data=data,
                    headers=headers,
                    params=params,
                    timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
                ) as response:
                    text = await response.text()
                    if response.status < 300 or (accept_conflict and response.status == 409):
                        return json.loads(text) if text else {}
                    if response.status != 429 and response.status < 500:
                        raise ApiError(response.status, method, path, text)
            except (TimeoutError, aiohttp.ClientConnectionError):
                if attempt == RETRIES - 1:
                    raise
            await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
        raise ApiError(503, method, path, f"still refused after {RETRIES} attempts")

    async def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """POST; an object that already exists (a retried create that did land) is not an error."""
        return await self.request("POST", path, obj, accept_conflict=True)

    async def apply(self, path: str, obj: dict[str, Any], manager: str) -> dict[str, Any]:
        """A forced server-side apply, as the device plugin writes its NeuronNode."""
        return await self.request(
            "PATCH", path, obj, content_type=APPLY, params={"fieldManager": manager, "force": "true"}
        )

    async def patch_status(self, path: str, status: dict[str, Any]) -> dict[str, Any]:
        return await self.request("PATCH", path + "/status", {"status": status}, content_type=STRATEGIC)

    async def list(self, path: str) -> tuple[list[dict[str, Any]], str]:
        """Every item (in pages) and the resourceVersion to watch from."""
        items: list[dict[str, Any]] = []
        params = {"limit": "2000"}
        while True:
            page = await self.request("GET", path, params=params)
            items += page.get("items", [])
            cont = page["metadata"].get("continue")
            if not cont:
                return items, page["metadata"]["resourceVersion"]
            params = {"limit": "2000", "continue": cont}

    async def watch(self, path: str, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, object) from `resource_version` on, until the server ends the watch.
        Raises ApiError(410) when that version is too old (list again)."""
        params = {"watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "true"}
        async with self.session.get(
            self.server + path, params=params, timeout=aiohttp.ClientTimeout(total=None, sock_read=None)
        ) as response:
            if response.status != 200:
                raise ApiError(response.status, "WATCH", path, await response.text())
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event["type"] == "ERROR":
                    raise ApiError(event["object"].get("code", 500), "WATCH", path, event["object"].get("message", ""))
                yield event["type"], event["object"]


async def bounded(items: Iterable[T], call: Callable[[T], Awaitable[object]], limit: int) -> None:
    """`call` on every item, at most `limit` at a time; the first failure is raised."""
    queue = list(items)
    position = 0

    async def worker() -> None:
        nonlocal position
        while position < len(queue):
            item = queue[position]
            position += 1
            await call(item)

    await asyncio.gather(*(worker() for _ in range(min(limit, len(queue)))))
