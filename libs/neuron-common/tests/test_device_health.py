from __future__ import annotations

from neuron_common.device_health import Finding, HealthTracker, counter_findings
from neuron_sysfs.faults import Severity


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
