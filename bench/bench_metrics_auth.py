"""What protecting /metrics costs a Prometheus scrape (issue 24 item 3): neuron-node-metrics as the
chart runs it with nodeMetrics.secureMetrics=true (TLS with the chart's generated certificate,
each caller's token put to a real kube-apiserver's TokenReview and SubjectAccessReview by the
exporter's own ServiceAccount, the answers cached) beside the same exporter over plain HTTP, the
floor, both running in this one run over one simulated trn2.48xlarge (LNC=1, 128 attributed pods,
as bench_node_metrics) and scraped in turn, so they share the machine's load.

The scraper holds its connection open between scrapes, as Prometheus does. First one token's
scrapes, counting the reviews the API server gets (apiserver_request_total) and each exporter's
CPU; then rounds of five scrapes that share the machine's load as it comes: plain, warm (the
reviewed token), cold (a token never seen, TokenRequest'd beforehand: it waits for both reviews),
warm on a new connection (a TLS handshake) and anonymous (refused, 401). With the chart's 30 s
interval and the one-minute cache of an allowed token, one scrape of a target in two or three
is a cold one, so the cold figures are not a rare start-up cost.

Targets: the p99 of every kind of authorized scrape and of the plain one <=
common.SCRAPE_P99_TARGET_MS; for a run of scrapes with one token the API server gets one
TokenReview and one SubjectAccessReview (the cache works).
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from bench_node_metrics import attributed_kubelet, exporter_command, serving, timed_get
from common import SCRAPE_P99_TARGET_MS, BenchError, Figure, percentile, scaled, stop_process, work_dir
from prometheus_client.parser import text_string_to_metric_families
from secure_metrics import SCRAPER_SA, install, token_of
from simcluster.controlplane import ControlPlane, control_plane, free_port, missing_prerequisites

from neuron_common.kube import Api
from neuron_common.metrics_auth import ACCESS_REVIEWS, TOKEN_REVIEWS
from neuron_sim import node as sim

TITLE = "protected /metrics (TLS, TokenReview + SubjectAccessReview, cached) vs plain HTTP, trn2.48xlarge LNC=1"
SCRAPES = scaled(100, 3)  # of each kind


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


async def _reviews(cp: ControlPlane, http: aiohttp.ClientSession) -> dict[str, float]:
    """The API server's count of review creations, by the review's path (apiserver_request_total)."""
    async with http.get(f"{cp.server}/metrics", ssl=cp.credentials.ssl_context()) as r:
        text = await r.text()
    counts = {TOKEN_REVIEWS: 0.0, ACCESS_REVIEWS: 0.0}
    resources = {"tokenreviews": TOKEN_REVIEWS, "subjectaccessreviews": ACCESS_REVIEWS}
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            path = resources.get(sample.labels.get("resource", ""))
            if path and sample.name == "apiserver_request_total" and sample.labels.get("verb") == "POST":
                counts[path] += sample.value
    return counts


def _own_reviews(text: str) -> float:
    """The exporter's own count of the TokenReviews it sent (neuron_metrics_auth_reviews_total)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "neuron_metrics_auth_reviews_total":
                return sample.value
    raise BenchError("the protected exporter does not count its reviews (neuron_metrics_auth_reviews_total)")


async def _measure(cp: ControlPlane, work: Path) -> list[Figure]:
    admin = Api(cp.server, ssl_context=cp.credentials.ssl_context())
    kubelet = attributed_kubelet(work)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        secure = await install(cp, admin, work)
        root = work / "node"
        sim.create(root, "trn2.48xlarge", lnc=1)
        await kubelet.start()
        plain_port, secure_port = free_port(), free_port()
        plain = subprocess.Popen(exporter_command(root, kubelet, plain_port))
        procs.append(plain)
        protected = subprocess.Popen(exporter_command(root, kubelet, secure_port, *secure.exporter_args()))
        procs.append(protected)
        plain_url = f"http://127.0.0.1:{plain_port}/metrics"
        secure_url = f"https://127.0.0.1:{secure_port}/metrics"
        tls: dict[str, Any] = {"ssl": secure.client_context(), "server_hostname": secure.server_name}

        def bearer(token: str) -> dict[str, Any]:
            return {**tls, "headers": {"Authorization": f"Bearer {token}"}}

        async def scrape(session: aiohttp.ClientSession, url: str, expect: int, **request: Any) -> float:
            seconds, status = await timed_get(session, url, **request)
            if status != expect:
                raise BenchError(f"a scrape of {url} answered {status}, not {expect}")
            return seconds

        async with aiohttp.ClientSession() as http, aiohttp.ClientSession() as api_http:
            # ready: both attribute every pod; the protected one seen with a token of its own, so
            # the measured token below is one the exporter has never reviewed
            text = await serving(http, plain_url, plain, 'pod="worker-127"')
            await serving(http, secure_url, protected, 'pod="worker-127"', **bearer(await token_of(admin, SCRAPER_SA)))
            series = sum(1 for line in text.splitlines() if not line.startswith("#"))

            # the cache: plain and protected in turn, one token for every protected scrape; the
            # exporters' CPU per scrape
            token = await token_of(admin, SCRAPER_SA)
            before = await _reviews(cp, api_http)
            plain_cpu, secure_cpu = _cpu(plain.pid), _cpu(protected.pid)
            for _ in range(SCRAPES):
                await scrape(http, plain_url, 200)
                await scrape(http, secure_url, 200, **bearer(token))
            plain_cpu, secure_cpu = _cpu(plain.pid) - plain_cpu, _cpu(protected.pid) - secure_cpu
            after = await _reviews(cp, api_http)

            # the latencies, every kind in each round so that all share the machine's load as it
            # comes: plain, warm, cold (a token never seen), warm on a new connection, anonymous
            fresh = [await token_of(admin, SCRAPER_SA) for _ in range(SCRAPES)]
            plain_samples: list[float] = []
            warm: list[float] = []
            cold: list[float] = []
            handshakes: list[float] = []
            refused: list[float] = []
            for new_token in fresh:
                plain_samples.append(await scrape(http, plain_url, 200))
                warm.append(await scrape(http, secure_url, 200, **bearer(token)))
                cold.append(await scrape(http, secure_url, 200, **bearer(new_token)))
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as once:
                    handshakes.append(await scrape(once, secure_url, 200, **bearer(token)))
                refused.append(await scrape(http, secure_url, 401, **tls))
            async with http.get(secure_url, **bearer(token)) as r:
                own = _own_reviews(await r.text())
    finally:
        for proc in procs:
            stop_process(proc)
        await kubelet.stop()
        await admin.close()

    def ms(samples: list[float], p: float) -> float:
        return percentile(samples, p) * 1e3

    def paired(these: list[float], those: list[float]) -> float:
        """What one kind adds to another scraped in the same round, robust to the load's swings."""
        return percentile([a - b for a, b in zip(these, those, strict=True)], 50) * 1e3

    token_reviews = after[TOKEN_REVIEWS] - before[TOKEN_REVIEWS]
    access_reviews = after[ACCESS_REVIEWS] - before[ACCESS_REVIEWS]
    return [
        Figure("series per scrape", series, "count"),
        Figure("plain HTTP scrape p50 (the floor)", ms(plain_samples, 50), "ms"),
        Figure("plain HTTP scrape p99", ms(plain_samples, 99), "ms", SCRAPE_P99_TARGET_MS),
        Figure("TLS + authn/authz scrape p50, warm cache", ms(warm, 50), "ms"),
        Figure("TLS + authn/authz scrape p99, warm cache", ms(warm, 99), "ms", SCRAPE_P99_TARGET_MS),
        Figure("warm p50 / plain p50", percentile(warm, 50) / percentile(plain_samples, 50), "x"),
        Figure("warm - plain, p50 of per-round differences", paired(warm, plain_samples), "ms"),
        Figure("first scrape of a token, cold cache (both reviews) p50", ms(cold, 50), "ms"),
        Figure("first scrape of a token, cold cache p99", ms(cold, 99), "ms", SCRAPE_P99_TARGET_MS),
        Figure("cold p50 / plain p50", percentile(cold, 50) / percentile(plain_samples, 50), "x"),
        Figure("cold - warm (the reviews), p50 of per-round differences", paired(cold, warm), "ms"),
        Figure("warm cache, new connection (TLS handshake) p50", ms(handshakes, 50), "ms"),
        Figure("warm cache, new connection p99", ms(handshakes, 99), "ms", SCRAPE_P99_TARGET_MS),
        Figure("new connection - warm (handshake), p50 of differences", paired(handshakes, warm), "ms"),
        Figure("anonymous scrape refused (401) p50", ms(refused, 50), "ms"),
        Figure("anonymous scrape refused (401) p99", ms(refused, 99), "ms"),
        Figure("CPU seconds per scrape, plain HTTP", plain_cpu / SCRAPES, "s"),
        Figure("CPU seconds per scrape, TLS + authn/authz, warm", secure_cpu / SCRAPES, "s"),
        Figure(f"TokenReviews at the API server, {SCRAPES} scrapes, one token", token_reviews, "count", 1),
        Figure(f"SubjectAccessReviews at the API server, same {SCRAPES}", access_reviews, "count", 1),
        Figure(f"TokenReviews the exporter sent, {SCRAPES + 2} tokens used", own, "count"),
    ]


def run() -> list[Figure]:
    missing = missing_prerequisites()
    if missing:
        raise BenchError(f"no kube-apiserver to review tokens (run make setup): {', '.join(missing)}")
    with work_dir("bench-ma-") as work, control_plane(work / "cp") as cp:
        return asyncio.run(_measure(cp, work))
