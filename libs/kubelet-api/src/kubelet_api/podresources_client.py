"""An asyncio client of the kubelet's PodResourcesLister (v1) that survives kubelet restarts.

The kubelet recreates its socket when it restarts, so the inode changes under a channel that
was dialled before; the client re-dials whenever the socket's inode differs from the one it
connected to, and after any failed call. Callers mount the socket's directory, not the
socket, for the same reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import grpc
from grpc import aio

from kubelet_api import POD_RESOURCES_MAX_MESSAGE_BYTES
from kubelet_api.podresources.v1 import api_pb2, api_pb2_grpc


@dataclass(frozen=True, slots=True)
class Holding:
    """One device held by one container, flattened out of a List response: a device plugin's
    device ID under its resource name, or a DRA device under its driver's name (`resource`), with
    the claim it was allocated through and its pool."""

    namespace: str
    pod: str
    container: str
    resource: str  # extended resource name, or DRA driver name
    device_id: str  # device plugin ID, or DRA device name
    claim: str = ""  # DRA only: the ResourceClaim's name (in the pod's namespace)
    pool: str = ""  # DRA only: the ResourceSlice pool


def flatten(response: api_pb2.ListPodResourcesResponse) -> list[Holding]:
    holdings: list[Holding] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                for device_id in devices.device_ids:
                    holdings.append(Holding(pod.namespace, pod.name, container.name, devices.resource_name, device_id))
            # DRA claims (the kubelet fills these with DynamicResourceAllocation on, 1.34+)
            for dynamic in container.dynamic_resources:
                for claimed in dynamic.claim_resources:
                    holdings.append(
                        Holding(
                            pod.namespace,
                            pod.name,
                            container.name,
                            claimed.driver_name,
                            claimed.device_name,
                            dynamic.claim_name,
                            claimed.pool_name,
                        )
                    )
    return holdings


def allocatable_ids(response: api_pb2.AllocatableResourcesResponse) -> dict[str, set[str]]:
    result: dict[str, set[str]] = {}
    for devices in response.devices:
        result.setdefault(devices.resource_name, set()).update(devices.device_ids)
    return result


class PodResourcesClient:
    def __init__(
        self,
        socket_path: str,
        *,
        timeout: float = 5.0,
        max_message_bytes: int = POD_RESOURCES_MAX_MESSAGE_BYTES,
        keep_open: bool = True,
    ) -> None:
        """`keep_open=False` dials for each call: for callers that poll every few seconds, an
        idle gRPC channel's timers cost more CPU than a unix-socket dial."""
        self.socket_path = socket_path
        self.keep_open = keep_open
        self.timeout = timeout
        self._max_message_bytes = max_message_bytes
        self._channel: aio.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerAsyncStub | None = None
        self._inode: int | None = None

    def _current_inode(self) -> int | None:
        try:
            return os.stat(self.socket_path).st_ino
        except OSError:
            return None

    async def _ensure(self) -> api_pb2_grpc.PodResourcesListerAsyncStub:
        inode = self._current_inode()
        if inode is None:
            await self.close()
            raise FileNotFoundError(f"PodResources socket {self.socket_path} does not exist (is the kubelet running?)")
        if self._stub is None or inode != self._inode:
            await self.close()
            self._channel = aio.insecure_channel(
                f"unix://{self.socket_path}",
                options=[
                    ("grpc.max_receive_message_length", self._max_message_bytes),
                    ("grpc.default_authority", "localhost"),
                ],
            )
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[assignment]
            self._inode = inode
        assert self._stub is not None
        return self._stub

    async def list(self) -> api_pb2.ListPodResourcesResponse:
        stub = await self._ensure()
        try:
            return await stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError:
            await self.close()  # re-dial next time: the kubelet may have restarted
            raise
        finally:
            if not self.keep_open:
                await self.close()

    async def get_allocatable(self) -> api_pb2.AllocatableResourcesResponse:
        stub = await self._ensure()
        try:
            return await stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError:
            await self.close()
            raise
        finally:
            if not self.keep_open:
                await self.close()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None
        self._inode = None
