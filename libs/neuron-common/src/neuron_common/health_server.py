"""The HTTP endpoint every service serves: /healthz (alive), /readyz (alive and doing its job), /metrics."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

# (ok, reason): the reason is shown to whoever probes, so it says what is missing
Check = Callable[[], tuple[bool, str]]


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
        metrics_handler: Callable[[web.Request], object] | None = None,
        client_max_size: int = 1024**2,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.ssl_context = ssl_context
        self.registry = registry
        self._live, self._ready = live, ready
        # a service that serves more than probes (the scheduler extender) may take larger request bodies
        self.app = web.Application(client_max_size=client_max_size)
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/metrics", metrics_handler or self._metrics)  # type: ignore[arg-type]
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None

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

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
