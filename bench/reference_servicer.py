"""A do-nothing grpc.aio DevicePlugin server: the floor under the plugin's Allocate figures.

It answers Allocate with the bytes the plugin returns for one core and does nothing else, so
the difference between its latency and the plugin's is the plugin's own work; what remains is
what grpc.aio costs per call on this machine.

    python bench/reference_servicer.py SOCKET
"""

from __future__ import annotations

import asyncio
import signal
import sys

import grpc

from kubelet_api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc


class DoNothing(api_pb2_grpc.DevicePluginServicer):
    async def Allocate(  # the gRPC method name
        self,
        request: api_pb2.AllocateRequest,
        context: grpc.aio.ServicerContext[api_pb2.AllocateRequest, api_pb2.AllocateResponse],
    ) -> api_pb2.AllocateResponse:
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse(
                    envs={"NEURON_RT_VISIBLE_CORES": "3"},
                    devices=[
                        api_pb2.DeviceSpec(container_path="/dev/neuron1", host_path="/dev/neuron1", permissions="rw")
                    ],
                )
                for _ in request.container_requests
            ]
        )


async def serve(socket: str) -> None:
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(DoNothing(), server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(grace=None)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: reference_servicer.py SOCKET")
    asyncio.run(serve(sys.argv[1]))
