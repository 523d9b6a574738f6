"""The v1beta1 DevicePlugin service for one resource."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc

from kubelet_api import HEALTHY, UNHEALTHY, ServicerContext
from kubelet_api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from neuron_common.lifecycle import wait_any
from neuron_device_plugin.cdi import SpecKeeper, cdi_name
from neuron_device_plugin.drain import Drain
from neuron_device_plugin.metrics import PluginMetrics
from neuron_device_plugin.state import AdvertisedId, AllocationRefused, PluginState, whole_node_ultraserver_env
from neuron_driver import layout
from neuron_model import resources
from neuron_model.allocator import choose_cores, choose_devices
from neuron_model.resources import Kind, Resource
from neuron_model.ultraserver import UltraServerReading

log = logging.getLogger(__name__)


def to_proto(ids: list[AdvertisedId]) -> list[api_pb2.Device]:
    devices = []
    for a in ids:
        topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=a.numa_node)]) if a.numa_node is not None else None
        devices.append(api_pb2.Device(ID=a.id, health=HEALTHY if a.healthy else UNHEALTHY, topology=topology))
    return devices


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(
        self,
        resource: Resource,
        state: PluginState,
        metrics: PluginMetrics,
        stop: asyncio.Event,
        *,
        host_dev_root: Path,
        cdi: SpecKeeper | None = None,
        ultraserver_nodes: int | None = None,
        ultraserver: Callable[[], UltraServerReading] | None = None,
        drain: Drain | None = None,
        on_stream_lost: Callable[[], None] | None = None,
    ) -> None:
        """`cdi` (--cdi): answer with CDI names, from the spec this keeps; `ultraserver_nodes` (--ultraserver-env):
        give a container holding all of the node's devices the runtime's UltraServer variables for a job of that
        many nodes; `ultraserver`: the node's identity as the driver tells it now (default: the inventory's, as
        last scanned); `drain`: how long ListAndWatch stays open after the stop (None: it ends at once);
        `on_stream_lost`: called when the kubelet closes the last ListAndWatch while the plugin runs, which it
        does without restarting when another plugin that registered the same resource before this one goes away
        (the device manager then disconnects whichever client holds the name): the plugin must register again,
        or its devices stay unhealthy."""
        self.resource = resource
        self.state = state
        self.metrics = metrics
        self.stop = stop
        self.host_dev_root = host_dev_root
        self.cdi = cdi
        self.ultraserver_nodes = ultraserver_nodes
        self.ultraserver = ultraserver or (lambda: state.inventory.ultraserver)
        self.drain = drain
        self.on_stream_lost = on_stream_lost
        self.streams = 0

    async def GetDevicePluginOptions(  # the gRPC method name
        self, request: api_pb2.Empty, context: ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: ServicerContext
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        self.streams += 1
        log.info("kubelet opened ListAndWatch", extra={"resource": self.resource.full_name})
        last: list[AdvertisedId] | None = None
        try:
            # The kubelet offers only what this stream lists, so listing nothing until the kubelet's
            # holdings are known keeps a core of a device held through the other resource (or the
            # reverse) from being handed out again after the plugin restarts.
            if not self.state.holdings_known.is_set():
                log.info(
                    "waiting for the kubelet's PodResources List before listing devices",
                    extra={"resource": self.resource.full_name},
                )
                await wait_any(self.state.holdings_known, self.stop)
            while not self.stop.is_set():
                changed = self.state.changed
                current = self.state.advertised(self.resource)
                if current != last:
                    yield api_pb2.ListAndWatchResponse(devices=to_proto(current))
                    last = current
                await wait_any(changed, self.stop)
            if self.drain is not None:
                await self.drain.settled()  # the kubelet drops the connection, and calls on it, when this ends
        finally:
            self.streams -= 1
            log.info("ListAndWatch ended", extra={"resource": self.resource.full_name})
            if self.streams == 0 and not self.stop.is_set() and self.on_stream_lost is not None:
                self.on_stream_lost()

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        self._called()
        responses = []
        holdings_free = {a.id for a in self.state.advertised(self.resource) if a.healthy}
        for req in request.container_requests:
            must = self._indices(req.must_include_deviceIDs)
            # Drop what was handed out through another resource since the kubelet last looked.
            available = self._indices(i for i in req.available_deviceIDs if i in holdings_free)
            size = req.allocation_size
            if self.resource.kind is Kind.DEVICE:
                choice = choose_devices(self.state.topology, available, must, size)
                ids = [resources.device_id(i) for i in choice.ids]
            else:
                choice = choose_cores(self.state.topology, available, must, size)
                ids = [resources.core_id(i) for i in choice.ids]
            if not choice.valid:
                self.metrics.preferred_invalid.labels(self.resource.full_name).inc()
                log.warning(
                    "no topology-valid set of %d for %s: %s; preferring the best available %s",
                    size,
                    self.resource.full_name,
                    choice.reason,
                    ",".join(ids),
                    extra={"resource": self.resource.full_name, "size": size},
                )
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def _called(self) -> None:
        if self.drain is not None:
            self.drain.call()

    def _indices(self, ids: object) -> list[int]:
        out = []
        for raw in ids:  # type: ignore[attr-defined]
            parsed = resources.parse_id(raw)
            if parsed is not None and parsed[0] is self.resource.kind:
                out.append(parsed[1])
        return out

    async def Allocate(self, request: api_pb2.AllocateRequest, context: ServicerContext) -> api_pb2.AllocateResponse:
        self._called()
        responses = []
        allocated: list[list[int]] = []
        for req in request.container_requests:
            try:
                indices = self.state.check_allocation(self.resource, req.devices_ids)
                extra = self._ultraserver_env(indices)
            except AllocationRefused as exc:
                self.metrics.allocation_errors.labels(self.resource.full_name, exc.reason).inc()
                log.warning(
                    "refused Allocate: %s",
                    exc,
                    extra={"resource": self.resource.full_name, "ids": ",".join(req.devices_ids)},
                )
                code = (
                    grpc.StatusCode.INVALID_ARGUMENT
                    if exc.reason == "unknown_id"
                    else grpc.StatusCode.FAILED_PRECONDITION
                )
                await context.abort(code, str(exc))
            responses.append(self._response(indices, extra))
            allocated.append(indices)
        if self.cdi is not None:
            await self._ensure_cdi_spec(self.cdi, context)
        # Recorded only once every container's request passed: a refused call holds nothing.
        for indices in allocated:
            self.state.record_allocation(self.resource, indices)
            self.metrics.allocations.labels(self.resource.full_name).inc()
        return api_pb2.AllocateResponse(container_responses=responses)

    async def _ensure_cdi_spec(self, keeper: SpecKeeper, context: ServicerContext) -> None:
        """The names this Allocate answers with resolve only through the spec on disk, read by the
        runtime when it creates the container: a spec it cannot write refuses the call, so the pod
        fails admission with the cause rather than at its start with none."""
        try:
            if keeper.ensure(self.state.known):
                log.info("wrote the CDI spec %s again (gone, or the known devices changed)", keeper.path)
        except OSError as exc:
            self.metrics.errors.labels("cdi_spec").inc()
            log.error("cannot write the CDI spec %s: %s", keeper.path, exc)
            await context.abort(grpc.StatusCode.INTERNAL, f"cannot write the CDI spec {keeper.path}: {exc}")

    def _ultraserver_env(self, indices: list[int]) -> dict[str, str]:
        """The runtime's UltraServer variables, for a container holding all of the node's devices
        when --ultraserver-env is on; AllocationRefused when the node's identity cannot give them."""
        if self.ultraserver_nodes is None or not self.state.holds_every_device(self.resource, indices):
            return {}
        try:
            return whole_node_ultraserver_env(self.ultraserver_nodes, self.ultraserver())
        except ValueError as exc:
            raise AllocationRefused(
                "ultraserver",
                f"--ultraserver-env {self.ultraserver_nodes}: a container holding all of this node's Neuron devices "
                f"gets the runtime's UltraServer variables, but {exc}",
            ) from None

    def _response(self, indices: list[int], extra: dict[str, str]) -> api_pb2.ContainerAllocateResponse:
        devices = self.state.devices_of(self.resource, indices)
        cores = self.state.visible_cores(self.resource, indices)
        envs = {"NEURON_RT_VISIBLE_CORES": ",".join(map(str, cores))}
        lnc = self.state.lnc_env
        if lnc is not None:
            envs["NEURON_LOGICAL_NC_CONFIG"] = lnc
        envs.update(extra)
        response = api_pb2.ContainerAllocateResponse(envs=envs)
        if self.cdi is not None:
            response.cdi_devices.extend(api_pb2.CDIDevice(name=cdi_name(self.resource.prefix, d)) for d in devices)
        else:
            response.devices.extend(
                api_pb2.DeviceSpec(
                    container_path=f"/dev/neuron{d}",
                    host_path=str(layout.HostLayout(self.host_dev_root).dev_node(d)),
                    permissions="rw",
                )
                for d in devices
            )
        log.info(
            "allocated %s",
            ",".join(f"neuron{d}" for d in devices),
            extra={"resource": self.resource.full_name, "visible_cores": envs["NEURON_RT_VISIBLE_CORES"], **extra},
        )
        return response

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        self._called()
        return api_pb2.PreStartContainerResponse()
