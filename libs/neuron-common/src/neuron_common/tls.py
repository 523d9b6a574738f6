"""TLS for a service's own HTTP server: a serving context from PEM files, and reloading the live
contexts when the files change (a kubelet-updated Secret volume swaps them atomically), so a
rotated certificate is served without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable, Sequence

from neuron_common.lifecycle import sleep_or_stop

log = logging.getLogger(__name__)

RELOAD_INTERVAL = 30.0


def serving_context(cert: str, key: str) -> ssl.SSLContext:
    """TLS 1.2 or later with the certificate and key given; no client certificate asked for."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def stamp(paths: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """Each file's inode and modification time: a Secret volume swaps a symlink to new files."""
    stamps = []
    for path in paths:
        try:
            st = os.stat(path)
            stamps.append((st.st_ino, st.st_mtime_ns))
        except OSError:
            stamps.append((-1, -1))
    return tuple(stamps)


async def reload_on_change(
    paths: Sequence[str],
    contexts: Sequence[ssl.SSLContext],
    load: Callable[[ssl.SSLContext], None],
    stop: asyncio.Event,
    interval: float = RELOAD_INTERVAL,
) -> None:
    """`load` the files again into the live contexts when any of `paths` changes; new connections
    use the new certificate. A failed load keeps the previous one and is logged: a half-written
    rotation must not stop the service."""
    seen = stamp(paths)
    while not await sleep_or_stop(stop, interval):
        current = stamp(paths)
        if current == seen:
            continue
        try:
            for context in contexts:
                load(context)
        except (OSError, ssl.SSLError) as exc:
            log.error("TLS files changed but cannot be loaded (%s); keeping the previous certificate", exc)
            continue
        seen = current
        log.info("TLS certificate reloaded", extra={"cert": paths[0]})
