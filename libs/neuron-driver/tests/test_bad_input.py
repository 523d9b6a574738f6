"""Bad sysfs input never crashes a scan: one typed issue, an explicit unknown, the rest loads."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from neuron_driver import inventory as inventory_mod
from neuron_driver import layout
from neuron_driver.attrs import IssueLog
from neuron_driver.errors import IssueKind, ScanIssue
from neuron_driver.inventory import InstanceTypeSource, TopologySource, scan
from neuron_driver.lnc import LncSource
from neuron_sim import node as sim


def issues_of(inv: inventory_mod.NodeInventory, kind: IssueKind) -> list[ScanIssue]:
    return [i for i in inv.issues if i.kind is kind]


def test_malformed_core_count_falls_back_to_table(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("trn1.32xlarge")
    (layout.HostLayout(root).device_dir(3) / "core_count").write_text("two")
    inv = scan(root, env={})
    assert len(inv.devices) == 16
    assert inv.device(3).physical_cores == 2  # type: ignore[union-attr]
    [issue] = issues_of(inv, IssueKind.MALFORMED)
    assert issue.path.endswith("neuron3/core_count")
    assert "'two'" in issue.message


def test_missing_attributes_become_unknown(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("inf2.24xlarge")
    d = layout.HostLayout(root).device_dir(2)
    (d / "info" / "serial_number").unlink()
    (d / "info" / "architecture" / "device_name").unlink()
    inv = scan(root, env={})
    dev = inv.device(2)
    assert dev is not None
    assert (dev.serial, dev.device_name, dev.arch_type) == (None, None, "NDv3")
    assert len(issues_of(inv, IssueKind.MISSING)) == 2
    assert len(inv.devices) == 6


def test_unreadable_attribute_is_reported(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("trn1.2xlarge")
    target = layout.HostLayout(root).device_dir(0) / "info" / "architecture" / "arch_type"
    target.unlink()
    target.mkdir()  # reading a directory fails with EISDIR, as an unreadable attribute would
    inv = scan(root, env={})
    [issue] = issues_of(inv, IssueKind.UNREADABLE)
    assert issue.path == str(target)
    assert inv.device(0).arch_type is None  # type: ignore[union-attr]


def test_binary_garbage_is_malformed(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("trn1.2xlarge")
    (layout.HostLayout(root).device_dir(0) / "info" / "architecture" / "device_name").write_bytes(b"\xff\xfe\x00")
    inv = scan(root, env={})
    assert issues_of(inv, IssueKind.MALFORMED)
    assert inv.device(0).device_name is None  # type: ignore[union-attr]


def test_garbage_connected_devices_falls_back_to_table(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("trn1.32xlarge")
    (layout.HostLayout(root).device_dir(5) / "connected_devices").write_text("1, banana\n")
    inv = scan(root, env={})
    assert inv.topology_source is TopologySource.MIXED
    assert inv.adjacency[5] == (1, 4, 6, 9)
    assert inv.device(5).connected is None  # type: ignore[union-attr]


def test_connected_devices_wins_over_table_and_mismatch_is_logged(make_node, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    root = make_node("inf2.24xlarge")
    (layout.HostLayout(root).device_dir(0) / "connected_devices").write_text("1\n")
    with caplog.at_level(logging.WARNING, logger="neuron_driver"):
        inv = scan(root, env={})
    assert inv.adjacency[0] == (1,)
    [issue] = issues_of(inv, IssueKind.MISMATCH)
    assert "driver lists [1]" in issue.message
    assert any("connected_devices" in r.getMessage() for r in caplog.records)


def test_device_listed_but_gone_is_vanished(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("inf1.6xlarge")
    shutil.rmtree(layout.HostLayout(root).device_dir(2))  # the class symlink still lists it
    inv = scan(root, env={})
    assert [d.index for d in inv.devices] == [0, 1, 3]
    [issue] = issues_of(inv, IssueKind.VANISHED)
    assert issue.path.endswith("neuron2")
    # core indices stay anchored on device index: neuron3 keeps cores 12-15
    assert inv.device(3).logical_cores == (12, 13, 14, 15)  # type: ignore[union-attr]


def test_device_vanishing_mid_scan(make_node, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    root = make_node("trn1.32xlarge")
    real = inventory_mod.read_text
    victim = layout.HostLayout(root).device_dir(7)

    def read_then_vanish(path: Path) -> str:
        if victim in path.parents and victim.exists():
            shutil.rmtree(victim)
        return real(path)

    monkeypatch.setattr(inventory_mod, "read_text", read_then_vanish)
    inv = scan(root, env={})
    assert len(inv.devices) == 15
    assert inv.device(7) is None
    assert [i.path for i in issues_of(inv, IssueKind.VANISHED)] == [str(victim)]


def test_no_driver_at_all(tmp_path: Path) -> None:
    inv = scan(tmp_path, env={})
    assert inv.devices == ()
    assert inv.topology_source is TopologySource.NONE
    [issue] = issues_of(inv, IssueKind.MISSING)
    assert "driver loaded" in issue.message


def test_without_dmi_the_type_is_guessed(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("trn1.32xlarge")
    layout.HostLayout(root).dmi_product_name.unlink()
    inv = scan(root, env={})
    assert inv.instance_type_name == "trn1.32xlarge"
    assert inv.instance_type_source is InstanceTypeSource.GUESSED


def test_unknown_dmi_name_is_a_mismatch_and_guessed(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("inf2.48xlarge")
    layout.HostLayout(root).dmi_product_name.write_text("m5.large\n")
    inv = scan(root, env={})
    assert inv.instance_type_name == "inf2.48xlarge"
    assert issues_of(inv, IssueKind.MISMATCH)


def test_class_attributes_are_not_devices(make_node) -> None:  # type: ignore[no-untyped-def]
    root = make_node("trn2.48xlarge")
    (layout.HostLayout(root).class_dir / "ultraserver_mode").write_text("0\n")
    (layout.HostLayout(root).class_dir / "node_id_4").write_text("1\n")
    assert len(scan(root, env={}).devices) == 16


class TestLogicalCoreSetting:
    def test_env_wins_over_file(self, make_node) -> None:  # type: ignore[no-untyped-def]
        root = make_node("trn2.48xlarge", lnc=2)
        inv = scan(root, env={"NEURON_LOGICAL_NC_CONFIG": "1"})
        assert (inv.lnc.value, inv.lnc.source) == (1, LncSource.ENV)
        assert len(inv.cores) == 128

    def test_garbage_file_falls_back_to_default(self, make_node) -> None:  # type: ignore[no-untyped-def]
        root = make_node("trn2.48xlarge", lnc=1)
        layout.HostLayout(root).lnc_config.write_text("lots\n")
        inv = scan(root, env={})
        assert (inv.lnc.value, inv.lnc.source) == (2, LncSource.DEFAULT)
        [issue] = issues_of(inv, IssueKind.INVALID_CONFIG)
        assert "must be 1 or 2" in issue.message

    def test_unsupported_on_family_is_refused(self, make_node) -> None:  # type: ignore[no-untyped-def]
        root = make_node("trn1.32xlarge")
        inv = scan(root, env={"NEURON_LOGICAL_NC_CONFIG": "2"})
        assert inv.lnc.value == 1
        assert len(inv.cores) == 32
        [issue] = issues_of(inv, IssueKind.INVALID_CONFIG)
        assert "not supported on trn1" in issue.message

    def test_lnc2_pairs_physical_cores(self, make_node) -> None:  # type: ignore[no-untyped-def]
        inv = scan(make_node("trn2.3xlarge", lnc=2), env={})
        assert [c.physical for c in inv.cores] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_each_issue_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    log = IssueLog(limit=2)
    issue = ScanIssue(IssueKind.MALFORMED, "/x", "bad")
    with caplog.at_level(logging.WARNING, logger="neuron_driver"):
        for _ in range(5):
            log.report(issue)
        log.report(ScanIssue(IssueKind.MISSING, "/y", "gone"))
        log.report(ScanIssue(IssueKind.MISSING, "/z", "gone"))
        log.report(issue)  # forgotten after two newer ones: logged again
    assert [r.getMessage().split(":")[1].strip() for r in caplog.records] == ["/x", "/y", "/z", "/x"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create character devices")
def test_char_devices(tmp_path: Path) -> None:
    sim.create(tmp_path, "inf2.24xlarge", char_devices=True)
    st = os.stat(layout.HostLayout(tmp_path).dev_node(4))
    assert os.major(st.st_rdev) == sim.SIM_CHAR_MAJOR
    assert os.minor(st.st_rdev) == 4
    assert scan(tmp_path, env={}).device(4).dev_node_present  # type: ignore[union-attr]


def test_tracker_rescans_only_when_the_listed_devices_change(make_node) -> None:  # type: ignore[no-untyped-def]
    from neuron_driver.inventory import InventoryTracker

    root = make_node("inf2.24xlarge")
    tracker = InventoryTracker(root)
    first = tracker.inventory
    assert tracker.refresh() is False
    assert tracker.inventory is first
    sim.vanish(root, 2)
    assert tracker.refresh() is True
    assert [d.index for d in tracker.inventory.devices] == [0, 1, 3, 4, 5]
    assert tracker.refresh() is False
    shutil.rmtree(layout.HostLayout(root).device_dir(4))  # listed (class link left behind) but unreadable
    assert tracker.refresh() is False  # not a change of the listing: no rescan on every call
