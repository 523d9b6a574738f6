"""A protocol-faithful stand-in for the kubelet's device manager and PodResources API.

STAND-IN, NOT THE REAL KUBELET: used where no real kubelet runs (unit-level plugin tests and
benchmarks). It speaks the real v1beta1 and podresources/v1 gRPC, built from the same
`.proto` files, over unix sockets, and copies the device manager's observable behaviour
(`shared/reference/kubelet-and-tooling.md` sections 5, 6 and 9):

- serves `Registration` on `<dir>/kubelet.sock`; inside `Register` validates the version and
  resource name, dials the plugin's socket back (10 s, wait for ready), calls
  `GetDevicePluginOptions`, and only after answering opens `ListAndWatch`;
- every ListAndWatch message replaces the resource's device set; a stream that ends marks
  every device unhealthy;
- a second registration of a resource replaces its client without stopping the first, whose
  stream goes on feeding the resource; when any of its streams ends, the client registered under
  the name *now* is disconnected (`runClient`'s `getClient(name)` in the device manager's
  plugin/v1beta1/handler.go, 1.34 to 1.36): a plugin that replaced another is dropped when the
  other goes away, and must register again;
- per container and resource: candidates = healthy - allocated; `GetPreferredAllocation`
  (when advertised) with available/must-include/size; the answer intersected with the
  candidates and topped up; then one `Allocate` RPC with the IDs in a different order;
- PodResources `List` reports allocations one `ContainerDevices` entry per device (with
  topology) and `GetAllocatableResources` the healthy devices; a token bucket of 100 QPS
  with burst 10 answers RESOURCE_EXHAUSTED;
- `restart()` deletes every socket in the directory but its own and serves a new
  `kubelet.sock` (new inode), as a restarting kubelet does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc import aio
from polling import until_async

from kubelet_api import DEVICE_PLUGIN_VERSION, HEALTHY, UNHEALTHY
from kubelet_api.deviceplugin.v1beta1 import api_pb2 as dp
from kubelet_api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from kubelet_api.podresources.v1 import api_pb2 as pr
from kubelet_api.podresources.v1 import api_pb2_grpc as pr_grpc
from neuron_sim import node as sim

_QUALIFIED = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


class AdmissionError(Exception):
    """What the kubelet reports as UnexpectedAdmissionError."""


@dataclass
class Endpoint:
    resource: str
    socket: Path
    options: dp.DevicePluginOptions
    channel: aio.Channel
    stub: dp_grpc.DevicePluginStub
    devices: dict[str, dp.Device] = field(default_factory=dict)
    updates: int = 0
    updated: asyncio.Event = field(default_factory=asyncio.Event)
    stream_task: asyncio.Task[None] | None = None
    stopped: bool = False


@dataclass
class Allocation:
    namespace: str
    pod: str
    container: str
    resource: str
    ids: list[str]
    response: dp.ContainerAllocateResponse


class _TokenBucket:
    def __init__(self, qps: float = 100.0, burst: int = 10) -> None:
        self.qps, self.burst = qps, burst
        self.tokens = float(burst)
        self.last = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.qps)
        self.last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class FakeKubelet:
    @classmethod
    @contextlib.asynccontextmanager
    async def on_simulated_node(cls, instance_type: str, prefix: str) -> AsyncIterator[tuple[Path, FakeKubelet]]:
        """A work directory (on tmpfs where there is one: socket paths stay short) holding a simulated
        node of `instance_type` under `node/` and this kubelet's sockets under `dp/` and `pr/`; the
        kubelet stopped and the directory removed afterwards."""
        work = Path(tempfile.mkdtemp(prefix=prefix))
        sim.create(work / "node", instance_type)
        kubelet = cls(work / "dp", work / "pr")
        try:
            yield work, kubelet
        finally:
            await kubelet.stop()
            shutil.rmtree(work, ignore_errors=True)

    def __init__(self, plugin_dir: Path, pod_resources_dir: Path | None = None) -> None:
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / "kubelet.sock"
        self.pod_resources_socket = (pod_resources_dir or plugin_dir.parent / "pod-resources") / "kubelet.sock"
        self.endpoints: dict[str, Endpoint] = {}
        self.allocations: list[Allocation] = []
        self.registrations: list[str] = []
        self.superseded: list[Endpoint] = []  # replaced by a later registration, still streaming
        self.disconnects: list[str] = []  # resources whose current client runClient disconnected
        self._closing: set[asyncio.Task[None]] = set()
        self.register_errors: list[str] = []
        self.registered = asyncio.Event()
        self._server: aio.Server | None = None
        self._pr_server: aio.Server | None = None
        self.bucket = _TokenBucket()
        self.list_calls = 0
        self.podresources_enabled = True

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._cleanup_plugin_dir()
        self._server = aio.server()
        dp_grpc.add_RegistrationServicer_to_server(_Registration(self), self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        await self._server.start()
        if self.podresources_enabled:
            await self._start_podresources()

    async def _start_podresources(self) -> None:
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.pod_resources_socket.unlink()
        self._pr_server = aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), self._pr_server)
        self._pr_server.add_insecure_port(f"unix://{self.pod_resources_socket}")
        await self._pr_server.start()

    def _cleanup_plugin_dir(self) -> None:
        """The device manager's CleanupPluginDirectory: every socket but its own goes."""
        for entry in self.plugin_dir.iterdir():
            if entry.is_socket() and entry.name != "kubelet.sock":
                entry.unlink()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    async def stop(self) -> None:
        for endpoint in [*self.superseded, *self.endpoints.values()]:
            await self._drop(endpoint)
        self.superseded.clear()
        self.endpoints.clear()
        await asyncio.gather(*self._closing, return_exceptions=True)
        for server in (self._server, self._pr_server):
            if server is not None:
                await server.stop(0)
        self._server = self._pr_server = None
        for path in (self.socket, self.pod_resources_socket):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    async def restart(self, down_for: float = 0.0) -> None:
        """Stop, optionally stay away, then start again: sockets cleaned, new kubelet.sock."""
        await self.stop()
        self.registered.clear()
        if down_for:
            await asyncio.sleep(down_for)
        await self.start()

    async def _drop(self, endpoint: Endpoint) -> None:
        endpoint.stopped = True
        if endpoint.stream_task is not None:
            endpoint.stream_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await endpoint.stream_task
        await endpoint.channel.close()

    # -- registration -----------------------------------------------------------------------------
    async def handle_register(self, request: dp.RegisterRequest, context: grpc.aio.ServicerContext) -> dp.Empty:  # type: ignore[type-arg]
        if request.version != DEVICE_PLUGIN_VERSION:
            msg = f"requested API version {request.version!r} is not supported by kubelet"
            self.register_errors.append(msg)
            await context.abort(grpc.StatusCode.UNKNOWN, msg)
        if not _QUALIFIED.match(request.resource_name) or "kubernetes.io/" in request.resource_name:
            msg = f"the ResourceName {request.resource_name!r} is invalid"
            self.register_errors.append(msg)
            await context.abort(grpc.StatusCode.UNKNOWN, msg)
        socket = self.plugin_dir / request.endpoint
        channel = aio.insecure_channel(f"unix://{socket}", options=[("grpc.default_authority", "localhost")])
        stub = dp_grpc.DevicePluginStub(channel)
        try:
            options = await stub.GetDevicePluginOptions(dp.Empty(), timeout=10, wait_for_ready=True)
        except grpc.RpcError as exc:
            await channel.close()
            msg = f"failed to dial device plugin {socket}: {exc}"
            self.register_errors.append(msg)
            await context.abort(grpc.StatusCode.UNKNOWN, msg)
        previous = self.endpoints.pop(request.resource_name, None)
        if previous is not None and not previous.stopped:
            self.superseded.append(previous)  # registerClient replaces it; its stream runs on
        endpoint = Endpoint(request.resource_name, socket, options, channel, stub)
        self.endpoints[request.resource_name] = endpoint
        self.registrations.append(request.resource_name)
        # Register returns first; the stream is opened afterwards, as the kubelet's goroutine does.
        endpoint.stream_task = asyncio.get_running_loop().create_task(self._list_and_watch(endpoint))
        self.registered.set()
        return dp.Empty()

    async def _list_and_watch(self, endpoint: Endpoint) -> None:
        await asyncio.sleep(0)
        try:
            async for message in endpoint.stub.ListAndWatch(dp.Empty()):
                # a superseded client's messages still set the resource's devices
                target = self.endpoints.get(endpoint.resource, endpoint)
                target.devices = {d.ID: d for d in message.devices}
                target.updates += 1
                event, target.updated = target.updated, asyncio.Event()
                event.set()
        except (grpc.RpcError, asyncio.CancelledError):
            pass
        finally:
            # The stream ended: every device of the resource is unhealthy until it comes back.
            for device in endpoint.devices.values():
                device.health = UNHEALTHY
            event, endpoint.updated = endpoint.updated, asyncio.Event()
            event.set()
            if not endpoint.stopped:
                self._disconnect_current(endpoint.resource)

    def _disconnect_current(self, resource: str) -> None:
        """runClient after a client's Run returned: the client registered under the name now, which
        may be a newer plugin's, is disconnected (its devices unhealthy, its connection closed)."""
        current = self.endpoints.get(resource)
        if current is None or current.stopped:
            return
        current.stopped = True
        self.disconnects.append(resource)
        for device in current.devices.values():
            device.health = UNHEALTHY
        event, current.updated = current.updated, asyncio.Event()
        event.set()
        if current.stream_task is not None and current.stream_task is not asyncio.current_task():
            current.stream_task.cancel()
        closing = asyncio.get_running_loop().create_task(current.channel.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def wait_registered(self, resources: Iterable[str], timeout: float = 10.0) -> None:
        wanted = set(resources)
        await until_async(
            lambda: all(
                r in self.endpoints and self.endpoints[r].updates > 0 and not self.endpoints[r].stopped for r in wanted
            ),
            f"plugins registered: {sorted(wanted)}",
            timeout,
            0.01,
            TimeoutError,
        )

    async def wait_update(self, resource: str, timeout: float = 5.0) -> None:
        await asyncio.wait_for(self.endpoints[resource].updated.wait(), timeout)

    # -- views ------------------------------------------------------------------------------------
    def healthy(self, resource: str) -> set[str]:
        endpoint = self.endpoints.get(resource)
        if endpoint is None or endpoint.stopped:
            return set()
        return {i for i, d in endpoint.devices.items() if d.health == HEALTHY}

    def capacity(self, resource: str) -> int:
        endpoint = self.endpoints.get(resource)
        return 0 if endpoint is None else len(endpoint.devices)

    def allocated(self, resource: str) -> set[str]:
        return {i for a in self.allocations if a.resource == resource for i in a.ids}

    # -- admission --------------------------------------------------------------------------------
    async def allocate(
        self,
        resource: str,
        count: int,
        *,
        pod: str = "pod",
        container: str = "main",
        namespace: str = "default",
        reuse: Iterable[str] = (),
    ) -> dp.ContainerAllocateResponse:
        endpoint = self.endpoints.get(resource)
        if endpoint is None:
            raise AdmissionError(f"cannot allocate unregistered device {resource}")
        picked = list(reuse)
        candidates = self.healthy(resource) - self.allocated(resource)
        if not self.healthy(resource):
            raise AdmissionError(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
        needed = count - len(picked)
        if needed > len(candidates):
            raise AdmissionError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {count}, Available: {len(candidates)}"
            )
        chosen = list(picked)
        if endpoint.options.get_preferred_allocation_available:
            request = dp.PreferredAllocationRequest(
                container_requests=[
                    dp.ContainerPreferredAllocationRequest(
                        available_deviceIDs=sorted(candidates | set(picked)),
                        must_include_deviceIDs=picked,
                        allocation_size=count,
                    )
                ]
            )
            response = await endpoint.stub.GetPreferredAllocation(request, timeout=10)
            preferred = response.container_responses[0].deviceIDs
            for device_id in preferred:
                if device_id in candidates and device_id not in chosen and len(chosen) < count:
                    chosen.append(device_id)
        for device_id in sorted(candidates):
            if len(chosen) >= count:
                break
            if device_id not in chosen:
                chosen.append(device_id)
        ids = list(chosen)
        random.shuffle(ids)  # the kubelet does not keep GetPreferredAllocation's order
        try:
            answer = await endpoint.stub.Allocate(
                dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]), timeout=10
            )
        except grpc.aio.AioRpcError as exc:
            raise AdmissionError(f"Allocate failed: {exc.code().name}: {exc.details()}") from exc
        if not answer.container_responses:
            raise AdmissionError("Allocate returned no container response")
        response = answer.container_responses[0]
        self.allocations.append(Allocation(namespace, pod, container, resource, ids, response))
        return response

    def release(self, pod: str, namespace: str = "default") -> None:
        self.allocations = [a for a in self.allocations if not (a.pod == pod and a.namespace == namespace)]


class _Registration(dp_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def Register(self, request: dp.RegisterRequest, context: grpc.aio.ServicerContext) -> dp.Empty:  # type: ignore[override,type-arg]
        return await self.kubelet.handle_register(request, context)


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def _limit(self, context: grpc.aio.ServicerContext) -> None:  # type: ignore[type-arg]
        if not self.kubelet.bucket.take():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")

    def _topology(self, resource: str, device_id: str) -> pr.TopologyInfo | None:
        endpoint = self.kubelet.endpoints.get(resource)
        device = endpoint.devices.get(device_id) if endpoint else None
        if device is None or not device.HasField("topology"):
            return None
        return pr.TopologyInfo(nodes=[pr.NUMANode(ID=n.ID) for n in device.topology.nodes])

    async def List(
        self, request: pr.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pr.ListPodResourcesResponse:  # type: ignore[override,type-arg]
        await self._limit(context)
        self.kubelet.list_calls += 1
        pods: dict[tuple[str, str], dict[str, list[pr.ContainerDevices]]] = {}
        for a in self.kubelet.allocations:
            containers = pods.setdefault((a.namespace, a.pod), {})
            for device_id in a.ids:
                containers.setdefault(a.container, []).append(
                    pr.ContainerDevices(
                        resource_name=a.resource, device_ids=[device_id], topology=self._topology(a.resource, device_id)
                    )
                )
        return pr.ListPodResourcesResponse(
            pod_resources=[
                pr.PodResources(
                    name=pod,
                    namespace=ns,
                    containers=[pr.ContainerResources(name=c, devices=devs) for c, devs in containers.items()],
                )
                for (ns, pod), containers in pods.items()
            ]
        )

    async def GetAllocatableResources(  # type: ignore[override]
        self,
        request: pr.AllocatableResourcesRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> pr.AllocatableResourcesResponse:
        await self._limit(context)
        devices = [
            pr.ContainerDevices(
                resource_name=resource, device_ids=[device_id], topology=self._topology(resource, device_id)
            )
            for resource in self.kubelet.endpoints
            for device_id in sorted(self.kubelet.healthy(resource))
        ]
        return pr.AllocatableResourcesResponse(devices=devices)


def socket_inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


async def _serve(plugin_dir: Path, pod_resources_dir: Path) -> None:
    kubelet = FakeKubelet(plugin_dir, pod_resources_dir)
    await kubelet.start()
    print(f"kubelet stand-in: Registration on {kubelet.socket}, PodResources on {kubelet.pod_resources_socket}")
    seen: dict[str, tuple[int, int]] = {}
    try:
        while True:
            for name, endpoint in kubelet.endpoints.items():
                state = (len(endpoint.devices), len(kubelet.healthy(name)))
                if seen.get(name) != state:
                    seen[name] = state
                    print(f"{name}: capacity {state[0]}, allocatable {state[1]}", flush=True)
            await asyncio.sleep(0.2)
    finally:
        await kubelet.stop()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Run the kubelet stand-in and print what plugins advertise.")
    parser.add_argument("--dir", type=Path, required=True, help="device-plugins directory to serve kubelet.sock in")
    parser.add_argument("--pod-resources-dir", type=Path, help="default: <dir>/../pod-resources")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.dir, args.pod_resources_dir or args.dir.parent / "pod-resources"))
