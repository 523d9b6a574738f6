"""The slice publisher's pass against an API server that answers as the real one does."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import sim_nodes
from neuron_dra_driver import slices
from neuron_dra_driver.metrics import DriverMetrics
from neuron_dra_driver.publisher import SLICES, SlicePublisher

from neuron_common.kube import ApiError


class Slices:
    """The resourceslices collection: apply stores, delete answers `delete_status` when set."""

    def __init__(self, leftovers: list[dict[str, Any]], delete_status: int | None = None) -> None:
        self.stored = {s["metadata"]["name"]: s for s in leftovers}
        self.delete_status = delete_status
        self.deleted: list[str] = []

    async def request(self, method: str, path: str, *, params: Any = None) -> dict[str, Any]:
        assert (method, path) == ("GET", SLICES)
        return {"items": [copy.deepcopy(s) for s in self.stored.values()]}

    async def apply(self, path: str, body: Any, field_manager: str) -> dict[str, Any]:
        self.stored[path.rsplit("/", 1)[1]] = copy.deepcopy(body)
        return copy.deepcopy(body)

    async def delete(self, path: str) -> dict[str, Any]:
        name = path.rsplit("/", 1)[1]
        if self.delete_status is not None:
            raise ApiError(self.delete_status, f"resourceslices {name}")
        self.deleted.append(name)
        del self.stored[name]
        return {}


def leftover() -> dict[str, Any]:
    """A slice of this node from an earlier run, under a name the current layout does not use."""
    model = slices.NodeDevices("node-a", sim_nodes.inventory("trn1.2xlarge", None))
    (obj,) = slices.build(model, 1)[:1]
    obj = copy.deepcopy(obj)
    obj["metadata"]["name"] = "node-a-neuron.amazonaws.com-old"
    return obj


def publisher(api: Slices, metrics: DriverMetrics) -> SlicePublisher:
    inv = sim_nodes.inventory("trn1.2xlarge", None)
    return SlicePublisher(api, "node-a", lambda: slices.NodeDevices("node-a", inv), metrics, resync=60)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_leftover_slice_is_deleted() -> None:
    api = Slices([leftover()])
    p = publisher(api, DriverMetrics())
    assert await p.sync()
    assert api.deleted == ["node-a-neuron.amazonaws.com-old"]
    assert p.synced


@pytest.mark.asyncio
async def test_a_leftover_slice_already_gone_is_not_a_failed_pass() -> None:
    api = Slices([leftover()], delete_status=404)
    metrics = DriverMetrics()
    p = publisher(api, metrics)
    assert await p.sync()
    assert p.synced
    assert metrics.slice_updates._value.get() == 1


@pytest.mark.asyncio
async def test_any_other_refusal_of_a_delete_fails_the_pass() -> None:
    api = Slices([leftover()], delete_status=403)
    p = publisher(api, DriverMetrics())
    with pytest.raises(ApiError):
        await p.sync()
    assert not p.synced


class WithoutConsumableCapacity(Slices):
    """An API server with DRAConsumableCapacity off: it stores a device without what the gate adds."""

    async def apply(self, path: str, body: Any, field_manager: str) -> dict[str, Any]:
        body = copy.deepcopy(body)
        for d in body["spec"].get("devices") or []:
            d.pop("allowMultipleAllocations", None)
            for capacity in (d.get("capacity") or {}).values():
                capacity.pop("requestPolicy", None)
        return await super().apply(path, body, field_manager)


@pytest.mark.asyncio
async def test_where_shareable_devices_are_dropped_cores_are_published_as_devices_instead() -> None:
    inv = sim_nodes.inventory("trn1.2xlarge", None)
    api = WithoutConsumableCapacity([])
    metrics = DriverMetrics()
    p = SlicePublisher(
        api,  # type: ignore[arg-type]
        "node-a",
        lambda: slices.NodeDevices("node-a", inv, cores_as_capacity=True),
        metrics,
        resync=60,
    )
    assert await p.sync()
    assert p.shares_dropped
    assert not p.counters_dropped
    assert metrics.shares_kept._value.get() == 0
    stored = list(api.stored.values())
    # what the API server keeps: the devices with counters, each core a device of its own
    assert slices.counted(stored)
    assert not slices.shareable(stored)
    names = {d["name"] for s in stored for d in s["spec"].get("devices") or []}
    assert {f"neuroncore{c.index}" for c in inv.cores} <= names
    assert not await p.sync()  # and that is stable: nothing to write again
