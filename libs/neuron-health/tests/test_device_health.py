from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import pytest

from neuron_driver.inventory import InstanceTypeSource, NodeInventory, scan
from neuron_health.device_health import DeviceHealth, Finding, HealthTracker, Verdict, counter_findings
from neuron_health.faults import Severity
from neuron_sim import node as sim


def test_replace_instance_never_recovers_and_keeps_its_reason() -> None:
    t = HealthTracker(quiet_period=1)
    t.observe(Finding(3, "kernel NC_UNCORRECTABLE_ERROR", Severity.REPLACE_INSTANCE), now=0)
    t.observe(Finding(3, "counter y", Severity.UNTIL_REBOOT), now=1)
    t.driver_reloaded([3])  # a reload does not mend the silicon
    v = t.verdict(3, 10_000)
    assert (v.healthy, v.permanent, v.reason) == (False, True, "kernel NC_UNCORRECTABLE_ERROR")


def test_until_reboot_stays_until_the_driver_is_reloaded() -> None:
    t = HealthTracker(quiet_period=1)
    t.observe(Finding(2, "counter mem_ecc_repairable_uncorrected +1", Severity.UNTIL_REBOOT), now=0)
    assert not t.verdict(2, 10_000).healthy  # time alone does not heal it
    t.driver_reloaded([5])  # another device's reload changes nothing here
    assert not t.verdict(2, 10_000).healthy
    t.driver_reloaded([2])
    assert t.verdict(2, 10_000).healthy


def test_worse_fault_takes_over_the_reason() -> None:
    t = HealthTracker(quiet_period=1)
    t.observe(Finding(1, "repairable", Severity.UNTIL_REBOOT), now=0)
    t.observe(Finding(1, "uncorrectable", Severity.REPLACE_INSTANCE), now=1)
    t.driver_reloaded([1])
    assert t.verdict(1, 5).reason == "uncorrectable"


def test_transient_faults_leave_the_device_in_service() -> None:
    t = HealthTracker(quiet_period=10)
    t.observe(Finding(1, "kernel HANG_ON_COLLECTIVES", Severity.TRANSIENT), now=100)
    assert t.verdict(1, 100).healthy


def test_absent_device_stays_unhealthy_until_back_and_quiet() -> None:
    t = HealthTracker(quiet_period=5)
    t.observe_presence({4: False}, now=0)
    assert t.verdict(4, 100).reason == "device vanished from sysfs"
    t.observe_presence({4: True}, now=100)
    assert not t.verdict(4, 104).healthy
    assert t.verdict(4, 105).healthy
    assert t.verdict(2, 105).healthy  # other devices untouched


def test_reload_while_absent_keeps_the_absence() -> None:
    t = HealthTracker(quiet_period=5)
    t.observe(Finding(4, "repairable", Severity.UNTIL_REBOOT), now=0)
    t.observe_presence({4: False}, now=1)
    t.driver_reloaded([4])
    assert t.verdict(4, 100).reason == "device vanished from sysfs"


def test_counter_findings_first_read_and_growth() -> None:
    first = {(0, "mem_ecc_uncorrected"): 0, (1, "sram_ecc_uncorrected"): 2, (2, "unrelated"): 9}
    findings = counter_findings(None, first)
    assert [(f.device, f.severity) for f in findings] == [(1, Severity.REPLACE_INSTANCE)]  # non-zero since boot
    second = dict(first) | {(0, "mem_ecc_uncorrected"): 1, (2, "unrelated"): 10}
    [f] = counter_findings(first, second)
    assert (f.device, f.reason) == (0, "counter mem_ecc_uncorrected +1 (HBM_UNCORRECTABLE_ERROR)")
    [f] = counter_findings({(5, "hw_dma_abort_error"): 0}, {(5, "hw_dma_abort_error"): 2})
    assert (f.device, f.severity) == (5, Severity.REPLACE_INSTANCE)
    # a transient fault's counter is no finding: the device stays in service
    assert counter_findings({(5, "hw_collectives_error"): 0}, {(5, "hw_collectives_error"): 3}) == []


# --- DeviceHealth: the verdicts a service advertises -------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> NodeInventory:
    root = tmp_path_factory.mktemp("inf2")
    sim.create(root, "inf2.24xlarge")  # 6 devices, the instance type read from DMI
    return scan(root, env={})


def without(inventory: NodeInventory, *gone: int, source: InstanceTypeSource | None = None) -> NodeInventory:
    """`inventory` as a rescan sees it once the devices `gone` vanished from sysfs."""
    return dataclasses.replace(
        inventory,
        devices=tuple(d for d in inventory.devices if d.index not in gone),
        instance_type_source=source or inventory.instance_type_source,
    )


def fires(health: DeviceHealth, change: Callable[[], object]) -> bool:
    """Whether `change` sets the `changed` event a watcher took beforehand."""
    event = health.changed
    change()
    return event.is_set()


def test_an_idle_node_is_healthy_and_quiet(node: NodeInventory) -> None:
    health = DeviceHealth(node, quiet_period=5, clock=Clock())
    assert health.known == set(range(6))
    assert health.unhealthy() == {}
    assert not fires(health, health.refresh_health)
    assert health.verdict(99).healthy  # a device never seen has no verdict against it


def test_a_new_inventory_fires_changed_even_when_no_verdict_changes(node: NodeInventory) -> None:
    calls: list[None] = []
    health = DeviceHealth(node, quiet_period=5, clock=Clock(), on_change=lambda: calls.append(None))
    calls.clear()
    assert fires(health, lambda: health.set_inventory(node))
    assert len(calls) == 1


def test_a_vanished_device_stays_known_until_back_for_the_quiet_period(node: NodeInventory) -> None:
    clock = Clock()
    health = DeviceHealth(node, quiet_period=5, clock=clock)
    health.set_inventory(without(node, 4))
    assert health.known == set(range(6))
    assert health.unhealthy() == {4: "device vanished from sysfs"}
    clock.now += 60  # time alone does not bring back a device that is gone
    assert not health.refresh_health()
    health.set_inventory(node)
    clock.now += 4.9
    assert not health.refresh_health()
    assert not health.verdict(4).healthy
    clock.now += 0.1
    assert fires(health, health.refresh_health)
    assert health.unhealthy() == {}


def test_a_vanished_device_the_instance_does_not_promise_can_be_forgotten(node: NodeInventory) -> None:
    guessed = dataclasses.replace(node, instance_type_source=InstanceTypeSource.GUESSED)
    health = DeviceHealth(guessed, quiet_period=5, clock=Clock())
    health.set_inventory(without(guessed, 5))
    assert 5 in health.known  # kept, and reported
    health.set_inventory(without(guessed, 5), forget_vanished=True)
    assert health.known == set(range(5))
    assert health.unhealthy() == {}
    # a device the instance type (read from DMI) promises is never forgotten
    health = DeviceHealth(node, quiet_period=5, clock=Clock())
    health.set_inventory(without(node, 5), forget_vanished=True)
    assert health.unhealthy() == {5: "device vanished from sysfs"}


def test_external_verdicts_take_a_device_out_until_withdrawn(node: NodeInventory) -> None:
    health = DeviceHealth(node, quiet_period=5, clock=Clock())
    assert fires(health, lambda: health.set_external_verdicts({2: "NeuronHasError_DMA_ERROR"}))
    assert health.unhealthy() == {2: "problem detector: NeuronHasError_DMA_ERROR"}
    assert not fires(health, lambda: health.set_external_verdicts({2: "NeuronHasError_DMA_ERROR"}))
    assert fires(health, lambda: health.set_external_verdicts({}))
    assert health.unhealthy() == {}


def test_the_trackers_own_reason_wins_over_the_detectors(node: NodeInventory) -> None:
    health = DeviceHealth(node, quiet_period=5, clock=Clock())
    health.observe([Finding(1, "kernel NC_UNCORRECTABLE_ERROR", Severity.REPLACE_INSTANCE)])
    health.set_external_verdicts({1: "NeuronHasError_DMA_ERROR"})
    assert health.verdict(1) == Verdict(False, "kernel NC_UNCORRECTABLE_ERROR", True)


def test_a_driver_reload_mends_until_reboot_faults_only(node: NodeInventory) -> None:
    clock = Clock()
    health = DeviceHealth(node, quiet_period=5, clock=clock)
    health.observe([Finding(2, "counter mem_ecc_repairable_uncorrected +1", Severity.UNTIL_REBOOT)])
    health.observe([Finding(3, "counter sram_ecc_uncorrected +1", Severity.REPLACE_INSTANCE)])
    clock.now += 60
    assert set(health.unhealthy()) == {2, 3}
    assert fires(health, lambda: health.driver_reloaded([2, 3]))
    assert set(health.unhealthy()) == {3}


def test_a_transient_fault_leaves_the_device_in_service(node: NodeInventory) -> None:
    health = DeviceHealth(node, quiet_period=5, clock=Clock())
    assert not fires(health, lambda: health.observe([Finding(1, "kernel HANG", Severity.TRANSIENT)]))
    assert health.unhealthy() == {}


def test_each_transition_is_logged_and_passed_on_once(node: NodeInventory, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    seen: list[tuple[int, bool]] = []
    logger = logging.getLogger("some.service")
    health = DeviceHealth(
        node, quiet_period=5, clock=clock, logger=logger, on_transition=lambda d, v: seen.append((d, v.healthy))
    )
    finding = Finding(0, "counter mem_ecc_repairable_uncorrected +1", Severity.UNTIL_REBOOT)
    with caplog.at_level(logging.INFO, logger="some.service"):
        health.observe([finding])
        health.observe([finding])  # the same fault again: still unhealthy, no new transition
        health.refresh_health()
        health.driver_reloaded([0])
        health.refresh_health()
    assert seen == [(0, False), (0, True)]
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("some.service", f"device 0 is now unhealthy: {finding.reason}"),
        ("some.service", "device 0 is now healthy"),
    ]


@pytest.mark.parametrize("warn", [False, True])
def test_findings_about_unknown_devices_are_dropped_and_warned_of_on_request(
    node: NodeInventory, caplog: pytest.LogCaptureFixture, warn: bool
) -> None:
    health = DeviceHealth(node, quiet_period=5, clock=Clock(), warn_unknown_devices=warn)
    with caplog.at_level(logging.INFO, logger="neuron_health.device_health"):
        changed = fires(health, lambda: health.observe([Finding(42, "counter x +1", Severity.REPLACE_INSTANCE)]))
    assert not changed
    assert 42 not in health.known
    assert health.verdict(42).healthy
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == (["error reported for unknown device 42: counter x +1"] if warn else [])


def test_the_detectors_verdict_carries_its_fault_when_the_reason_names_one() -> None:
    from neuron_health import faults
    from neuron_health.device_health import HealthTracker, merged_verdicts

    fault = faults.BY_KIND["NC_UNCORRECTABLE_ERROR"]
    verdicts = merged_verdicts(HealthTracker(1.0), [0, 1], {0: fault.reason, 1: "SomethingElse"}, now=0.0)
    assert (verdicts[0].fault, verdicts[0].severity, verdicts[0].external) == (fault.kind, fault.severity, True)
    assert (verdicts[1].fault, verdicts[1].severity, verdicts[1].external) == ("", None, True)
    assert not verdicts[0].healthy
