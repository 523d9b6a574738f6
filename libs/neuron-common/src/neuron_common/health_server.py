"""The HTTP endpoint every service serves: /healthz (alive), /readyz (alive and doing its job), /metrics."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from neuron_common.config import MetricsSecurity
from neuron_common.metrics_auth import ReviewApi, SecureMetrics
from neuron_common.supervisor import Supervisor

log = logging.getLogger(__name__)

# (ok, reason): the reason is shown to whoever probes, so it says what is missing
Check = Callable[[], tuple[bool, str]]
# None lets a /metrics request through; a response refuses it (neuron_common.metrics_auth)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Guard = Callable[[web.Request], Awaitable[web.Response | None]]


def _always_ok() -> tuple[bool, str]:
    return True, "ok"


class HealthServer:
    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        *,
        live: Check = _always_ok,
        ready: Check = _always_ok,
        metrics_handler: Handler | None = None,
        client_max_size: int = 1024**2,
        ssl_context: ssl.SSLContext | None = None,
        metrics_guard: Guard | None = None,
        secure: SecureMetrics | None = None,
    ) -> None:
        """`secure` (--metrics-auth=kubernetes): TLS and the authorizer in front of /metrics; a
        service that serves TLS itself passes its `ssl_context` and the authorizer's guard instead."""
        if secure is not None:
            ssl_context, metrics_guard = secure.context, secure.authorizer.guard
        self.secure = secure
        self.host, self.port = host, port
        self.ssl_context = ssl_context
        self.registry = registry
        self._live, self._ready = live, ready
        # a service that serves more than probes (the scheduler extender) may take larger request bodies
        self.app = web.Application(client_max_size=client_max_size)
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        serve: Handler = metrics_handler or self._metrics
        if metrics_guard is not None:
            serve = _guarded(metrics_guard, serve)
        self.app.router.add_get("/metrics", serve)
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None

    @classmethod
    def for_service(
        cls,
        listen: tuple[str, int],
        registry: CollectorRegistry,
        supervisor: Supervisor,
        ready: Check,
        security: MetricsSecurity | None,
        *,
        api: ReviewApi | None = None,
        kubeconfig: str | None = None,
        review_registry: CollectorRegistry | None = None,
        metrics_handler: Handler | None = None,
    ) -> HealthServer:
        """A node agent's server on its --listen: alive while `supervisor` is, ready by `ready`, and
        /metrics as --metrics-auth says (`SecureMetrics.for_service`: reviews through `api`, or a client
        of its own from `kubeconfig`), counting its reviews in `review_registry` (default `registry`)."""
        reviews = registry if review_registry is None else review_registry
        secure = SecureMetrics.for_service(security, reviews, kubeconfig=kubeconfig, api=api)
        host, port = listen
        return cls(
            host,
            port,
            registry,
            live=supervisor.healthy,
            ready=ready,
            metrics_handler=metrics_handler,
            secure=secure,
        )

    async def _healthz(self, _: web.Request) -> web.Response:
        ok, reason = self._live()
        return web.Response(status=200 if ok else 503, text=reason + "\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        ok, reason = self._live()  # a process that is not alive is not ready either
        if ok:
            ok, reason = self._ready()
        return web.Response(status=200 if ok else 503, text=reason + "\n")

    async def _metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True, ssl_context=self.ssl_context)
        await site.start()
        server = site._server  # the only way aiohttp exposes the bound port when port=0
        sockets = getattr(server, "sockets", None) or []
        self.bound_port = sockets[0].getsockname()[1] if sockets else self.port
        log.info("serving /healthz /readyz /metrics", extra={"address": f"{self.host}:{self.bound_port}"})

    def supervise(self, supervisor: Supervisor, stop: asyncio.Event) -> None:
        """Its own loops under the service's supervisor: reloading a rotated certificate."""
        if self.secure is not None:
            secure = self.secure
            supervisor.start("tls-reload", lambda: secure.reload(stop))

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.secure is not None:
            await self.secure.close()


def _guarded(guard: Guard, serve: Handler) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        refusal = await guard(request)
        return refusal if refusal is not None else await serve(request)

    return guarded
