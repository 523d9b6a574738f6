"""Mutual TLS between kube-scheduler and the extender (issue 24): the verbs answer only a client
certificate the release's CA issued; the probes and /metrics need none; a standby relays to the
leader with its own certificate; a rotated certificate is loaded without a restart."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from extender_objects import NOW, extender_args, pod_object, report_object
from fake_api import NEURON_NODES, PODS, FakeApi
from polling import until_async

from neuron_scheduler_extender import config as config_mod
from neuron_scheduler_extender import tls
from neuron_scheduler_extender.app import Extender

pytestmark = pytest.mark.integration  # starts external processes: make integration


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, crt = directory / f"{name}.key", directory / f"{name}.crt"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", crt, "-subj", f"/CN={name}", "-days", "2")  # fmt: skip
    return crt, key


def issue(directory: Path, ca: tuple[Path, Path], name: str) -> tuple[Path, Path]:
    """A certificate for both server and client use, as Helm's genSignedCert makes them."""
    key, crt = directory / f"{name}.key", directory / f"{name}.crt"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", crt, "-subj", f"/CN={name}", "-days", "2", "-CA", ca[0], "-CAkey", ca[1],
            "-addext", "subjectAltName=DNS:extender.test,IP:127.0.0.1",
            "-addext", "extendedKeyUsage=serverAuth,clientAuth")  # fmt: skip
    return crt, key


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Any]:
    ca = make_ca(tmp_path, "release-ca")
    server = issue(tmp_path, ca, "extender")
    scheduler = issue(tmp_path, ca, "kube-scheduler")
    stranger_ca = make_ca(tmp_path, "stranger-ca")
    stranger = issue(tmp_path, stranger_ca, "stranger")
    return {"ca": ca, "server": server, "scheduler": scheduler, "stranger": stranger, "dir": tmp_path}


def client(pki: dict[str, Any], cert: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki["ca"][0]))
    if cert:
        crt, key = pki[cert]
        context.load_cert_chain(str(crt), str(key))
    return context


@pytest.fixture
async def extender(pki: dict[str, Any]) -> AsyncIterator[Callable[..., Any]]:
    started: list[tuple[asyncio.Event, asyncio.Task[int]]] = []

    async def _start(api: FakeApi, *flags: str) -> Extender:
        crt, key = pki["server"]
        cfg = config_mod.parse(
            ["--listen=127.0.0.1:0", "--retry-period=0.05s", f"--tls-cert-file={crt}", f"--tls-key-file={key}",
             f"--client-ca-file={pki['ca'][0]}", "--tls-server-name=extender.test", *flags],
            env={},
        )  # fmt: skip
        stop = asyncio.Event()
        ext = Extender(cfg, stop, api=api)  # type: ignore[arg-type]
        ext.endpoints.now = lambda: NOW
        started.append((stop, asyncio.create_task(ext.run())))
        await until_async(lambda: ext.http.bound_port and ext.synced(), "the extender serving, synced", 10.0, 0.01)
        return ext

    yield _start
    for stop, task in started:
        stop.set()
        assert await asyncio.wait_for(task, 15) == 0


async def call(port: int, context: ssl.SSLContext, path: str, body: Any = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        url = f"https://127.0.0.1:{port}{path}"
        if body is None:
            async with session.get(url, ssl=context) as response:
                return response.status, await response.text()
        async with session.post(url, data=json.dumps(body), ssl=context) as response:
            return response.status, await response.text()


async def world() -> FakeApi:
    api = FakeApi()
    await api.put(NEURON_NODES, report_object("n1"))
    await api.put(PODS, pod_object("p", devices=1))
    return api


async def test_the_verbs_answer_only_the_releases_client_certificates(
    extender: Callable[..., Any], pki: dict[str, Any]
) -> None:
    ext = await extender(await world())
    port = ext.http.bound_port
    args = extender_args(pod_object("p", devices=1), ["n1"])
    status, body = await call(port, client(pki, "scheduler"), "/filter", args)
    assert status == 200
    assert json.loads(body)["NodeNames"] == ["n1"]
    # no client certificate: the probes and /metrics answer, the verbs do not
    anonymous = client(pki, None)
    assert (await call(port, anonymous, "/healthz"))[0] == 200
    assert (await call(port, anonymous, "/metrics"))[0] == 200
    for verb in ("filter", "prioritize", "bind", "preempt"):
        status, text = await call(port, anonymous, f"/{verb}", args)
        assert status == 403, (verb, status, text)
        assert "client certificate" in text
    # a certificate another CA issued does not get through the handshake
    with pytest.raises(aiohttp.ClientError):
        await call(port, client(pki, "stranger"), "/filter", args)
    # plain HTTP on the TLS port gets nothing either
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.post(f"http://127.0.0.1:{port}/bind", data="{}") as response:
                await response.read()
    _, metrics = await call(port, anonymous, "/metrics")
    assert 'neuron_scheduler_extender_refused_requests_total{reason="unauthenticated",verb="bind"} 1.0' in metrics


async def test_a_standby_relays_to_the_leader_over_mutual_tls(
    extender: Callable[..., Any], pki: dict[str, Any]
) -> None:
    api = await world()
    first = await extender(api, "--identity=first")
    await until_async(lambda: first.leader.leading, "the first extender leading", 5.0, 0.01)
    second = await extender(api, "--identity=second")
    await until_async(lambda: second.leader.leader_url, "the second one knowing the leader", 5.0, 0.01)
    assert not second.leader.leading
    assert second.leader.leader_url.startswith("https://")
    args = extender_args(pod_object("p", devices=1), ["n1"])
    status, body = await call(second.http.bound_port, client(pki, "scheduler"), "/filter", args)
    assert status == 200
    assert json.loads(body)["NodeNames"] == ["n1"]
    _, metrics = await call(second.http.bound_port, client(pki, None), "/metrics")
    assert 'neuron_scheduler_extender_forwarded_total{result="relayed",verb="filter"} 1.0' in metrics


async def test_a_rotated_certificate_is_served_without_a_restart(pki: dict[str, Any]) -> None:
    crt, key = pki["server"]
    files = config_mod.TlsFiles(str(crt), str(key), str(pki["ca"][0]), "")
    context = tls.server_context(files)
    stop = asyncio.Event()
    task = asyncio.create_task(tls.reload_on_change(files, [context], stop, interval=0.05))
    await asyncio.sleep(0)  # its first step stamps the files as they were, then it waits
    assert await served_name(context, pki) == "extender"
    renewed = issue(pki["dir"], pki["ca"], "extender-renewed")
    os.replace(renewed[0], crt)
    os.replace(renewed[1], key)

    async def renewed_is_served() -> bool:
        return await served_name(context, pki) == "extender-renewed"

    await until_async(renewed_is_served, "the renewed certificate", interval=0.02)
    stop.set()
    await task
    # the context now holds the renewed certificate: a fresh handshake shows it
    assert await served_name(context, pki) == "extender-renewed"


async def served_name(context: ssl.SSLContext, pki: dict[str, Any]) -> str:
    """The common name of the certificate a fresh handshake with `context` shows."""
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client(pki, "scheduler"))
        subject = dict(x[0] for x in writer.get_extra_info("peercert")["subject"])
        writer.close()
    finally:
        server.close()
    name: str = subject["commonName"]
    return name


def test_the_tls_flags_go_together(pki: dict[str, Any]) -> None:
    crt, _ = pki["server"]
    with pytest.raises(SystemExit):
        config_mod.parse([f"--tls-cert-file={crt}"], env={})
    with pytest.raises(SystemExit):
        config_mod.parse(["--tls-cert-file=/nope", "--tls-key-file=/nope", "--client-ca-file=/nope"], env={})
