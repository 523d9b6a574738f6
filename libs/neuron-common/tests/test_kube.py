"""The REST client against a small HTTP server speaking the API server's list and watch formats."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from neuron_common.kube import MAX_LINE, Api, ApiError, Gone


class Server:
    def __init__(self) -> None:
        self.app = web.Application()
        self.requests: list[tuple[str, dict[str, str], str | None]] = []
        self.watch_body: list[bytes] = []
        self.app.router.add_get("/api/v1/pods", self.pods)
        self.app.router.add_post("/api/v1/namespaces/ns/pods/p/binding", self.binding)
        self.app.router.add_post("/api/v1/namespaces/ns/pods/{name}/binding", self.held_binding)
        self.app.router.add_patch("/api/v1/nodes/{name}", self.patch_node)
        self.in_flight = 0
        self.hold_until = 0  # held bindings answer once this many are in flight at once
        self.all_in = asyncio.Event()

    async def pods(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(("GET", dict(request.query), request.headers.get("Authorization")))
        if request.query.get("watch") == "true":
            response = web.StreamResponse()
            await response.prepare(request)
            for chunk in self.watch_body:
                await response.write(chunk)
                await asyncio.sleep(0)
            return response
        pages = {"": ("a", "b", "next"), "next": ("c", "", "")}
        first, second, cont = pages[request.query.get("continue", "")]
        items = [{"metadata": {"name": n}} for n in (first, second) if n]
        meta = {"resourceVersion": "42", **({"continue": cont} if cont else {})}
        return web.json_response({"kind": "PodList", "metadata": meta, "items": items})

    async def binding(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["target"]["name"] == "taken":
            return web.json_response(
                {
                    "kind": "Status",
                    "status": "Failure",
                    "message": 'pod p is already assigned to node "n0"',
                    "code": 409,
                },
                status=409,
            )
        return web.json_response({"kind": "Status", "status": "Success"}, status=201)

    async def patch_node(self, request: web.Request) -> web.Response:
        return web.json_response({"contentType": request.content_type, "patch": await request.json()})

    async def held_binding(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        if self.in_flight >= self.hold_until:
            self.all_in.set()
        await self.all_in.wait()
        return web.json_response({"kind": "Status", "status": "Success"}, status=201)


@pytest.fixture
async def served() -> AsyncIterator[tuple[Server, Api]]:
    server = Server()
    runner = web.AppRunner(server.app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    api = Api(f"http://127.0.0.1:{port}", authorization=lambda: "Bearer t0ken", timeout=5)
    yield server, api
    await api.close()
    await runner.cleanup()


def line(event: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": event, "object": obj}).encode() + b"\n"


async def test_lists_page_by_page_with_the_token(served: tuple[Server, Api]) -> None:
    server, api = served
    pages = [page async for page in api.list_pages("/api/v1/pods", {"fieldSelector": "spec.nodeName!="})]
    assert [([i["metadata"]["name"] for i in items], rv) for items, rv in pages] == [(["a", "b"], ""), (["c"], "42")]
    assert server.requests[0] == ("GET", {"fieldSelector": "spec.nodeName!=", "limit": "500"}, "Bearer t0ken")
    assert server.requests[1][1]["continue"] == "next"


async def test_watch_events_split_across_chunks_and_joined_in_one(served: tuple[Server, Api]) -> None:
    server, api = served
    one, two, three = (line("ADDED", {"metadata": {"name": n, "resourceVersion": str(i)}}) for i, n in enumerate("abc"))
    server.watch_body = [one[:7], one[7:] + two + three[:3], three[3:]]
    events = [e async for e in api.watch("/api/v1/pods", {}, "41", 60)]
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]
    query = server.requests[0][1]
    assert query == {"watch": "true", "resourceVersion": "41", "allowWatchBookmarks": "true", "timeoutSeconds": "60"}


async def test_a_410_error_event_is_gone(served: tuple[Server, Api]) -> None:
    server, api = served
    status = {"kind": "Status", "status": "Failure", "message": "too old resource version: 41 (52)", "code": 410}
    server.watch_body = [line("ERROR", status)]
    with pytest.raises(Gone, match=r"HTTP 410: too old resource version: 41 \(52\)"):
        _ = [e async for e in api.watch("/api/v1/pods", {}, "41", 60)]


async def test_an_event_longer_than_the_cap_is_an_error_not_a_memory_blow_up(served: tuple[Server, Api]) -> None:
    server, api = served
    server.watch_body = [b"x" * (MAX_LINE // 2)] * 3
    with pytest.raises(ApiError, match="longer than"):
        _ = [e async for e in api.watch("/api/v1/pods", {}, "1", 60)]


async def test_errors_carry_the_servers_message(served: tuple[Server, Api]) -> None:
    _, api = served
    body = {"metadata": {"name": "p"}, "target": {"name": "taken"}}
    with pytest.raises(ApiError) as caught:
        await api.create("/api/v1/namespaces/ns/pods/p/binding", body)
    assert (caught.value.status, caught.value.message) == (409, 'pod p is already assigned to node "n0"')
    assert await api.create("/api/v1/namespaces/ns/pods/p/binding", {"target": {"name": "n1"}}) == {
        "kind": "Status",
        "status": "Success",
    }


async def test_a_patch_is_sent_as_the_kind_of_patch_asked_for(served: tuple[Server, Api]) -> None:
    _, api = served
    for kind in ("application/strategic-merge-patch+json", "application/merge-patch+json"):
        answer = await api.patch("/api/v1/nodes/n", {"spec": {"unschedulable": True}}, kind)
        assert answer == {"contentType": kind, "patch": {"spec": {"unschedulable": True}}}


async def test_an_unreachable_server_is_status_0() -> None:
    api = Api("http://127.0.0.1:9", timeout=2)
    with pytest.raises(ApiError) as caught:
        await api.get("/api/v1/pods")
    assert caught.value.status == 0
    await api.close()


async def test_configured_from_a_kubeconfig(served: tuple[Server, Api], tmp_path: Any) -> None:
    server, plain = served
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": plain.server}}],
            "users": [{"name": "u", "user": {"token": "from-kubeconfig"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        })
    )  # fmt: skip
    api = Api.from_kubeconfig(str(kubeconfig), timeout=5)
    try:
        _ = [page async for page in api.list_pages("/api/v1/pods", {})]
    finally:
        await api.close()
    assert server.requests[0][2] == "Bearer from-kubeconfig"


# --- credentials without the kubernetes client ---------------------------------------------------


def test_in_cluster_reads_the_service_account_and_rereads_the_token(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import ssl

    from neuron_common import kube

    monkeypatch.setattr(ssl, "create_default_context", lambda **_: ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    (tmp_path / "token").write_text("first\n")
    (tmp_path / "ca.crt").write_text("")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    api = kube.in_cluster(5.0, tmp_path)
    assert api.server == "https://[fd00::1]:443"
    assert api._headers()["Authorization"] == "Bearer first"
    (tmp_path / "token").write_text("rotated\n")
    monkeypatch.setattr(kube, "TOKEN_REREAD", 0.0)
    api._authorization._read_at = -1.0  # type: ignore[attr-defined]
    assert api._headers()["Authorization"] == "Bearer rotated"


def test_a_token_file_that_cannot_be_read_is_an_api_error_or_the_last_token(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every caller retries an ApiError; an OSError would end its loop and restart the process."""
    from neuron_common import kube

    token = tmp_path / "token"
    read = kube._TokenFile(token)
    with pytest.raises(ApiError, match="cannot read the token"):
        read()
    token.write_text("first\n")
    assert read() == "Bearer first"
    token.unlink()  # the kubelet swapping the projected volume's files
    monkeypatch.setattr(kube, "TOKEN_REREAD", 0.0)
    assert read() == "Bearer first"
    token.write_text("rotated\n")
    assert read() == "Bearer rotated"


def test_in_cluster_outside_a_pod_is_a_clear_error(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from neuron_common import kube

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ApiError, match="not in a pod"):
        kube.in_cluster(5.0, tmp_path)


def test_simple_kubeconfig_with_a_token_and_one_needing_the_client(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from neuron_common import kube

    config = {
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "abc"}}, {"name": "e", "user": {"exec": {"command": "x"}}}],
        "contexts": [{"name": "t", "context": {"cluster": "c", "user": "u"}}, {"name": "x", "context": {"cluster": "c", "user": "e"}}],
        "current-context": "t",
    }  # fmt: skip
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    api = kube.from_simple_kubeconfig(path, 5.0)
    assert api is not None
    assert api.server == "http://127.0.0.1:1"
    assert api._headers()["Authorization"] == "Bearer abc"
    path.write_text(json.dumps(config | {"current-context": "x"}))
    assert kube.from_simple_kubeconfig(path, 5.0) is None  # exec plugins: the kubernetes client's loaders


async def test_concurrent_requests_are_not_queued_in_the_client(served: tuple[Server, Api]) -> None:
    """kube-scheduler sends an extender's bindings concurrently: the client must let well over a
    hundred through at once (as client-go does over HTTP/2) rather than queue them behind a
    connection cap until kube-scheduler's bind timeout passes. The server answers none until
    all are in flight together."""
    server, api = served
    server.hold_until = 200
    # a client that queued would never have 200 in flight and would wait out any deadline; the deadline
    # only bounds how long opening 200 connections may take, which in CI beside the cluster stage passed 5 s
    api.timeout = 60
    binding = {"apiVersion": "v1", "kind": "Binding", "target": {"kind": "Node", "name": "n1"}}
    calls = [api.create(f"/api/v1/namespaces/ns/pods/p{i}/binding", binding) for i in range(200)]
    await asyncio.wait_for(asyncio.gather(*calls), timeout=90)
    assert server.in_flight == 200
