"""Protected /metrics end to end (issue 24 item 3): the chart's own objects with
nodeMetrics.secureMetrics=true on a real kube-apiserver (its ClusterRoles and bindings, its
ServiceAccounts, its generated certificate), the real exporter over a simulated node reviewing
tokens with its ServiceAccount's token, and a real Prometheus scraping it as the chart's
ServiceMonitor does: over TLS checked against the chart's CA and server name, with the scraper's
token. A token whose user has no `get /metrics` and a scrape without a token are refused; the
kubelet's probes stay open.

STAND-IN: the exporter's PodResources source is absent (it serves without pod labels); the
kubelet's part is the cluster tests'.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import processes
import pytest
import pytest_asyncio
from polling import until_async
from prometheus_server import numbers, prometheus, query, wait_for
from secure_metrics import RBAC, SCRAPER_SA, install, token_of
from simcluster.controlplane import ControlPlane, free_port, private_control_plane

from neuron_common.kube import Api
from neuron_sim import node as sim

pytestmark = [
    pytest.mark.integration,
]
one_loop = pytest.mark.asyncio(loop_scope="module")

STRANGER_SA = "nosy"


@pytest.fixture(scope="module")
def apiserver() -> Iterator[ControlPlane]:
    with private_control_plane("metrics-auth-cp-") as cp:
        yield cp


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(apiserver: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("metrics-auth")
    admin = Api(apiserver.server, ssl_context=apiserver.credentials.ssl_context())
    # The chart's RBAC, ServiceAccounts and certificate, and an account RBAC gives nothing.
    secure = await install(apiserver, admin, work)
    await admin.create(
        RBAC["ServiceAccount"], {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": STRANGER_SA}}
    )
    tls, endpoint = secure.tls, secure.endpoint
    root = work / "node"
    sim.create(root, "trn1.2xlarge")
    port = free_port()
    exporter = subprocess.Popen(
        [sys.executable, "-m", "neuron_node_metrics", "--host-root", str(root), "--pod-resources-socket", str(work / "none.sock"),
         "--listen", f"127.0.0.1:{port}", "--log-level", "warning", *secure.exporter_args()],
    )  # fmt: skip
    tokens = work / "tokens"
    tokens.mkdir()
    (tokens / "scraper").write_text(await token_of(admin, SCRAPER_SA))
    (tokens / "stranger").write_text(await token_of(admin, STRANGER_SA))
    # What the ServiceMonitor's endpoint tells Prometheus, as the operator writes it into a scrape job.
    tls_config = {"ca_file": str(tls / "ca.crt"), "server_name": secure.server_name}

    def job(name: str, token: str | None) -> dict[str, Any]:
        scrape: dict[str, Any] = {
            "job_name": name,
            "scheme": endpoint["scheme"],
            "tls_config": tls_config,
            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
        }
        if token:
            scrape["authorization"] = {
                "type": endpoint["authorization"]["type"],
                "credentials_file": str(tokens / token),
            }
        return scrape

    try:
        with prometheus(
            work / "prometheus", [job("scraper", "scraper"), job("stranger", "stranger"), job("anonymous", None)]
        ) as base:
            yield {"base": base, "port": port, "tls": tls, "tokens": tokens, "server_name": tls_config["server_name"]}
    finally:
        processes.stop(exporter)
        await admin.close()


@one_loop
async def test_prometheus_with_the_scrapers_token_reads_the_metrics_over_the_charts_tls(stack: dict[str, Any]) -> None:
    base = stack["base"]
    await wait_for(base, 'up{job="scraper"} == 1', "the scraper's scrape")
    await wait_for(base, 'neuron_exporter_build_info{job="scraper"} == 1', "the exporter's own series")
    await wait_for(base, 'neuron_device_info{job="scraper"}', "Neuron series")


@one_loop
async def test_a_token_without_the_reader_role_and_no_token_are_refused(stack: dict[str, Any]) -> None:
    base = stack["base"]
    await wait_for(base, 'up{job="stranger"} == 0', "the stranger's failed scrape")
    await wait_for(base, 'up{job="anonymous"} == 0', "the anonymous failed scrape")
    # the exporter counted them, and no refused scrape ever delivered a sample
    await wait_for(base, 'neuron_metrics_auth_decisions_total{job="scraper",verdict="forbidden"} > 0', "forbidden")
    await wait_for(
        base, 'neuron_metrics_auth_decisions_total{job="scraper",verdict="unauthenticated"} > 0', "anonymous"
    )
    for job in ("stranger", "anonymous"):
        assert numbers(await query(base, f'scrape_samples_scraped{{job="{job}"}}')) == [0.0]
        assert numbers(await query(base, f'count(neuron_exporter_build_info{{job="{job}"}})')) == []


@one_loop
async def test_the_answers_and_the_open_probes_seen_directly(stack: dict[str, Any]) -> None:
    context = ssl.create_default_context(cafile=str(stack["tls"] / "ca.crt"))
    url = f"https://127.0.0.1:{stack['port']}"
    scraper = (stack["tokens"] / "scraper").read_text()
    async with aiohttp.ClientSession() as http:

        async def status(path: str, token: str | None = None, server_name: str | None = stack["server_name"]) -> int:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with http.get(url + path, headers=headers, ssl=context, server_hostname=server_name) as r:
                return r.status

        async def up() -> bool:
            try:
                return await status("/healthz") == 200
            except aiohttp.ClientConnectionError:
                return False

        await until_async(up, "the exporter serving", timeout=30)
        assert await status("/readyz") == 200  # the kubelet probes HTTPS without a token
        assert await status("/metrics") == 401
        assert await status("/metrics", "not-a-token") == 401
        assert await status("/metrics", (stack["tokens"] / "stranger").read_text()) == 403
        assert await status("/metrics", scraper) == 200
        with pytest.raises(aiohttp.ClientConnectorCertificateError):  # the certificate names only the one name
            await status("/metrics", scraper, server_name="elsewhere.example")
    with pytest.raises(aiohttp.ClientError):  # and plain HTTP is not served at all
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{stack['port']}/metrics") as r:
            await r.read()
