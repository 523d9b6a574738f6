"""The API server over its REST interface, with aiohttp, configured by the `kubernetes` client's loaders
(every service uses it; the `kube` extra brings the loaders).

Why not the `kubernetes` client itself: its watch parses every object into generated model classes
in a thread; here each object is read as JSON and the caller reduces it at once to the few fields it
keeps, so memory stays bounded by what is kept, not by what the API server sends. Lists are paged
(`limit`/`continue`); watch lines are read with an explicit size cap.

Credentials: the pod's service account (the in-cluster case, every chart deployment) and
kubeconfig files naming files or inline data for the CA, client certificates or a token are read
here, with the token file re-read every minute (the kubelet rotates projected tokens). Anything else
(exec plugins, auth providers) goes to the `kubernetes` client's loaders, which cost about 18 MB
of resident memory to import; the node agents (the DRA driver) stay without them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import ssl
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import aiohttp

log = logging.getLogger(__name__)

LIST_PAGE = 500
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD = 60.0  # seconds: a projected token is rotated well before it expires
MAX_LINE = 16 * 1024 * 1024  # one watch event; a Pod object is rarely above 100 KiB


def unreachable(kubeconfig: str | None, exc: BaseException) -> str:
    """Why a service cannot start without the API server: `Api.from_kubeconfig` failed with `exc`."""
    where = f"--kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
    hint = "" if kubeconfig else " (outside a pod, pass --kubeconfig)"
    return f"cannot reach the API server through {where}: {exc}{hint}"


def api_at_start(prog: str, kubeconfig: str | None, timeout: float, needed_by: str = "") -> Api:
    """The API client a service needs from its start; without credentials, a clear error and exit
    status 2 (`prog: error: <needed_by> cannot reach ...`), not a crash later."""
    try:
        return Api.from_kubeconfig(kubeconfig, timeout)
    except (ApiError, OSError, ValueError) as exc:
        print(f"{prog}: error: {needed_by}{' ' if needed_by else ''}{unreachable(kubeconfig, exc)}", file=sys.stderr)
        raise SystemExit(2) from None


def rfc3339(ts: float) -> str:
    """A Unix time as the API server writes its timestamps (UTC, whole seconds)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# The patch content types: a merge patch replaces lists; a strategic one merges lists such as a
# Node's conditions by their key.
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


def event_object(
    *,
    name: str,
    namespace: str,
    involved: Mapping[str, str],
    reason: str,
    message: str,
    type: str,
    count: int,
    first: float,
    last: float,
    component: str,
    instance: str,
    host: str | None = None,
) -> dict[str, Any]:
    """A core/v1 Event as every service of this project writes one (the problem detector's on its
    Node, the scheduler extender's on a group's pods): `involved` is its involvedObject, `first` and
    `last` Unix times, `component`/`instance` who reports it."""
    source = {"component": component} if host is None else {"component": component, "host": host}
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": dict(involved),
        "reason": reason,
        "message": message,
        "type": type,
        "count": count,
        "firstTimestamp": rfc3339(first),
        "lastTimestamp": rfc3339(last),
        "source": source,
        "reportingComponent": component,
        "reportingInstance": instance,
    }


def news_name(name: str, *identity: str) -> str:
    """An Event's name for the same news on the same object (`identity`: who it is about and what it
    says): told again, by a new leader whose memory starts empty or after a restart, it counts on the
    Event already there (`create_or_count`) instead of adding one."""
    digest = hashlib.sha256("\0".join(identity).encode()).hexdigest()[:16]
    return f"{name[:236]}.{digest}"  # 253, a name's limit, with the dot and the digest


class EventApi(Protocol):
    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def get(self, path: str) -> dict[str, Any]: ...

    async def patch(self, path: str, body: Mapping[str, Any], content_type: str) -> dict[str, Any]: ...


async def create_or_count(api: EventApi, event: Mapping[str, Any], now: float) -> None:
    """Creates `event` (an `event_object`); when its name is taken, the same news was told before, and
    Kubernetes' way is one Event, counted: its count goes up instead. Raises the API's ApiError."""
    namespace, name = event["metadata"]["namespace"], event["metadata"]["name"]
    events = f"/api/v1/namespaces/{namespace}/events"
    try:
        await api.create(events, event)
    except ApiError as exc:
        if exc.status != 409:
            raise
        told = await api.get(f"{events}/{name}")
        count = told.get("count")
        count = count if isinstance(count, int) else 1
        await api.patch(f"{events}/{name}", {"count": count + 1, "lastTimestamp": rfc3339(now)}, MERGE_PATCH)


class ObjectReader(Protocol):
    """What reads one object from the API server (`Api`; a test's stand-in)."""

    async def get(self, path: str) -> dict[str, Any]: ...


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


# Requests in flight at once. client-go multiplexes them over one HTTP/2 connection with no cap;
# aiohttp sends one at a time per HTTP/1.1 connection, and its default cap of 100 (32 here before)
# queued requests inside the client: the extender's bindings, which kube-scheduler sends
# concurrently, waited there past kube-scheduler's 10 s bind timeout on a busy API server.
CONNECTIONS = 256


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
        light = in_cluster(timeout) if kubeconfig is None else from_simple_kubeconfig(Path(kubeconfig), timeout)
        if light is not None:
            return light
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
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl, limit=CONNECTIONS))
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

    async def patch(self, path: str, body: Mapping[str, Any], content_type: str) -> dict[str, Any]:
        """A merge patch (`application/merge-patch+json`) or a strategic one, which merges lists such
        as a Node's conditions by key instead of replacing them."""
        return await self.request("PATCH", path, body=body, content_type=content_type)

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


class _TokenFile:
    """A bearer token read from a file, again at most every `TOKEN_REREAD` seconds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._token = ""
        self._read_at = -TOKEN_REREAD

    def __call__(self) -> str | None:
        """A file that cannot be read is an ApiError like an unreachable server, which every caller
        retries; once a token was read, it serves until the file reads again (a projected token
        stays valid well past its rotation)."""
        now = time.monotonic()
        if now - self._read_at >= TOKEN_REREAD:
            try:
                self._token = self.path.read_text().strip()
            except OSError as exc:
                if not self._token:
                    raise ApiError(0, f"cannot read the token {self.path}: {exc}") from exc
                log.warning("cannot read the token %s (%s); using the one read before", self.path, exc)
            self._read_at = now
        return f"Bearer {self._token}" if self._token else None


def in_cluster(timeout: float, directory: Path = SERVICE_ACCOUNT_DIR) -> Api:
    """The pod's service account: the API server's Service address from the environment, its CA
    and the (rotated) token from the mounted service-account directory."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ApiError(0, "not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    token = directory / "token"
    if not token.exists():
        raise ApiError(0, f"no service-account token at {token} (is automountServiceAccountToken off?)")
    context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return Api(server, ssl_context=context, authorization=_TokenFile(token), timeout=timeout)


def from_simple_kubeconfig(path: Path, timeout: float) -> Api | None:
    """A kubeconfig whose current context needs only files, inline data or a token; None when it
    needs more (exec plugins, auth providers), for the `kubernetes` client's loaders."""
    import yaml

    config = yaml.safe_load(path.read_text()) or {}
    named = {
        kind: {entry["name"]: entry.get(kind.rstrip("s"), {}) for entry in config.get(kind) or []}
        for kind in ("clusters", "users", "contexts")
    }
    context = named["contexts"].get(config.get("current-context", ""), {})
    cluster = named["clusters"].get(context.get("cluster", ""))
    user = named["users"].get(context.get("user", ""), {})
    if not cluster or not cluster.get("server") or user.get("exec") or user.get("auth-provider"):
        return None
    if user.get("username") or cluster.get("proxy-url") or cluster.get("tls-server-name"):
        return None
    base = path.parent
    server = str(cluster["server"])
    context_ssl: ssl.SSLContext | bool = True
    if server.startswith("https"):
        ca = _material(cluster, "certificate-authority", base)
        context_ssl = ssl.create_default_context(cadata=ca.decode() if ca else None)
        if cluster.get("insecure-skip-tls-verify"):
            context_ssl.check_hostname = False
            context_ssl.verify_mode = ssl.CERT_NONE
        cert, key = _material(user, "client-certificate", base), _material(user, "client-key", base)
        if cert and key:
            _load_cert_chain(context_ssl, cert, key)
    authorization: Callable[[], str | None] = lambda: None  # noqa: E731
    if user.get("token"):
        token = str(user["token"])
        authorization = lambda: f"Bearer {token}"  # noqa: E731
    elif user.get("tokenFile"):
        authorization = _TokenFile(base / str(user["tokenFile"]))
    return Api(server, ssl_context=context_ssl, authorization=authorization, timeout=timeout)


def _material(section: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    """`<key>-data` (base64) or the file `<key>` (relative to the kubeconfig's directory)."""
    if section.get(f"{key}-data"):
        return base64.b64decode(section[f"{key}-data"])
    if section.get(key):
        return (base / str(section[key])).read_bytes()
    return None


def _load_cert_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # ssl reads a certificate chain only from files: a private file, removed once loaded
    with tempfile.TemporaryDirectory(prefix="kube-cert-") as scratch:
        cert_file, key_file = Path(scratch, "cert.pem"), Path(scratch, "key.pem")
        cert_file.write_bytes(cert)
        key_file.touch(mode=0o600)
        key_file.write_bytes(key)
        context.load_cert_chain(str(cert_file), str(key_file))


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
