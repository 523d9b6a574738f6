"""Serve first, then register; and do it again whenever the kubelet restarts.

The kubelet dials the plugin back inside `Register` (10 s timeout) and calls
`GetDevicePluginOptions` before answering, so the plugin's socket must be served before it
registers. When the kubelet restarts it deletes every socket in the directory but its own
and recreates `kubelet.sock`; a plugin registering in the kubelet's first seconds can lose
its socket to that cleanup after registering. So the watcher checks, whenever the directory
changes (inotify), that the plugin's socket is still the one it created and that
`kubelet.sock` is the one it registered with; otherwise it restarts the server and registers
again, with back-off while no kubelet answers. It never exits for that.

The kubelet can also drop a plugin without restarting: when two plugins register one resource
(a handover from another chart's plugin), the device manager keeps the first one's stream, and
when that ends it disconnects whichever client holds the name now, the second. So a stream the
kubelet closes while the plugin runs counts as lost registration too (`stream_lost`), once
`STREAM_LOST_GRACE` has passed without a new `kubelet.sock`: a restarting kubelet closes the
stream too, and registering with the one that is going away would wait out the timeout.

Each process serves its own socket name (`neuron-<resource>-<instance>.sock`). Two plugins of one
resource run side by side on a node during a handover or a surge rollout, and a shared name would
make each replace the other's socket; worse, gRPC unlinks its socket path when a server stops, so
the plugin leaving takes the one staying's socket with it, and the kubelet, dialling a path with
no listener, holds the next registration for its whole 10 s timeout. At start the plugin removes
the sockets of its resource that nobody listens on (left by a killed plugin), never a live one.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc import aio

from kubelet_api import DEVICE_PLUGIN_VERSION
from kubelet_api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from neuron_common.backoff import Backoff
from neuron_common.inotify import DirectoryWatch
from neuron_device_plugin.drain import Drain
from neuron_device_plugin.metrics import PluginMetrics
from neuron_model.resources import Resource

log = logging.getLogger(__name__)

STREAM_LOST_GRACE = 1.0  # seconds


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def socket_name(resource: Resource, instance: str) -> str:
    return f"neuron-{resource.name}-{instance}.sock"


def _listened_on(path: Path) -> bool:
    """Whether a process accepts connections on the Unix socket at `path` (a refused connection
    means whoever bound it is gone)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(str(path))
    except OSError as exc:
        # EAGAIN: the listener's backlog is full, so someone listens.
        return exc.errno in (errno.EAGAIN, errno.EINPROGRESS)
    finally:
        probe.close()
    return True


def remove_stale_sockets(directory: Path, resource: Resource, keep: Path) -> list[Path]:
    """Unlink this resource's plugin sockets in `directory` that nobody listens on, the name an
    earlier version used (`neuron-<resource>.sock`) included; returns what was removed."""
    removed = []
    candidates = [*directory.glob(socket_name(resource, "*")), directory / f"neuron-{resource.name}.sock"]
    for path in candidates:
        if path == keep or not path.is_socket() or _listened_on(path):
            continue
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed


class ResourceServer:
    """One gRPC server on `<dir>/neuron-<resource>-<instance>.sock` for one resource; `instance`
    (default: random) keeps it apart from another plugin process's on the same node."""

    def __init__(
        self,
        resource: Resource,
        directory: Path,
        servicer_factory: Callable[[], api_pb2_grpc.DevicePluginServicer],
        *,
        instance: str | None = None,
    ):
        self.resource = resource
        self.socket = directory / socket_name(resource, instance or secrets.token_hex(4))
        self._factory = servicer_factory
        self._server: aio.Server | None = None
        self.inode: int | None = None

    async def start(self) -> None:
        await self.stop(grace=0)
        for stale in remove_stale_sockets(self.socket.parent, self.resource, keep=self.socket):
            log.info("removed %s: nobody listens on it", stale, extra={"resource": self.resource.full_name})
        if self.socket.exists() or self.socket.is_symlink():
            self.socket.unlink()  # ours from before a restart of the server: a bound path refuses bind
        server = aio.server(options=[("grpc.so_reuseport", 0)])
        api_pb2_grpc.add_DevicePluginServicer_to_server(self._factory(), server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server
        self.inode = _inode(self.socket)

    def intact(self) -> bool:
        return self._server is not None and self.inode is not None and _inode(self.socket) == self.inode

    async def stop(self, grace: float | None = 2.0) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        if self.inode is not None and _inode(self.socket) == self.inode:
            self.socket.unlink(missing_ok=True)
        self.inode = None


async def register(kubelet_socket: Path, resource: Resource, endpoint: str, timeout: float) -> None:  # noqa: ASYNC109 - a gRPC deadline
    async with aio.insecure_channel(
        f"unix://{kubelet_socket}", options=[("grpc.default_authority", "localhost")]
    ) as ch:
        stub = api_pb2_grpc.RegistrationStub(ch)
        request = api_pb2.RegisterRequest(
            version=DEVICE_PLUGIN_VERSION,
            endpoint=endpoint,
            resource_name=resource.full_name,
            options=api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
        )
        await stub.Register(request, timeout=timeout, wait_for_ready=True)


@dataclass(eq=False)
class Registrar:
    server: ResourceServer
    kubelet_socket: Path
    metrics: PluginMetrics
    register_timeout: float = field(default=10.0, kw_only=True)
    registered: bool = field(default=False, init=False)
    _kubelet_inode: int | None = field(default=None, init=False)
    _backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.05, maximum=10.0), init=False)
    _failures_logged: int = field(default=0, init=False)
    _started_once: bool = field(default=False, init=False)
    _stream_lost_at: float | None = field(default=None, init=False)  # the loop's time
    stream_lost_grace: float = field(default=STREAM_LOST_GRACE, kw_only=True)
    # set when something outside the directory's changes needs a step (a lost stream)
    attention: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    # set at each successful registration (tests, benchmarks)
    registered_event: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    @property
    def resource(self) -> Resource:
        return self.server.resource

    def stream_lost(self) -> None:
        """The kubelet closed this resource's last ListAndWatch, and the plugin is not stopping."""
        if self.registered and self._stream_lost_at is None:
            self._stream_lost_at = asyncio.get_running_loop().time()
            self.attention.set()

    def stream_lost_due(self) -> float | None:
        """The loop's time at which a lost stream calls for registering again, if one was lost."""
        return None if self._stream_lost_at is None else self._stream_lost_at + self.stream_lost_grace

    def _needs_work(self) -> str | None:
        if not self.server.intact():
            return "plugin socket missing or replaced"
        if not self.registered:
            return "not registered"
        due = self.stream_lost_due()
        if due is not None and asyncio.get_running_loop().time() >= due:
            return "the kubelet closed ListAndWatch (another plugin of this resource went away, or the kubelet stops)"
        if _inode(self.kubelet_socket) != self._kubelet_inode:
            return "kubelet.sock was recreated (kubelet restarted)"
        return None

    async def step(self) -> float | None:
        """One check; when something is wrong, one attempt to put it right. Returns the delay
        before the next attempt after a failure, None when all is well."""
        name = self.resource.full_name
        directory = self.server.socket.parent
        why = self._needs_work()
        if why is None:
            return None
        if self.registered:
            log.warning("re-registering %s: %s", name, why, extra={"resource": name})
            self.registered = False
            self._stream_lost_at = None
            self.metrics.registered.labels(name).set(0)
        if not directory.is_dir():
            if self._failures_logged == 0:
                log.warning("device-plugins directory %s does not exist; waiting for the kubelet", directory)
            self._failures_logged += 1
            return self._backoff.next_delay()
        try:
            if not self.server.intact():
                if self._started_once:
                    self.metrics.server_restarts.labels(name).inc()
                await self.server.start()
                self._started_once = True
            kubelet_inode = _inode(self.kubelet_socket)
            if kubelet_inode is None:
                raise FileNotFoundError(f"{self.kubelet_socket} does not exist")
            await register(self.kubelet_socket, self.resource, self.server.socket.name, self.register_timeout)
        except (grpc.RpcError, OSError) as exc:
            self.metrics.registration_failures.labels(name).inc()
            detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            if self._failures_logged % 20 == 0:  # every 20th, so a long kubelet outage stays readable
                log.warning(
                    "registering %s with the kubelet failed (attempt %d): %s; retrying",
                    name,
                    self._failures_logged + 1,
                    detail,
                    extra={"resource": name},
                )
            self._failures_logged += 1
            return self._backoff.next_delay()
        self._kubelet_inode = kubelet_inode
        self.registered = True
        self._backoff.reset()
        self._failures_logged = 0
        self.metrics.registrations.labels(name).inc()
        self.metrics.registered.labels(name).set(1)
        self.registered_event.set()
        log.info("registered %s with the kubelet", name, extra={"resource": name, "socket": str(self.server.socket)})
        return None

    async def close(self) -> None:
        name = self.resource.full_name
        self.registered = False
        self.metrics.registered.labels(name).set(0)
        await self.server.stop()


async def watch(
    registrars: list[Registrar], stop: asyncio.Event, resync: float = 5.0, drain: Drain | None = None
) -> None:
    """One loop for every resource, woken by inotify when the device-plugins directory changes
    (a socket deleted, kubelet.sock recreated), by a retry falling due, or every `resync`
    seconds as a safety net. Without inotify it polls every 0.2 s. Once stopped, the servers keep
    answering until `drain` has settled, then close."""
    retry_at = {id(r): 0.0 for r in registrars}
    loop = asyncio.get_running_loop()
    directory = DirectoryWatch(registrars[0].server.socket.parent)
    try:
        while not stop.is_set():
            now = loop.time()
            due = [r for r in registrars if retry_at[id(r)] <= now]
            delays = await asyncio.gather(*(r.step() for r in due))
            for r, delay in zip(due, delays, strict=True):
                retry_at[id(r)] = now + delay if delay is not None else 0.0
            pending = [t - loop.time() for t in retry_at.values() if t > now]
            pending += [t - loop.time() for r in registrars if (t := r.stream_lost_due()) is not None]
            timeout = max(min([resync, *pending]), 0.01)
            changed = asyncio.ensure_future(directory.wait(timeout))
            stopped = asyncio.ensure_future(stop.wait())
            attention = [asyncio.ensure_future(r.attention.wait()) for r in registrars]
            await asyncio.wait([changed, stopped, *attention], return_when=asyncio.FIRST_COMPLETED)
            for waiter in (changed, stopped, *attention):
                waiter.cancel()
            for r in registrars:
                r.attention.clear()
    finally:
        directory.close()
        if drain is not None and stop.is_set():
            await drain.settled()
        await asyncio.gather(*(r.close() for r in registrars))
