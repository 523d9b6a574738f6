from __future__ import annotations

import shutil

from neuron_driver import layout
from neuron_driver.counters import DEVICE_LEVEL, CounterKind, CounterReader
from neuron_driver.errors import IssueKind
from neuron_driver.inventory import scan
from neuron_sim import node as sim


def test_reads_every_kind_on_a_fresh_node(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("trn1.2xlarge")
    reader = CounterReader(scan(root, env={}))
    snap = reader.read()
    assert snap.issues == ()
    assert snap.files_read == reader.file_count
    per_core = len(layout.STATUS_NAMES) * 2 + len(layout.DEVICE_MEM_CATEGORIES) * 3 + 6 + len(layout.OTHER_INFO)
    per_device = len(layout.HARDWARE_COUNTERS) + len(layout.HOST_MEM_CATEGORIES) * 3
    assert len(snap.values) == per_device + 2 * per_core
    assert snap.get(CounterKind.CORE_MEM, 0, 1, "device_mem", "total") == 16 * 2**30
    assert snap.power[0].valid


def test_bumps_and_settings_are_seen(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("trn2.48xlarge")
    reader = CounterReader(scan(root, env={}))
    sim.bump_counter(root, 3, "hw_error", core=5, by=4)
    sim.bump_counter(root, 3, "mem_ecc_uncorrected", by=2)
    sim.set_memory(root, 3, "tensors", 12345, core=5)
    sim.set_memory(root, 3, "dma_buffers", 777)
    sim.set_power(root, 3, 10, 90, 55)
    snap = reader.read()
    assert snap.get(CounterKind.STATUS, 3, 5, "hw_error", "total") == 4
    assert snap.get(CounterKind.STATUS, 3, 5, "hw_error", "present") == 4
    assert snap.get(CounterKind.HARDWARE, 3, DEVICE_LEVEL, "mem_ecc_uncorrected") == 2
    assert snap.get(CounterKind.CORE_DEVICE_MEM, 3, 5, "tensors", "present") == 12345
    assert snap.get(CounterKind.CORE_DEVICE_MEM, 3, 5, "tensors", "peak") == 12345
    assert snap.get(CounterKind.HOST_MEM, 3, DEVICE_LEVEL, "dma_buffers", "present") == 777
    assert (snap.power[3].min_power, snap.power[3].max_power, snap.power[3].avg_power) == (10, 90, 55)


def test_legacy_status_names_map_to_current_ones(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("inf1.xlarge")  # the simulator writes infer_* names on inf1
    assert (layout.core_dir(layout.HostLayout(root).device_dir(0), 0) / "stats/status/infer_failed_to_queue").is_dir()
    sim.bump_counter(root, 0, "execute_failed_to_queue", core=2, by=3)
    snap = CounterReader(scan(root, env={})).read()
    assert snap.get(CounterKind.STATUS, 0, 2, "execute_failed_to_queue", "total") == 3
    assert not any(k.name.startswith("infer_") for k, _ in snap.of_kind(CounterKind.STATUS))


def test_garbage_counter_skips_that_value_only(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("trn1.2xlarge")
    reader = CounterReader(scan(root, env={}))
    before = len(reader.read().values)
    for bad in ("lots\n", "-4\n", "1_000\n", ""):
        sim.set_counter_raw(root, 0, "success", bad, core=1)
        snap = reader.read()
        assert snap.get(CounterKind.STATUS, 0, 1, "success", "total") is None
        assert len(snap.values) == before - 1
        [issue] = snap.issues
        assert issue.kind is IssueKind.MALFORMED
        assert issue.path.endswith("neuron_core1/stats/status/success/total")


def test_garbage_power_is_reported(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("trn1.2xlarge")
    reader = CounterReader(scan(root, env={}))
    sim.write_attr(layout.power_file(layout.HostLayout(root).device_dir(0)), "garbage\n")
    snap = reader.read()
    assert 0 not in snap.power
    assert [i.kind for i in snap.issues] == [IssueKind.MALFORMED]


def test_missing_file_is_reported_and_others_read(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("trn1.2xlarge")
    reader = CounterReader(scan(root, env={}))
    (layout.HostLayout(root).device_dir(0) / "stats/hardware/sram_ecc_uncorrected").unlink()
    snap = reader.read()
    [issue] = snap.issues
    assert issue.kind is IssueKind.MISSING
    assert snap.get(CounterKind.HARDWARE, 0, DEVICE_LEVEL, "mem_ecc_uncorrected") == 0


def test_vanished_device_is_one_issue(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("trn1.32xlarge")
    reader = CounterReader(scan(root, env={}))
    sim.vanish(root, 6)
    snap = reader.read()
    [issue] = snap.issues
    assert issue.kind is IssueKind.VANISHED
    assert not any(k.device == 6 for k in snap.values)
    assert any(k.device == 7 for k in snap.values)
    sim.restore(root, 6)
    assert reader.read().issues == ()


def test_subset_of_kinds_and_statuses(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("trn1.32xlarge")
    reader = CounterReader(
        scan(root, env={}), kinds={CounterKind.HARDWARE, CounterKind.STATUS}, power=False, status_names={"hw_error"}
    )
    snap = reader.read()
    assert {k.kind for k in snap.values} == {CounterKind.HARDWARE, CounterKind.STATUS}
    assert {k.name for k, _ in snap.of_kind(CounterKind.STATUS)} == {"hw_error"}
    assert snap.power == {}
    shutil.rmtree(root)
    assert all(i.kind is IssueKind.VANISHED for i in reader.read().issues)
