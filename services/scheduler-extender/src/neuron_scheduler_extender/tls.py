"""Mutual TLS for the extender verbs: the server context (a client certificate optional at the
handshake, so the kubelet's probes and Prometheus reach /healthz, /readyz and /metrics without
one, and required by the verbs themselves), the client context a standby relays to the leader
with, and reloading both when the Secret's files change (a rotated certificate without a restart).
"""

from __future__ import annotations

import asyncio
import ssl

from neuron_common import tls as common_tls
from neuron_scheduler_extender.config import TlsFiles

RELOAD_INTERVAL = common_tls.RELOAD_INTERVAL


def server_context(files: TlsFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_OPTIONAL  # verified when presented; the verbs refuse a request without
    _load(context, files)
    return context


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """The extender's own certificate as its client certificate (it is issued for both uses), the
    same CA for the leader's serving certificate. The leader is reached by its pod IP, which the
    certificate does not name: its name is checked when `server_name` is given, else only that the
    release's CA issued it (nothing else holds that CA's key)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if not files.server_name:
        context.check_hostname = False
    _load(context, files)
    return context


def _load(context: ssl.SSLContext, files: TlsFiles) -> None:
    context.load_cert_chain(files.cert, files.key)
    context.load_verify_locations(cafile=files.client_ca)


async def reload_on_change(
    files: TlsFiles, contexts: list[ssl.SSLContext], stop: asyncio.Event, interval: float = RELOAD_INTERVAL
) -> None:
    """Load the certificate, key and CA again into the live contexts when any of them changes."""
    await common_tls.reload_on_change(
        (files.cert, files.key, files.client_ca), contexts, lambda c: _load(c, files), stop, interval
    )
