"""Kubernetes authentication and authorization in front of /metrics, done inside the service as
kube-rbac-proxy does it beside one: the caller's bearer token goes to a TokenReview, the user it
names to a SubjectAccessReview for `get` on the non-resource path `/metrics`. Prometheus's
ServiceAccount (or the chart's scraper) is allowed by a ClusterRole with that one rule.

Answers are cached by the token's digest (allowed for a minute, refused for ten seconds, as
kube-rbac-proxy's defaults), a bounded number of tokens, and concurrent scrapes with the same
token wait for one review. An API server that does not answer refuses the scrape with 503 and
caches nothing: metrics are never served to a caller nobody has vouched for.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from neuron_common import tls
from neuron_common.config import MetricsSecurity
from neuron_common.kube import Api, ApiError
from neuron_common.metrics import MetricSet, Series

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
ALLOWED_TTL = 60.0
DENIED_TTL = 10.0
MAX_CACHED = 1024
REVIEW_TIMEOUT = 5.0  # seconds: within Prometheus's default 10 s scrape timeout, both reviews
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class Verdict(enum.Enum):
    ALLOWED = "allowed"
    UNAUTHENTICATED = "unauthenticated"  # no token, or one the API server does not know
    FORBIDDEN = "forbidden"  # a known user without `get /metrics`
    UNAVAILABLE = "unavailable"  # the API server did not answer: nobody vouched, so no


class ReviewApi(Protocol):
    """What the authorizer needs of neuron_common.kube.Api."""

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...


PREFIX = "neuron_metrics_auth"


def _declare(m: MetricSet) -> tuple[Counter, Counter]:
    decisions = m.counter(
        "decisions",
        "Scrapes of /metrics by verdict: allowed, unauthenticated, forbidden, unavailable (API server)",
        ["verdict"],
        shown=[verdict.value for verdict in Verdict],
    )
    return decisions, m.counter("reviews", "TokenReviews sent to the API server (cache misses)")


def catalogue() -> tuple[Series, ...]:
    """The series every service with --metrics-auth=kubernetes serves beside its own."""
    m = MetricSet(PREFIX)
    _declare(m)
    return m.series()


class MetricsAuthorizer:
    def __init__(
        self,
        api: ReviewApi,
        registry: CollectorRegistry,
        *,
        clock: Callable[[], float] = time.monotonic,
        allowed_ttl: float = ALLOWED_TTL,
        denied_ttl: float = DENIED_TTL,
        max_cached: int = MAX_CACHED,
    ) -> None:
        self._api = api
        self._clock = clock
        self._ttl = {Verdict.ALLOWED: allowed_ttl, Verdict.UNAUTHENTICATED: denied_ttl, Verdict.FORBIDDEN: denied_ttl}
        self._max_cached = max_cached
        self._cache: OrderedDict[str, tuple[Verdict, float]] = OrderedDict()
        self._in_flight: dict[str, asyncio.Task[Verdict]] = {}
        self.decisions, self.reviews = _declare(MetricSet(PREFIX, registry))

    async def verdict(self, authorization: str | None) -> Verdict:
        token = _bearer(authorization)
        if token is None:
            result = Verdict.UNAUTHENTICATED
        else:
            result = await self._cached_review(token)
        self.decisions.labels(result.value).inc()
        return result

    async def guard(self, request: web.Request) -> web.Response | None:
        """None lets the scrape through; otherwise the answer that refuses it."""
        verdict = await self.verdict(request.headers.get("Authorization"))
        if verdict is Verdict.ALLOWED:
            return None
        if verdict is Verdict.UNAUTHENTICATED:
            return web.Response(
                status=401, text="Unauthorized: a bearer token is needed\n", headers={"WWW-Authenticate": "Bearer"}
            )
        if verdict is Verdict.FORBIDDEN:
            return web.Response(status=403, text=f"Forbidden: this user may not get {METRICS_PATH}\n")
        return web.Response(status=503, text="the API server cannot review the token now; try again\n")

    async def _cached_review(self, token: str) -> Verdict:
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._cache.get(key)
        if hit is not None:
            verdict, expires = hit
            if self._clock() < expires:
                return verdict
            del self._cache[key]
        review = self._in_flight.get(key)
        if review is None:
            # its own task, so a scrape that goes away (its client disconnected) cancels neither the
            # review nor the other scrapes waiting for it
            review = asyncio.create_task(self._review_and_remember(key, token))
            self._in_flight[key] = review
            review.add_done_callback(lambda _: self._in_flight.pop(key, None))
        return await asyncio.shield(review)

    async def _review_and_remember(self, key: str, token: str) -> Verdict:
        verdict = await self._review(token)
        if verdict is not Verdict.UNAVAILABLE:
            self._remember(key, verdict)
        return verdict

    def _remember(self, key: str, verdict: Verdict) -> None:
        self._cache[key] = (verdict, self._clock() + self._ttl[verdict])
        while len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)  # the oldest entry: a bounded memory whatever the callers send

    async def _review(self, token: str) -> Verdict:
        self.reviews.inc()
        try:
            token_review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
            review = await self._api.create(TOKEN_REVIEWS, token_review)
            status = review.get("status") or {}
            if not status.get("authenticated"):
                return Verdict.UNAUTHENTICATED
            user = status.get("user") or {}
            spec: dict[str, Any] = {
                "user": user.get("username", ""),
                "groups": user.get("groups") or [],
                "nonResourceAttributes": {"path": METRICS_PATH, "verb": "get"},
            }
            if user.get("uid"):
                spec["uid"] = user["uid"]
            if user.get("extra"):
                spec["extra"] = user["extra"]
            access = await self._api.create(
                ACCESS_REVIEWS, {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
            )
        except ApiError as exc:
            log.warning("cannot review a /metrics caller's token (%s); refusing the scrape", exc)
            return Verdict.UNAVAILABLE
        allowed = bool((access.get("status") or {}).get("allowed"))
        if not allowed:
            log.info("refused /metrics to %s", spec["user"], extra={"user": spec["user"]})
        return Verdict.ALLOWED if allowed else Verdict.FORBIDDEN


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class SecureMetrics:
    """What a service serving /metrics with --metrics-auth=kubernetes holds: its TLS context
    (reloaded when the Secret rotates the files) and the authorizer in front of /metrics."""

    def __init__(self, security: MetricsSecurity, api: ReviewApi, registry: CollectorRegistry) -> None:
        self.security = security
        self.context = tls.serving_context(security.cert, security.key)
        self.authorizer = MetricsAuthorizer(api, registry)
        self._own_api: Api | None = None  # a client made here, closed here

    def _load(self, context: ssl.SSLContext) -> None:
        context.load_cert_chain(self.security.cert, self.security.key)

    @classmethod
    def for_service(
        cls,
        security: MetricsSecurity | None,
        registry: CollectorRegistry,
        *,
        kubeconfig: str | None = None,
        api: ReviewApi | None = None,
    ) -> SecureMetrics | None:
        """None without --metrics-auth; else reviews through `api`, or a client of its own from
        --kubeconfig (the pod's service account by default) for a service that has none."""
        if security is None:
            return None
        if api is not None:
            return cls(security, api, registry)
        own = Api.from_kubeconfig(kubeconfig, REVIEW_TIMEOUT)
        secure = cls(security, own, registry)
        secure._own_api = own
        return secure

    async def close(self) -> None:
        if self._own_api is not None:
            await self._own_api.close()

    async def reload(self, stop: asyncio.Event) -> None:
        """A supervised loop: serve a rotated certificate without a restart."""
        paths = (self.security.cert, self.security.key)
        await tls.reload_on_change(paths, [self.context], self._load, stop)
