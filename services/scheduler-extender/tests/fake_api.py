"""A fake of the few API server calls the extender makes, in memory, for unit tests of the watch
layer, leader election and the wiring. FAKE, NOT THE API SERVER: the real one is exercised by the
e2e tests (tests/e2e/test_scheduler.py). What it keeps of the real semantics:
- lists carry a resourceVersion; watches deliver every change after the one they start from, in
  order; a resourceVersion older than `compacted` gets 410 Gone (as after etcd compaction);
- the pods collection honours the extender's field selector (bound and not terminal): a pod that
  starts matching arrives as ADDED, one that stops matching as DELETED;
- create/update of a Lease check `metadata.resourceVersion` (409 on a stale one, 409 on creating
  one that exists, 404 on reading one that does not);
- POST pods/<name>/binding sets spec.nodeName (409 when already bound, 404 when the pod is gone).
`fail_next(n)` makes the next n calls fail as an unreachable server does (status 0).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Mapping
from typing import Any

from neuron_common.kube import ApiError, Gone, WatchEvent

PODS = "/api/v1/pods"
NEURON_NODES = "/apis/neuron.aws.com/v1alpha1/neuronnodes"
NODES = "/api/v1/nodes"
BUDGETS = "/apis/policy/v1/poddisruptionbudgets"


def _matches(path: str, obj: Mapping[str, Any]) -> bool:
    if path != PODS:
        return True
    return bool(obj.get("spec", {}).get("nodeName")) and obj.get("status", {}).get("phase") not in (
        "Succeeded",
        "Failed",
    )


class FakeApi:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = {PODS: {}, NEURON_NODES: {}, NODES: {}, BUDGETS: {}}
        self.leases: dict[str, dict[str, Any]] = {}
        self.history: list[tuple[int, str, str, dict[str, Any] | None, dict[str, Any] | None]] = []
        self.rv = 100
        self.compacted = 0
        self.changed = asyncio.Condition()
        self.failures = 0
        self.calls: list[tuple[str, str]] = []
        self.bindings: list[tuple[str, str]] = []  # (namespace/name, node)
        self.watch_limit = 1000  # events per watch before the fake ends it, as a server's timeout does
        self._expiry = 0

    # --- test controls ---------------------------------------------------------------------------
    def fail_next(self, n: int) -> None:
        self.failures = n

    def _maybe_fail(self, what: str) -> None:
        self.calls.append((what, ""))
        if self.failures:
            self.failures -= 1
            raise ApiError(0, f"{what}: connection refused (fake)")

    async def put(self, path: str, obj: dict[str, Any]) -> None:
        """Create or replace an object (keyed namespace/name), as a controller would."""
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        key = f"{meta.get('namespace', '')}/{meta['name']}"
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        old = self.objects[path].get(key)
        self.objects[path][key] = obj
        self.history.append((self.rv, path, key, old, obj))
        async with self.changed:
            self.changed.notify_all()

    async def remove(self, path: str, namespace: str, name: str) -> None:
        key = f"{namespace}/{name}"
        old = self.objects[path].pop(key)
        self.rv += 1
        self.history.append((self.rv, path, key, old, None))
        async with self.changed:
            self.changed.notify_all()

    async def expire_watches(self) -> None:
        """Forget history up to now and end every open watch with 410 Gone, as the API server does to
        a watcher its watch cache no longer covers: resuming from any version seen so far fails too."""
        self.compacted = self.rv + 1
        self._expiry += 1
        async with self.changed:
            self.changed.notify_all()

    # --- the ListWatch protocol ---------------------------------------------------------------------
    async def list_pages(
        self, path: str, params: Mapping[str, str]
    ) -> AsyncIterator[tuple[list[Mapping[str, Any]], str]]:
        self._maybe_fail(f"list {path}")
        items = [copy.deepcopy(o) for o in self.objects[path].values() if _matches(path, o)]
        rv = str(self.rv)
        for start in range(0, max(len(items), 1), 2):  # pages of two, to exercise paging
            last = start + 2 >= len(items)
            yield items[start : start + 2], rv if last else ""

    async def watch(
        self, path: str, params: Mapping[str, str], resource_version: str, seconds: float
    ) -> AsyncIterator[WatchEvent]:
        self._maybe_fail(f"watch {path}")
        since = int(resource_version)
        expiry = self._expiry
        if since < self.compacted:
            raise Gone(410, f"too old resource version: {since} ({self.compacted})")
        sent = 0
        while sent < self.watch_limit:
            pending = [h for h in self.history if h[0] > since and h[1] == path]
            for rv, _, _, old, new in pending:
                since = rv
                was, now = old is not None and _matches(path, old), new is not None and _matches(path, new)
                if now and not was:
                    yield WatchEvent("ADDED", copy.deepcopy(new))  # type: ignore[arg-type]
                elif now and was:
                    yield WatchEvent("MODIFIED", copy.deepcopy(new))  # type: ignore[arg-type]
                elif was:
                    gone = copy.deepcopy(new if new is not None else old)
                    gone["metadata"]["resourceVersion"] = str(rv)  # type: ignore[index]
                    yield WatchEvent("DELETED", gone)  # type: ignore[arg-type]
                else:
                    continue
                sent += 1
            if self.failures:
                self.failures -= 1
                raise ApiError(0, f"watch {path}: connection reset (fake)")
            async with self.changed:
                await self.changed.wait()
            if self._expiry != expiry:
                raise Gone(410, "too old resource version (fake: watch expired)")

    # --- get / create / update ------------------------------------------------------------------------
    async def get(self, path: str) -> dict[str, Any]:
        self._maybe_fail(f"get {path}")
        await asyncio.sleep(0)  # a round trip: another caller may read or write meanwhile
        if "/leases/" in path:
            if path not in self.leases:
                raise ApiError(404, "leases not found")
            return copy.deepcopy(self.leases[path])
        namespace, name = path.split("/namespaces/")[1].split("/pods/")
        pod = self.objects[PODS].get(f"{namespace}/{name}")
        if pod is None:
            raise ApiError(404, f'pods "{name}" not found')
        return copy.deepcopy(pod)

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._maybe_fail(f"create {path}")
        if path.endswith("/binding"):
            namespace, name = path.split("/namespaces/")[1].removesuffix("/binding").split("/pods/")
            pod = self.objects[PODS].get(f"{namespace}/{name}")
            if pod is None or pod["metadata"]["uid"] != body["metadata"].get("uid", pod["metadata"]["uid"]):
                raise ApiError(404, f'pods "{name}" not found')
            if pod["spec"].get("nodeName"):
                raise ApiError(409, f"pod {name} is already assigned to node {pod['spec']['nodeName']!r}")
            bound = copy.deepcopy(pod)
            bound["spec"]["nodeName"] = body["target"]["name"]
            self.bindings.append((f"{namespace}/{name}", body["target"]["name"]))
            await self.put(PODS, bound)
            return {"kind": "Status", "status": "Success"}
        full = f"{path}/{body['metadata']['name']}"
        if full in self.leases:
            raise ApiError(409, "leases already exists")
        self.rv += 1
        self.leases[full] = copy.deepcopy(dict(body, metadata=dict(body["metadata"], resourceVersion=str(self.rv))))
        return copy.deepcopy(self.leases[full])

    async def update(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._maybe_fail(f"update {path}")
        current = self.leases.get(path)
        if current is None:
            raise ApiError(404, "leases not found")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "the object has been modified; please apply your changes to the latest version")
        self.rv += 1
        self.leases[path] = copy.deepcopy(dict(body, metadata=dict(body["metadata"], resourceVersion=str(self.rv))))
        return copy.deepcopy(self.leases[path])

    async def close(self) -> None:
        pass
