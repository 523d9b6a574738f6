"""A stand-in for the kube-apiserver's Node, Event and custom-object apply endpoints, over HTTP.

STAND-IN, NOT THE REAL API SERVER: used by the problem detector's and the device plugin's
tests; the real-cluster tests run a real kube-apiserver. It implements what they call, with the server-side
semantics that matter:
- `PATCH /api/v1/nodes/{name}/status` with `application/strategic-merge-patch+json` merges
  `status.conditions` by `type` (the kubelet's conditions survive); with
  `application/merge-patch+json` it replaces the list, as the real server does;
- `PATCH /api/v1/nodes/{name}` (merge patch) honours `metadata.resourceVersion` (409 on a
  stale one), and null deletes a key;
- `POST/PATCH /api/v1/namespaces/{ns}/events[/{name}]`, `GET .../events`;
- `PATCH /apis/{group}/{version}/{plural}/{name}` of a cluster-scoped custom object, only as a
  server-side apply (`application/apply-patch+yaml`, `fieldManager` required, 409 on another
  manager's fields without `force=true`); one manager applying the whole object, as the device
  plugin does, replaces everything but the server's own metadata;
- `down()` / `up()` make it unreachable and reachable again (same port).
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


class FakeApiServer:
    def __init__(self, node: str) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.events: dict[str, dict[str, dict[str, Any]]] = {}
        self.requests: list[tuple[str, str, str]] = []  # (method, path, content type)
        self.custom: dict[str, dict[str, dict[str, Any]]] = {}  # "plural.group" -> name -> object
        self.managers: dict[tuple[str, str], str] = {}  # (resource, name) -> field manager
        self._rv = 1
        self.port = _free_port()
        self._runner: web.AppRunner | None = None
        self.add_node(node)

    def add_node(self, name: str) -> None:
        self.nodes[name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": self._next_rv(), "annotations": {}},
            "spec": {},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                     "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-01-01T00:00:00Z"},
                ]
            },
        }  # fmt: skip

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def condition(self, node: str, ctype: str) -> dict[str, Any] | None:
        return next((c for c in self.nodes[node]["status"]["conditions"] if c["type"] == ctype), None)

    def event_list(self, namespace: str = "default") -> list[dict[str, Any]]:
        return list(self.events.get(namespace, {}).values())

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "standin", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
                    "users": [{"name": "standin", "user": {"token": "standin"}}],
                    "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin"}}],
                    "current-context": "standin",
                }
            )
        )
        return path

    # -- server ------------------------------------------------------------------------------------
    async def up(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/nodes/{name}", self._get_node)
        app.router.add_patch("/api/v1/nodes/{name}/status", self._patch_status)
        app.router.add_patch("/api/v1/nodes/{name}", self._patch_node)
        app.router.add_post("/api/v1/namespaces/{ns}/events", self._create_event)
        app.router.add_patch("/api/v1/namespaces/{ns}/events/{name}", self._patch_event)
        app.router.add_get("/api/v1/namespaces/{ns}/events", self._list_events)
        app.router.add_patch("/apis/{group}/{version}/{plural}/{name}", self._apply_custom)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def down(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _node(self, request: web.Request) -> dict[str, Any]:
        name = request.match_info["name"]
        if name not in self.nodes:
            raise web.HTTPNotFound(text=json.dumps({"kind": "Status", "reason": "NotFound", "code": 404}))
        return self.nodes[name]

    async def _get_node(self, request: web.Request) -> web.Response:
        self.requests.append(("GET", request.path, ""))
        return web.json_response(self._node(request))

    async def _patch_status(self, request: web.Request) -> web.Response:
        node = self._node(request)
        self.requests.append(("PATCH", request.path, request.content_type))
        patch = await request.json()
        conditions = patch.get("status", {}).pop("conditions", None)
        if conditions is not None:
            if request.content_type == STRATEGIC:  # patchMergeKey: type
                current = {c["type"]: c for c in node["status"].get("conditions", [])}
                for c in conditions:
                    current[c["type"]] = _merge(current.get(c["type"], {}), c)
                node["status"]["conditions"] = list(current.values())
            else:
                node["status"]["conditions"] = conditions
        _merge(node["status"], patch.get("status", {}))
        node["metadata"]["resourceVersion"] = self._next_rv()
        return web.json_response(node)

    async def _patch_node(self, request: web.Request) -> web.Response:
        node = self._node(request)
        self.requests.append(("PATCH", request.path, request.content_type))
        patch = await request.json()
        wanted = patch.get("metadata", {}).pop("resourceVersion", None)
        if wanted is not None and wanted != node["metadata"]["resourceVersion"]:
            raise web.HTTPConflict(text=json.dumps({"kind": "Status", "reason": "Conflict", "code": 409}))
        _merge(node, patch)
        node["metadata"]["resourceVersion"] = self._next_rv()
        return web.json_response(node)

    async def _create_event(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("POST", request.path, request.content_type))
        ns = request.match_info["ns"]
        name = body["metadata"]["name"]
        if name in self.events.get(ns, {}):
            raise web.HTTPConflict(text=json.dumps({"kind": "Status", "reason": "AlreadyExists", "code": 409}))
        self.events.setdefault(ns, {})[name] = body
        return web.json_response(body, status=201)

    async def _patch_event(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        self.requests.append(("PATCH", request.path, request.content_type))
        if name not in self.events.get(ns, {}):
            raise web.HTTPNotFound(text=json.dumps({"kind": "Status", "reason": "NotFound", "code": 404}))
        _merge(self.events[ns][name], await request.json())
        return web.json_response(self.events[ns][name])

    async def _apply_custom(self, request: web.Request) -> web.Response:
        group, plural, name = (request.match_info[k] for k in ("group", "plural", "name"))
        self.requests.append(("PATCH", request.path, request.content_type))
        if request.content_type != APPLY:
            raise web.HTTPUnsupportedMediaType(text=_status(415, "UnsupportedMediaType", "only apply is stood in for"))
        manager = request.query.get("fieldManager", "")
        if not manager:
            raise web.HTTPUnprocessableEntity(text=_status(422, "Invalid", "fieldManager is required for apply"))
        resource = f"{plural}.{group}"
        previous = self.managers.get((resource, name))
        if previous not in (None, manager) and request.query.get("force") != "true":
            raise web.HTTPConflict(text=_status(409, "Conflict", f"Apply failed with 1 conflict: {previous}"))
        body = json.loads(await request.text())  # JSON is YAML: what the client sends
        objects = self.custom.setdefault(resource, {})
        created = name not in objects
        metadata = {"uid": f"uid-{name}"} if created else {k: objects[name]["metadata"][k] for k in ("uid",)}
        obj = dict(body, metadata={**body.get("metadata", {}), **metadata, "resourceVersion": self._next_rv()})
        objects[name] = obj
        self.managers[(resource, name)] = manager
        return web.json_response(obj, status=201 if created else 200)

    async def _list_events(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "EventList", "items": self.event_list(request.match_info["ns"])})


def _status(code: int, reason: str, message: str) -> str:
    return json.dumps({"kind": "Status", "status": "Failure", "reason": reason, "code": code, "message": message})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serving(node: str) -> AsyncIterator[FakeApiServer]:
    """A stand-in API server with one Node, for the length of the block."""
    server = FakeApiServer(node)
    await server.up()
    try:
        yield server
    finally:
        await server.down()
