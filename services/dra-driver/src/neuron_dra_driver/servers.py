"""The kubelet-facing gRPC servers: DRA v1 (`NodePrepareResources`, `NodeUnprepareResources`) and
DRA resource health (`NodeWatchResources`) on `<plugins>/neuron.aws.com/dra.sock`, and plugin
registration on `<plugins_registry>/neuron.aws.com-reg.sock`.

The DRA socket is served before the registration socket exists: the kubelet dials the endpoint
as soon as it has read `GetInfo`. Stopping removes the registration socket first, so the kubelet
deregisters before the DRA socket goes. With a pod UID both names carry it (`config.dra_socket_name`),
so during a rolling update the new instance serves beside the old one; at start it removes only
sockets of earlier instances that nothing listens on any more (a pod killed before it could clean up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path

from grpc import aio

from kubelet_api import DRA_HEALTH_SERVICE, DRA_PLUGIN_TYPE, DRA_V1_SERVICE, ServicerContext
from kubelet_api.dra.v1 import api_pb2 as dra
from kubelet_api.dra.v1 import api_pb2_grpc as dra_grpc
from kubelet_api.dra_health.v1alpha1 import api_pb2 as health_pb
from kubelet_api.dra_health.v1alpha1 import api_pb2_grpc as health_grpc
from kubelet_api.pluginregistration.v1 import api_pb2 as reg
from kubelet_api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from neuron_common.lifecycle import wait_any
from neuron_dra_driver import slices
from neuron_dra_driver.claims import ClaimRef
from neuron_dra_driver.config import is_instance_socket
from neuron_dra_driver.driver import Driver
from neuron_dra_driver.metrics import DriverMetrics
from neuron_health.device_health import DeviceHealth

log = logging.getLogger(__name__)

# The kubelet marks a device's health unknown when it hears nothing for this long; it is resent
# at a third of it.
HEALTH_TIMEOUT_SECONDS = 60


class DraServicer(dra_grpc.DRAPluginServicer):
    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    async def NodePrepareResources(
        self, request: dra.NodePrepareResourcesRequest, context: ServicerContext
    ) -> dra.NodePrepareResourcesResponse:
        results = await self.driver.prepare(_refs(request.claims))
        response = dra.NodePrepareResourcesResponse()
        for uid, result in results.items():
            if isinstance(result, str):
                response.claims[uid].error = result
            else:
                response.claims[uid].devices.extend(
                    dra.Device(
                        request_names=[d.request],
                        pool_name=d.pool,
                        device_name=d.device,
                        cdi_device_ids=list(d.cdi_ids),
                        **({"share_id": d.share_id} if d.share_id else {}),
                    )
                    for d in result.devices
                )
        return response

    async def NodeUnprepareResources(
        self, request: dra.NodeUnprepareResourcesRequest, context: ServicerContext
    ) -> dra.NodeUnprepareResourcesResponse:
        errors = await self.driver.unprepare(_refs(request.claims))
        return dra.NodeUnprepareResourcesResponse(  # every claim must appear, "" for success
            claims={uid: dra.NodeUnprepareResourceResponse(error=error) for uid, error in errors.items()}
        )


def _refs(claims: Iterable[dra.Claim]) -> Iterator[ClaimRef]:
    return (ClaimRef(c.uid, c.namespace, c.name) for c in claims)


class HealthServicer(health_grpc.DRAResourceHealthServicer):
    """The full list of this node's devices and their health, on every change and at least every
    third of the timeout."""

    def __init__(self, health: DeviceHealth, node_name: str, stop: asyncio.Event) -> None:
        self.health = health
        self.node_name = node_name
        self.stop = stop

    def snapshot(self) -> health_pb.NodeWatchResourcesResponse:
        unhealthy = self.health.unhealthy()
        now = int(time.time())
        devices = []
        inventory = self.health.inventory
        for index in sorted(self.health.known):
            device = inventory.device(index)
            names = [slices.device_name(index)] + [
                slices.core_name(c) for c in (device.logical_cores if device else ())
            ]
            sick = index in unhealthy
            for name in names:
                devices.append(
                    health_pb.DeviceHealth(
                        device=health_pb.DeviceIdentifier(pool_name=self.node_name, device_name=name),
                        health=health_pb.UNHEALTHY if sick else health_pb.HEALTHY,
                        last_updated_time=now,
                        health_check_timeout_seconds=HEALTH_TIMEOUT_SECONDS,
                        message=unhealthy.get(index, "")[:1024],
                    )
                )
        return health_pb.NodeWatchResourcesResponse(devices=devices)

    async def NodeWatchResources(
        self, request: health_pb.NodeWatchResourcesRequest, context: ServicerContext
    ) -> AsyncIterator[health_pb.NodeWatchResourcesResponse]:
        while not self.stop.is_set():
            changed = self.health.changed
            yield self.snapshot()
            await wait_any(changed, self.stop, timeout=HEALTH_TIMEOUT_SECONDS / 3)


class RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: Path, metrics: DriverMetrics, on_change: Callable[[], None]) -> None:
        self.endpoint = endpoint
        self.metrics = metrics
        self.registered = False
        self.error = ""
        self.on_change = on_change

    async def GetInfo(self, request: reg.InfoRequest, context: ServicerContext) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=slices.DRIVER,
            endpoint=str(self.endpoint),
            supported_versions=[DRA_V1_SERVICE, DRA_HEALTH_SERVICE],
        )

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: ServicerContext
    ) -> reg.RegistrationStatusResponse:
        self.registered = request.plugin_registered
        self.error = request.error
        self.metrics.registered.set(1 if request.plugin_registered else 0)
        if request.plugin_registered:
            log.info("registered with the kubelet")
        else:
            log.error("the kubelet refused the registration: %s", request.error)
        self.on_change()
        return reg.RegistrationStatusResponse()


def remove_dead_sockets(directory: Path, own: Path) -> list[Path]:
    """Removes this driver's sockets in `directory` other than `own` whose listener is gone (a
    connect is refused); one that answers, or cannot be told, is another instance's and stays."""
    removed: list[Path] = []
    try:
        entries = sorted(directory.iterdir())
    except FileNotFoundError:
        return removed
    for path in entries:
        if path.name == own.name or not is_instance_socket(path.name) or not path.is_socket():
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            try:
                probe.connect(str(path))
                continue  # a live instance
            except ConnectionRefusedError:
                pass
            except OSError:
                continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(path)
            log.info("removed %s: no instance listens on it any more", path)
    return removed


def _unlink_stale(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a socket left by a previous run refuses bind


async def serve(
    driver: Driver,
    health: DeviceHealth,
    registration: RegistrationServicer,
    dra_socket: Path,
    registration_socket: Path,
    node_name: str,
    stop: asyncio.Event,
) -> None:
    """Serve until `stop`; then deregister and close both sockets (calls in flight get 5 s)."""
    for own in (dra_socket, registration_socket):
        await asyncio.to_thread(remove_dead_sockets, own.parent, own)  # each probe may wait a second
    _unlink_stale(dra_socket)
    dra_server = aio.server(options=[("grpc.so_reuseport", 0)])
    dra_grpc.add_DRAPluginServicer_to_server(DraServicer(driver), dra_server)
    health_grpc.add_DRAResourceHealthServicer_to_server(HealthServicer(health, node_name, stop), dra_server)
    dra_server.add_insecure_port(f"unix://{dra_socket}")
    await dra_server.start()
    _unlink_stale(registration_socket)
    reg_server = aio.server(options=[("grpc.so_reuseport", 0)])
    reg_grpc.add_RegistrationServicer_to_server(registration, reg_server)
    reg_server.add_insecure_port(f"unix://{registration_socket}")
    await reg_server.start()
    log.info("serving DRA on %s, registration on %s", dra_socket, registration_socket)
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(registration_socket)
        await reg_server.stop(0)
        await dra_server.stop(5)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dra_socket)
