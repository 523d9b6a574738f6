"""The API server over its REST interface, with aiohttp, configured by the `kubernetes` client's loaders
(the scheduler extender and the DRA driver use it; the `kube` extra brings the loaders).

Why not the `kubernetes` client itself: its watch parses every object into generated model classes
in a thread; here each object is read as JSON and the caller reduces it at once to the few fields it
keeps, so memory stays bounded by what is kept, not by what the API server sends. Lists are paged
(`limit`/`continue`); watch lines are read with an explicit size cap.

The kubeconfig or in-cluster service account is loaded by `kubernetes.config`, which also keeps a
projected service-account token fresh (its refresh hook runs on every request's header).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

LIST_PAGE = 500
MAX_LINE = 16 * 1024 * 1024  # one watch event; a Pod object is rarely above 100 KiB


class ApiError(Exception):
    """An API server answer other than success, or no answer at all."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status  # 0: no HTTP answer (connection refused, timeout, reset)
        self.message = message


class Gone(ApiError):
    """410 Gone: the resourceVersion is too old to resume from; list again."""


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: Mapping[str, Any]


class Api:
    """The calls the services make: list, watch, get, create, update, patch, delete."""

    def __init__(
        self,
        server: str,
        *,
        ssl_context: ssl.SSLContext | bool = True,
        authorization: Callable[[], str | None] = lambda: None,
        timeout: float = 10.0,
    ) -> None:
        self.server = server.rstrip("/")
        self._ssl = ssl_context
        self._authorization = authorization
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, timeout: float) -> Api:
        """The kubeconfig file, or the pod's service account when `kubeconfig` is None."""
        from kubernetes import client
        from kubernetes import config as loader

        cfg = client.Configuration()
        if kubeconfig:
            loader.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            loader.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        context: ssl.SSLContext | bool = True
        if cfg.host.startswith("https"):
            context = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
            if not cfg.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if cfg.cert_file:
                context.load_cert_chain(cfg.cert_file, cfg.key_file)

        def authorization() -> str | None:
            # the loaders keep the token under "BearerToken" (older clients: "authorization"); asking
            # runs their refresh hook, which re-reads a rotated service-account token
            value = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
            return str(value) if value else None

        return cls(cfg.host, ssl_context=context, authorization=authorization, timeout=timeout)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self._authorization()
        if token:
            headers["Authorization"] = token
        return headers

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl, limit=32))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        headers = self._headers()
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        try:
            async with self.session.request(
                method,
                self.server + path,
                params=params,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as response:
                text = await response.text()
                if response.status >= 300:
                    raise _error(response.status, text)
                result = json.loads(text) if text else {}
                return result if isinstance(result, dict) else {}
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
            raise ApiError(0, f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    async def get(self, path: str) -> dict[str, Any]:
        return await self.request("GET", path)

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body=body)

    async def update(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("PUT", path, body=body)

    async def apply(self, path: str, body: Mapping[str, Any], field_manager: str) -> dict[str, Any]:
        """Server-side apply (JSON is YAML), taking over the fields from any other manager."""
        return await self.request(
            "PATCH",
            path,
            params={"fieldManager": field_manager, "force": "true"},
            body=body,
            content_type="application/apply-patch+yaml",
        )

    async def delete(self, path: str) -> dict[str, Any]:
        return await self.request("DELETE", path)

    async def list_pages(
        self, path: str, params: Mapping[str, str]
    ) -> AsyncIterator[tuple[list[Mapping[str, Any]], str]]:
        """The items of a list, page by page, each with the list's resourceVersion (set on the last)."""
        cont = ""
        while True:
            query = dict(params, limit=str(LIST_PAGE))
            if cont:
                query["continue"] = cont
            page = await self.request("GET", path, params=query)
            meta = page.get("metadata") or {}
            cont = meta.get("continue") or ""
            items = page.get("items") or []
            yield items, ("" if cont else str(meta.get("resourceVersion") or ""))
            if not cont:
                return

    async def watch(
        self, path: str, params: Mapping[str, str], resource_version: str, seconds: float
    ) -> AsyncIterator[WatchEvent]:
        """Events after `resource_version`, until the server ends the watch (after `seconds`)."""
        query = dict(
            params,
            watch="true",
            resourceVersion=resource_version,
            allowWatchBookmarks="true",
            timeoutSeconds=str(int(seconds)),
        )
        try:
            async with self.session.get(
                self.server + path,
                params=query,
                headers=self._headers(),
                # no total: a watch lasts; a silent connection is cut after the server's own timeout passes
                timeout=aiohttp.ClientTimeout(total=None, connect=self.timeout, sock_read=seconds + 30),
            ) as response:
                if response.status >= 300:
                    raise _error(response.status, await response.text())
                buffer = bytearray()
                async for chunk in response.content.iter_any():
                    buffer.extend(chunk)
                    start = 0
                    while (end := buffer.find(b"\n", start)) >= 0:
                        line = bytes(buffer[start:end])
                        start = end + 1
                        if line.strip():
                            yield _event(line)
                    del buffer[:start]
                    if len(buffer) > MAX_LINE:
                        raise ApiError(0, f"watch {path}: an event longer than {MAX_LINE} bytes")
                if bytes(buffer).strip():
                    yield _event(bytes(buffer))
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(0, f"watch {path}: {type(exc).__name__}: {exc}") from exc


def _event(line: bytes) -> WatchEvent:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ApiError(0, f"watch: a line that is not JSON: {exc}") from exc
    kind, obj = raw.get("type"), raw.get("object")
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise ApiError(0, "watch: an event without type or object")
    if kind == "ERROR":
        code = obj.get("code")
        raise _error(code if isinstance(code, int) else 0, json.dumps(obj))
    return WatchEvent(kind, obj)


def _error(status: int, text: str) -> ApiError:
    message = text
    try:
        body = json.loads(text)
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            message = body["message"]
    except json.JSONDecodeError:
        pass
    message = message.strip()[:500]
    return Gone(status, message) if status == 410 else ApiError(status, message)
