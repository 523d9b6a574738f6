"""The kubelet's side of a DRA kubelet plugin, and a claim allocated as kube-scheduler allocates it.

STAND-IN, NOT THE REAL KUBELET NOR THE REAL SCHEDULER: used where none runs (the DRA driver's tests and
the dashboard test that scrapes a real driver process). The kubelet's side registers through the
plugin's registration socket (GetInfo, then NotifyRegistrationStatus) and calls NodePrepareResources /
NodeUnprepareResources on the endpoint the plugin names, with the compiled `k8s.io/kubelet` stubs; the
claim is created in a real kube-apiserver and its status written with the allocation the scheduler
would write. The real kubelet and scheduler are exercised by the cluster tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpc import aio

from kubelet_api.dra.v1 import api_pb2 as dra
from kubelet_api.dra.v1 import api_pb2_grpc as dra_grpc
from kubelet_api.pluginregistration.v1 import api_pb2 as reg
from kubelet_api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from neuron_common.kube import Api
from neuron_driver import layout


@dataclass
class Kubelet:
    """The kubelet's side: registration through the registry socket, then DRA calls on the endpoint."""

    registry: Path
    channel: aio.Channel | None = None
    endpoint: str = ""

    async def register(self, socket_name: str = "") -> reg.PluginInfo:
        """Through the driver's registration socket: the fixed name, or `socket_name` (one instance's)."""
        socket = self.registry / (socket_name or Path(layout.DRA_REGISTRATION_SOCKET).name)
        async with aio.insecure_channel(f"unix://{socket}") as ch:
            stub = reg_grpc.RegistrationStub(ch)
            info = await stub.GetInfo(reg.InfoRequest(), timeout=1)
            self.endpoint = info.endpoint
            self.channel = aio.insecure_channel(f"unix://{info.endpoint}")
            await stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=5)
        return info

    @property
    def dra(self) -> dra_grpc.DRAPluginStub:
        assert self.channel is not None, "register first"
        return dra_grpc.DRAPluginStub(self.channel)

    async def prepare(self, *claims: tuple[str, str, str]) -> dra.NodePrepareResourcesResponse:
        request = dra.NodePrepareResourcesRequest(
            claims=[dra.Claim(uid=u, namespace=ns, name=n) for u, ns, n in claims]
        )
        response: dra.NodePrepareResourcesResponse = await self.dra.NodePrepareResources(request, timeout=45)
        return response

    async def unprepare(self, *claims: tuple[str, str, str]) -> dra.NodeUnprepareResourcesResponse:
        request = dra.NodeUnprepareResourcesRequest(
            claims=[dra.Claim(uid=u, namespace=ns, name=n) for u, ns, n in claims]
        )
        response: dra.NodeUnprepareResourcesResponse = await self.dra.NodeUnprepareResources(request, timeout=45)
        return response

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()


async def allocated_claim(
    api: Api,
    node: str,
    devices: list[str],
    *,
    name: str,
    namespace: str = "default",
    request: str = "neuron",
    tolerations: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A ResourceClaim allocated as the scheduler would: created, then its status written."""
    base = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    claim = await api.create(
        base,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": request, "exactly": {"deviceClassName": "neuron.aws.com", "count": len(devices)}}
                    ]
                }
            },
        },
    )
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": request,
                        "driver": "neuron.aws.com",
                        "pool": node,
                        "device": d,
                        **({"tolerations": tolerations} if tolerations else {}),
                    }
                    for d in devices
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
            },
        }
    }
    return await api.update(f"{base}/{name}/status", claim)
