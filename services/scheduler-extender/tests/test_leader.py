"""Leader election on a Lease (over the fake API server's resourceVersion checks), with a fake clock."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt

from fake_api import FakeApi
from polling import until_async

from neuron_common.kube import ApiError
from neuron_common.leader import LeaderElector, Lease, micro_time

LEASE = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/neuron-scheduler-extender"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(api: FakeApi, identity: str, clock: Clock) -> LeaderElector:
    return LeaderElector(
        api,
        Lease("ns", "neuron-scheduler-extender", identity, duration=15, renew_deadline=10, retry_period=2),
        url=f"http://{identity}:9843",
        clock=clock,
        wall_clock=lambda: dt.datetime(2026, 3, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=clock.now),
    )


async def step(*electors: LeaderElector) -> list[bool]:
    """One round of attempts, as each elector's loop makes every retry period."""
    results = []
    for e in electors:
        acquired = await e.try_acquire_or_renew()
        if acquired:
            e._renewed_at = e.clock()
            e._set_leading(True, "test")
        results.append(e.leading)
    return results


async def test_the_first_takes_a_missing_lease_and_the_second_waits() -> None:
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert await step(a, b) == [True, False]
    spec = api.leases[LEASE]["spec"]
    assert spec["holderIdentity"] == "a"
    assert spec["leaseDurationSeconds"] == 15
    assert spec["renewTime"] == micro_time(dt.datetime(2026, 3, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=1000))
    for _ in range(20):  # a keeps renewing: b never takes over
        clock.now += 2
        assert await step(a, b) == [True, False]


async def test_the_standby_takes_over_once_the_lease_expires_by_its_own_clock() -> None:
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    await step(a, b)
    # a stops renewing (crashed). b saw the record last change at t=1000.
    clock.now += 14
    assert await step(b) == [False]
    clock.now += 1
    assert await step(b) == [True]
    lease = api.leases[LEASE]["spec"]
    assert (lease["holderIdentity"], lease["leaseTransitions"]) == ("b", 1)


async def test_a_leader_cut_off_steps_down_before_anyone_can_take_over() -> None:
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    await step(a, b)
    api.fail_next(1000)
    for _ in range(4):  # 8 s without a renewal: still the leader
        clock.now += 2
        with contextlib.suppress(ApiError):
            await a.try_acquire_or_renew()
        assert a.leading
    clock.now += 2  # 10 s: the renew deadline
    assert not a.leading
    api.failures = 0
    # b only sees the lease expire 15 s after it last saw it change: never two leaders at once
    assert await step(b) == [False]
    clock.now += 5
    assert await step(b) == [True]
    assert not a.leading
    assert await step(a) == [False]


async def test_of_two_racing_for_the_lease_one_wins() -> None:
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    # both read "no lease" before either creates it: the second create is refused
    assert await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew()) == [True, False]
    # both read the released lease before either writes: the second write carries a stale resourceVersion
    assert await step(a) == [True]
    await a.release()
    c = elector(api, "c", clock)
    assert await asyncio.gather(b.try_acquire_or_renew(), c.try_acquire_or_renew()) == [True, False]
    assert api.leases[LEASE]["spec"]["holderIdentity"] == "b"


async def test_release_on_shutdown_hands_over_at_once() -> None:
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    await step(a, b)
    await a.release()
    assert api.leases[LEASE]["spec"]["holderIdentity"] == ""
    assert not a.leading
    assert await step(b) == [True]


async def test_run_acquires_and_releases() -> None:
    api = FakeApi()
    e = LeaderElector(api, Lease("ns", "neuron-scheduler-extender", "solo", retry_period=0.01))
    changes: list[bool] = []
    e.on_change = changes.append
    stop = asyncio.Event()
    task = asyncio.create_task(e.run(stop))
    await until_async(lambda: e.leading, "leading", 5.0, 0.01)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert changes == [True, False]
    assert api.leases[LEASE]["spec"]["holderIdentity"] == ""


async def test_the_standby_knows_where_the_leader_serves_while_its_lease_lasts() -> None:
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert b.leader_url == ""
    await step(a, b)
    assert api.leases[LEASE]["metadata"]["annotations"] == {"neuron.aws.com/leader-url": "http://a:9843"}
    assert (a.leader_url, b.leader_url) == ("http://a:9843", "http://a:9843")
    clock.now += 15  # a has not renewed for a whole lease: b no longer trusts the address
    assert b.leader_url == ""
    assert await step(b) == [True]
    assert b.leader_url == "http://b:9843"
    assert api.leases[LEASE]["metadata"]["annotations"] == {"neuron.aws.com/leader-url": "http://b:9843"}
    await b.release()
    assert b.leader_url == ""
    assert await step(a) == [True]  # released, not waited out: taken at once
    assert a.leader_url == "http://a:9843"
