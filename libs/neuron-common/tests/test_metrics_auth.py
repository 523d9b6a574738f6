"""The /metrics authorizer (issue 24 item 3) against a scripted API server: who gets through, what
is cached and for how long, what happens when the API server does not answer. The real
kube-apiserver and a real Prometheus are in tests/integration/test_metrics_auth.py."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from neuron_common.config import ServiceConfig, Serving, config_parser, parse_config
from neuron_common.health_server import HealthServer
from neuron_common.kube import Api, ApiError
from neuron_common.metrics_auth import ACCESS_REVIEWS, TOKEN_REVIEWS, MetricsAuthorizer, Verdict

PROMETHEUS = "system:serviceaccount:monitoring:prometheus"


class ScriptedApi:
    """TokenReview and SubjectAccessReview as the API server answers them: `users` maps a token to
    its user, `readers` the users RBAC lets get /metrics. `down` makes every call fail as a refused
    connection does; `gate`, when set, holds every review until it is released."""

    def __init__(self) -> None:
        self.users = {"good": PROMETHEUS, "nosy": "system:serviceaccount:default:nosy"}
        self.readers = {PROMETHEUS}
        self.down = False
        self.gate: asyncio.Event | None = None
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((path, body))
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise ApiError(0, "POST: ClientConnectorError: connection refused")
        if path == TOKEN_REVIEWS:
            user = self.users.get(body["spec"]["token"])
            if user is None:
                return {"status": {"authenticated": False, "error": "invalid bearer token"}}
            return {"status": {"authenticated": True, "user": {"username": user, "uid": "u-1", "groups": ["g"]}}}
        assert path == ACCESS_REVIEWS
        spec = body["spec"]
        assert spec["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
        assert (spec["groups"], spec["uid"]) == (["g"], "u-1")
        return {"status": {"allowed": spec["user"] in self.readers}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def authorizer(api: ScriptedApi, clock: Clock | None = None, **kwargs: Any) -> MetricsAuthorizer:
    return MetricsAuthorizer(api, CollectorRegistry(), clock=clock or Clock(), **kwargs)


def decided(a: MetricsAuthorizer, verdict: Verdict) -> float:
    return a.decisions.labels(verdict.value)._value.get()


async def test_a_reader_is_allowed_a_stranger_forbidden_and_an_unknown_token_unauthenticated() -> None:
    api = ScriptedApi()
    a = authorizer(api)
    assert await a.verdict("Bearer good") is Verdict.ALLOWED
    assert await a.verdict("Bearer nosy") is Verdict.FORBIDDEN
    assert await a.verdict("Bearer forged") is Verdict.UNAUTHENTICATED
    # a token that is not sent as a bearer token is never sent to the API server
    for header in (None, "", "Bearer", "Bearer   ", "Basic Z29vZA==", "good"):
        assert await a.verdict(header) is Verdict.UNAUTHENTICATED
    assert len([c for c in api.calls if c[0] == TOKEN_REVIEWS]) == 3
    assert (decided(a, Verdict.ALLOWED), decided(a, Verdict.FORBIDDEN), decided(a, Verdict.UNAUTHENTICATED)) == (
        1,
        1,
        7,
    )


async def test_answers_are_cached_a_minute_when_allowed_and_ten_seconds_when_refused() -> None:
    api, clock = ScriptedApi(), Clock()
    a = authorizer(api, clock)
    for token in ("good", "nosy"):
        await a.verdict(f"Bearer {token}")
    reviews = len(api.calls)
    clock.now += 9
    await a.verdict("Bearer good")
    await a.verdict("Bearer nosy")
    assert len(api.calls) == reviews  # both cached
    clock.now += 2  # 11 s: the refusal is asked again (RBAC may have granted it since)
    api.readers.add(api.users["nosy"])
    assert await a.verdict("Bearer nosy") is Verdict.ALLOWED
    clock.now += 50  # 61 s after the first answer: the allowance is asked again (RBAC may have taken it away)
    api.readers.clear()
    assert await a.verdict("Bearer good") is Verdict.FORBIDDEN


async def test_an_api_server_that_does_not_answer_refuses_the_scrape_and_is_asked_again() -> None:
    api = ScriptedApi()
    api.down = True
    a = authorizer(api)
    assert await a.verdict("Bearer good") is Verdict.UNAVAILABLE
    assert await a.verdict("Bearer good") is Verdict.UNAVAILABLE
    assert len(api.calls) == 2  # nothing cached from a failure
    api.down = False
    assert await a.verdict("Bearer good") is Verdict.ALLOWED
    assert decided(a, Verdict.UNAVAILABLE) == 2


async def test_a_refused_connection_to_a_real_socket_is_unavailable_not_an_exception() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once it is closed
    api = Api(f"http://127.0.0.1:{port}", timeout=2)
    try:
        a = MetricsAuthorizer(api, CollectorRegistry())
        assert await a.verdict("Bearer good") is Verdict.UNAVAILABLE
    finally:
        await api.close()


async def test_concurrent_scrapes_with_one_token_wait_for_one_review() -> None:
    api = ScriptedApi()
    api.gate = asyncio.Event()
    a = authorizer(api)
    scrapes = [asyncio.create_task(a.verdict("Bearer good")) for _ in range(20)]
    await asyncio.sleep(0)
    api.gate.set()
    assert set(await asyncio.gather(*scrapes)) == {Verdict.ALLOWED}
    assert [c[0] for c in api.calls] == [TOKEN_REVIEWS, ACCESS_REVIEWS]


async def test_a_scrape_that_goes_away_cancels_neither_the_review_nor_the_others_waiting() -> None:
    api = ScriptedApi()
    api.gate = asyncio.Event()
    a = authorizer(api)
    first = asyncio.create_task(a.verdict("Bearer good"))
    await asyncio.sleep(0)
    second = asyncio.create_task(a.verdict("Bearer good"))
    await asyncio.sleep(0)
    first.cancel()  # its client disconnected
    api.gate.set()
    assert await second is Verdict.ALLOWED
    assert first.cancelled()
    assert [c[0] for c in api.calls] == [TOKEN_REVIEWS, ACCESS_REVIEWS]
    assert await a.verdict("Bearer good") is Verdict.ALLOWED  # and the answer was cached
    assert len(api.calls) == 2


async def test_the_cache_holds_a_bounded_number_of_tokens() -> None:
    api = ScriptedApi()
    a = authorizer(api, max_cached=8)
    for i in range(100):
        await a.verdict(f"Bearer junk-{i}")
    assert len(a._cache) == 8
    assert all(len(key) == 64 for key in a._cache)  # digests: no token is kept


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_guard_stands_before_metrics_only() -> None:
    api = ScriptedApi()
    registry = CollectorRegistry()
    a = MetricsAuthorizer(api, registry)
    server = HealthServer("127.0.0.1", free_port(), registry, metrics_guard=a.guard)
    await server.start()
    base = f"http://127.0.0.1:{server.bound_port}"
    try:
        async with aiohttp.ClientSession() as http:

            async def get(path: str, token: str | None = None) -> tuple[int, str, str]:
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                async with http.get(base + path, headers=headers) as r:
                    return r.status, await r.text(), r.headers.get("WWW-Authenticate", "")

            assert (await get("/healthz"))[0] == 200  # the kubelet's probes carry no token
            assert (await get("/readyz"))[0] == 200
            status, _, challenge = await get("/metrics")
            assert (status, challenge) == (401, "Bearer")
            assert (await get("/metrics", "nosy"))[0] == 403
            status, body, _ = await get("/metrics", "good")
            assert status == 200
            assert 'neuron_metrics_auth_decisions_total{verdict="allowed"}' in body
            api.down = True
            assert (await get("/metrics", "other"))[0] == 503
    finally:
        await server.stop()


@dataclass(frozen=True, kw_only=True)
class ServiceWithMetrics(Serving, ServiceConfig):
    PROG: ClassVar[str] = "svc"
    DESCRIPTION: ClassVar[str] = "a service serving /metrics"
    ENV_PREFIX: ClassVar[str] = "SVC_"
    FLAGS: ClassVar[Mapping[str, Mapping[str, Any]]] = {"listen": {"default": "0.0.0.0:1"}}


def parse_security(argv: list[str], tmp: Path) -> Any:
    return parse_config(ServiceWithMetrics, argv, {}).metrics_security


def test_authentication_needs_tls_and_both_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_text("c")
    key.write_text("k")
    assert parse_security([], tmp_path) is None
    secured = parse_security(
        ["--metrics-auth=kubernetes", f"--tls-cert-file={cert}", f"--tls-key-file={key}"], tmp_path
    )
    assert (secured.cert, secured.key) == (str(cert), str(key))
    for argv, message in (
        (["--metrics-auth=kubernetes"], "needs --tls-cert-file and --tls-key-file"),
        ([f"--tls-cert-file={cert}"], "go together"),
        (["--metrics-auth=kubernetes", f"--tls-cert-file={cert}", "--tls-key-file=/nowhere"], "/nowhere: no such file"),
        (["--metrics-auth=basic"], "invalid choice"),
    ):
        with pytest.raises(SystemExit):
            parse_security(argv, tmp_path)
        assert message in capsys.readouterr().err


def test_the_variable_twin_switches_it_on(tmp_path: Path) -> None:
    p = config_parser(ServiceWithMetrics, {"SVC_METRICS_AUTH": "kubernetes"})
    assert p.parse_args([]).metrics_auth == "kubernetes"
