"""The firmware's verdict (driver 2.30.2) through the one pipeline, and the layout check's hold on the
fault table: every counter the table expects is a path the check looks for."""

from __future__ import annotations

from pathlib import Path

from neuron_driver import driver_layout, layout
from neuron_driver.inventory import scan
from neuron_health import faults
from neuron_health.device_health import DeviceHealth, counter_findings, multi_node_unfit
from neuron_health.faults import Rung, Severity
from neuron_health.pipeline import CounterWatch
from neuron_sim import node as sim


def test_every_fault_table_counter_is_one_the_layout_check_looks_for() -> None:
    newest = driver_layout.GEN_2_30_2.device_paths("trn2")
    checked = {p.rsplit("/", 1)[-1] for p in newest} | set(driver_layout.HW_ERROR_STATUS_NAMES)
    for fault in faults.FAULTS:
        for counter in fault.device_counters:
            if counter == layout.HEARTBEAT_STALE_COUNTER:
                assert layout.HEARTBEAT_FILE in checked
            elif layout.is_firmware_counter(counter):
                assert layout.UNHEALTHY_COMPONENTS_FILE in checked
            else:
                assert counter in checked, (fault.kind, counter)
        for counter in fault.core_counters:
            assert counter in driver_layout.HW_ERROR_STATUS_NAMES, (fault.kind, counter)


def test_every_subsystem_the_firmware_names_is_a_fault_with_a_rung_that_follows_its_severity() -> None:
    for component in layout.UNHEALTHY_COMPONENTS:
        fault = faults.BY_COUNTER[layout.firmware_counter(component)]
        assert (
            fault.rung
            is {
                Severity.REPLACE_INSTANCE: Rung.REPLACE,
                Severity.UNTIL_REBOOT: Rung.REBOOT,
                Severity.MULTI_NODE_UNFIT: Rung.EVENT,
            }[fault.severity]
        ), fault.kind
        # the links to other nodes keep the device for work on this node
        link = component in ("link_efa", "link_intraserver", "link_interserver", "link_switch")
        assert fault.severity.unfit_for_multi_node is link
        assert fault.takes_device_out is not link
    assert faults.BY_COUNTER[layout.HEARTBEAT_STALE_COUNTER].takes_device_out


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_listed_subsystem_is_a_finding_and_a_mended_one_no_reload(tmp_path: Path) -> None:
    sim.create(tmp_path, "trn2.48xlarge", driver_version="2.30.2.0")
    watch = CounterWatch(tmp_path, 1.0, (), inventory=scan(tmp_path, env={}))
    first = watch.read()
    assert counter_findings(first.previous, first.totals) == []
    sim.set_unhealthy_components(tmp_path, 4, ["hbm", "link_efa"])
    read = watch.read()
    [finding] = counter_findings(read.previous, read.totals)  # link_efa keeps the device in service
    assert (finding.device, finding.fault, finding.severity) == (4, "UNHEALTHY_HBM", Severity.REPLACE_INSTANCE)
    assert read.totals[4, layout.firmware_counter("link_efa")] == 1
    sim.set_unhealthy_components(tmp_path, 4, [])
    mended = watch.read()
    assert mended.reloaded == frozenset()  # a subsystem no longer listed is not a driver reload
    assert mended.totals[4, layout.firmware_counter("hbm")] == 0


def test_a_heartbeat_that_moved_and_stopped_is_stale(tmp_path: Path) -> None:
    sim.create(tmp_path, "trn2.3xlarge", driver_version="2.30.2.0")
    clock = Clock()
    watch = CounterWatch(tmp_path, 1.0, (), inventory=scan(tmp_path, env={}), heartbeat_stale_after=60, clock=clock)
    watch.read()
    clock.now += 3600  # never seen moving: not judged, however long
    assert watch.read().totals[0, layout.HEARTBEAT_STALE_COUNTER] == 0
    sim.beat_heartbeat(tmp_path, 0)
    assert watch.read().totals[0, layout.HEARTBEAT_STALE_COUNTER] == 0
    clock.now += 59
    assert watch.read().totals[0, layout.HEARTBEAT_STALE_COUNTER] == 0
    clock.now += 1
    read = watch.read()
    assert read.totals[0, layout.HEARTBEAT_STALE_COUNTER] == 1
    [finding] = counter_findings(read.previous, read.totals)
    assert finding.fault == "HEALTHCHECK_HEARTBEAT_STALE"
    sim.beat_heartbeat(tmp_path, 0)  # it moves again: fresh
    assert watch.read().totals[0, layout.HEARTBEAT_STALE_COUNTER] == 0


def test_a_node_without_the_verdict_reads_no_firmware_counters(tmp_path: Path) -> None:
    sim.create(tmp_path, "trn1.2xlarge", driver_version="2.30.2.0")  # the verdict is TRN2 and TRN3 only
    totals = CounterWatch(tmp_path, 1.0, (), inventory=scan(tmp_path, env={})).read().totals
    assert not [name for _, name in totals if layout.is_firmware_counter(name)]


def test_a_link_fault_marks_the_device_unfit_for_multi_node_work_while_it_is_listed(tmp_path: Path) -> None:
    sim.create(tmp_path, "trn2.48xlarge", driver_version="2.30.2.0")
    inventory = scan(tmp_path, env={})
    health = DeviceHealth(inventory, 1.0, lambda: 0.0)
    watch = CounterWatch(tmp_path, 1.0, (), inventory=inventory)
    sim.set_unhealthy_components(tmp_path, 6, ["link_efa", "link_switch"])
    changed = health.changed
    health.set_multi_node_unfit(multi_node_unfit(watch.read().totals))
    assert health.multi_node_unfit == {6: ("UNHEALTHY_LINK_EFA", "UNHEALTHY_LINK_SWITCH")}
    assert changed.is_set()  # what publishes it (the DRA driver's slices) publishes again
    assert health.verdict(6).healthy  # in service for work on this node
    sim.set_unhealthy_components(tmp_path, 6, [])
    health.set_multi_node_unfit(multi_node_unfit(watch.read().totals))
    assert health.multi_node_unfit == {}
