"""Mutual TLS for the extender verbs: the server context (a client certificate optional at the
handshake, so the kubelet's probes and Prometheus reach /healthz, /readyz and /metrics without
one, and required by the verbs themselves), the client context a standby relays to the leader
with, and reloading both when the Secret's files change (a rotated certificate without a restart).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl

from neuron_common.lifecycle import sleep_or_stop
from neuron_scheduler_extender.config import TlsFiles

log = logging.getLogger(__name__)

RELOAD_INTERVAL = 30.0


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


def _stamp(files: TlsFiles) -> tuple[tuple[int, int], ...]:
    """Each file's inode and modification time: a Secret volume swaps a symlink to new files."""
    stamps = []
    for path in (files.cert, files.key, files.client_ca):
        try:
            st = os.stat(path)
            stamps.append((st.st_ino, st.st_mtime_ns))
        except OSError:
            stamps.append((-1, -1))
    return tuple(stamps)


async def reload_on_change(
    files: TlsFiles, contexts: list[ssl.SSLContext], stop: asyncio.Event, interval: float = RELOAD_INTERVAL
) -> None:
    """Load the files again into the live contexts when they change (a kubelet-updated Secret
    volume swaps them atomically); new connections use the new certificate. A failed load keeps
    the previous one and is logged: a half-written rotation must not stop the service."""
    seen = _stamp(files)
    while not await sleep_or_stop(stop, interval):
        current = _stamp(files)
        if current == seen:
            continue
        try:
            for context in contexts:
                _load(context, files)
        except (OSError, ssl.SSLError) as exc:
            log.error("TLS files changed but cannot be loaded (%s); keeping the previous certificate", exc)
            continue
        seen = current
        log.info("TLS certificate reloaded", extra={"cert": files.cert})
