from __future__ import annotations

from neuron_device_plugin.health import (
    Finding,
    HealthTracker,
    Severity,
    counter_findings,
    hw_error_severity,
)
from neuron_sysfs.counters import DEVICE_LEVEL, CounterKey, CounterKind
from neuron_sysfs.kmsg import parse_hw_error


def hw(device: int, name: str) -> CounterKey:
    return CounterKey(CounterKind.HARDWARE, device, DEVICE_LEVEL, name, "")


def test_transient_recovers_only_after_a_quiet_period() -> None:
    t = HealthTracker(quiet_period=10)
    t.observe(Finding(1, "counter x", Severity.TRANSIENT), now=100)
    assert not t.verdict(1, 105).healthy
    t.observe(Finding(1, "counter x", Severity.TRANSIENT), now=108)  # a new error restarts the clock
    assert not t.verdict(1, 117).healthy
    assert t.next_change(117) == 118
    assert t.verdict(1, 118).healthy
    assert t.verdict(2, 118).healthy  # other devices untouched


def test_permanent_never_recovers_and_keeps_its_reason() -> None:
    t = HealthTracker(quiet_period=1)
    t.observe(Finding(3, "kernel NC_UNCORRECTABLE_ERROR", Severity.PERMANENT), now=0)
    t.observe(Finding(3, "counter y", Severity.TRANSIENT), now=1)
    v = t.verdict(3, 10_000)
    assert (v.healthy, v.permanent, v.reason) == (False, True, "kernel NC_UNCORRECTABLE_ERROR")
    assert t.next_change(10_000) is None


def test_absent_device_stays_unhealthy_until_back_and_quiet() -> None:
    t = HealthTracker(quiet_period=5)
    t.observe_presence({4: False}, now=0)
    assert t.verdict(4, 100).reason == "device vanished from sysfs"
    t.observe_presence({4: True}, now=100)
    assert not t.verdict(4, 104).healthy
    assert t.verdict(4, 105).healthy


def test_counter_findings_first_read_and_growth() -> None:
    first = {hw(0, "mem_ecc_uncorrected"): 0, hw(1, "sram_ecc_uncorrected"): 2, hw(2, "unrelated"): 9}
    findings = counter_findings(None, first)
    assert [(f.device, f.severity) for f in findings] == [(1, Severity.PERMANENT)]  # non-zero since boot
    second = dict(first) | {hw(0, "mem_ecc_uncorrected"): 1, hw(2, "unrelated"): 10}
    [f] = counter_findings(first, second)
    assert (f.device, f.reason) == (0, "counter mem_ecc_uncorrected +1")
    status = CounterKey(CounterKind.STATUS, 5, 3, "hw_dma_abort_error", "total")
    [f] = counter_findings({status: 0}, {status: 2})
    assert (f.device, f.severity, f.reason) == (5, Severity.TRANSIENT, "counter hw_dma_abort_error core 3 +2")
    present_field = CounterKey(CounterKind.STATUS, 5, 3, "hw_dma_abort_error", "present")
    assert counter_findings({present_field: 0}, {present_field: 5}) == []


def test_hw_error_severity_by_kind_then_action() -> None:
    def sev(line: str) -> Severity:
        err = parse_hw_error(line)
        assert err is not None
        return hw_error_severity(err)

    assert sev("NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=0") is Severity.PERMANENT
    assert sev("NEURON_HW_ERR=HBM_REPAIRABLE_UNCORRECTABLE_ERROR nd-id=0") is Severity.TRANSIENT
    assert sev("NEURON_HW_ERR=NEW_KIND nd-id=0 action=TERMINATE_INSTANCE") is Severity.PERMANENT
    assert sev("NEURON_HW_ERR=NEW_KIND nd-id=0 action=RESET") is Severity.TRANSIENT
