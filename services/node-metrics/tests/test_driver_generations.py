"""The exporter on every driver generation the simulator writes: it starts with nothing missing, reads
no directory as a counter (health_status/ sits in stats/hardware from 2.28), and on 2.30.2 serves the
corrected ECC counts under AWS's name and in a native family of their own. A tree whose health
counters have moved is served as missing health sources."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from neuron_node_metrics import config as config_mod
from neuron_node_metrics.app import Exporter
from neuron_node_metrics.attribution import Attribution
from neuron_node_metrics.catalogue import FAMILIES, Naming
from neuron_node_metrics.collector import UTILIZATION, NeuronCollector
from neuron_sim import monitor as standin
from neuron_sim import node as sim

ALL = frozenset(FAMILIES)


def ecc_events(text: str, name: str = "hardware_ecc_events_total") -> dict[str, float]:
    """An ECC family of device 0, by event_type (AWS's name) or type (the native names)."""
    return {
        s.labels.get("event_type", s.labels.get("type", "")): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and "0" in (s.labels.get("neuron_device_index"), s.labels.get("device"))
    }


@pytest.mark.parametrize("driver_version", list(sim.GENERATION_VERSIONS.values()), ids=list(sim.GENERATION_VERSIONS))
def test_each_generation_starts_clean_and_reads_its_counters(tmp_path: Path, driver_version: str | None) -> None:
    sim.create(tmp_path, "trn2.3xlarge", driver_version=driver_version)
    c = NeuronCollector(tmp_path, ALL, Attribution, naming=Naming.BOTH)
    assert c.layout.ok, c.layout.lines()
    sim.bump_counter(tmp_path, 0, "mem_ecc_uncorrected", by=2)
    events = ecc_events(c.render())
    assert events["mem_ecc_uncorrected"] == 2
    assert sum(c.read_errors.values()) == 0  # before 2.28's tree was known, health_status/ failed every scrape
    assert "health_status" not in events
    if driver_version == "2.30.2.0":
        sim.bump_counter(tmp_path, 0, "mem_ecc_corrected", by=7)
        sim.bump_counter(tmp_path, 0, "sram_ecc_corrected", by=1)
        text = c.render()
        events = ecc_events(text)
        assert (events["mem_ecc_corrected"], events["sram_ecc_corrected"]) == (7, 1)
        # natively a family of their own: the uncorrected one, whose rise means "replace", stays as it was
        assert ecc_events(text, "neuron_device_ecc_corrected_errors_total") == {"mem_corrected": 7, "sram_corrected": 1}
        assert ecc_events(text, "neuron_device_ecc_errors_total") == {
            "mem_uncorrected": 2,
            "sram_uncorrected": 0,
            "mem_repairable_uncorrected": 0,
        }
    else:
        assert "mem_ecc_corrected" not in events
        assert ecc_events(c.render(), "neuron_device_ecc_corrected_errors_total") == {}


def _self_metrics(root: Path) -> dict[str, float]:
    """The exporter's own series, unlabelled ones by name, as /metrics serves them after the Neuron page."""
    cfg = config_mod.parse(
        ["--host-root", str(root), "--pod-resources-socket", str(root / "none.sock"), "--listen", "127.0.0.1:0"],
        env={},
    )
    assert cfg is not None
    exporter = Exporter(cfg, asyncio.Event())
    text = generate_latest(exporter.self_registry).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def test_a_moved_health_counter_is_served_as_missing_health_sources(tmp_path: Path) -> None:
    sim.create(tmp_path / "clean", "trn2.3xlarge", driver_version="2.30.2.0")
    assert _self_metrics(tmp_path / "clean")["neuron_exporter_health_sources_missing"] == 0
    moved = tmp_path / "moved"
    sim.create(moved, "trn2.3xlarge", driver_version="2.30.2.0")
    sim.move_node(moved, 0, "stats/hardware", "stats/hardware_v2")
    # one device: its 3 uncorrected and 2 corrected counts, and health_status/ (4 counters and the verdict's 2)
    assert _self_metrics(moved)["neuron_exporter_health_sources_missing"] == 3 + 2 + 4 + 2


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def busy(root: Path, core: int, seconds: float) -> None:
    """nc_time_in_use of physical core `core` of device 0 grows by `seconds` (it counts picoseconds)."""
    sim.bump_counter(root, 0, "nc_time_in_use", core=core, by=int(seconds * 1e12))


@pytest.mark.parametrize("driver_version", list(sim.GENERATION_VERSIONS.values()), ids=list(sim.GENERATION_VERSIONS))
def test_utilization_from_sysfs_where_the_driver_keeps_it_live(tmp_path: Path, driver_version: str | None) -> None:
    sim.create(tmp_path, "trn2.3xlarge", driver_version=driver_version)  # LNC 2: logical core 0 is physical 0, 1
    clock = Clock()
    c = NeuronCollector(tmp_path, ALL, Attribution, naming=Naming.BOTH, clock=clock)
    busy(tmp_path, 0, 3.0)
    first = c.render()
    assert samples(first, "neuron_core_utilization_ratio") == []  # nothing to measure against yet
    clock.now += 4.0
    busy(tmp_path, 0, 2.0)  # physical core 0 busy half of the 4 s, physical core 1 idle: the logical core a quarter
    busy(tmp_path, 2, 4.0)  # logical core 1, half busy (physical 2 all the time, 3 not at all)
    text = c.render()
    if not c.live:  # before 2.30.2 the counter moves when a process exits: no rate is made of it
        assert driver_version != "2.30.2.0"
        assert samples(text, "neuron_core_busy_seconds_total") == []
        assert samples(text, "neuron_core_utilization_ratio") == []
        return
    assert {labels["core"]: v for labels, v in samples(text, "neuron_core_busy_seconds_total")} == {
        "0": 2.5,
        "1": 2.0,
        "2": 0,
        "3": 0,
    }
    native = {labels["core"]: v for labels, v in samples(text, "neuron_core_utilization_ratio")}
    assert native == {"0": 0.25, "1": 0.5, "2": 0, "3": 0}
    assert all(labels["runtime_tag"] == "" for labels, _ in samples(text, "neuron_core_utilization_ratio"))
    drop_in = {labels["neuroncore"]: v for labels, v in samples(text, "neuroncore_utilization_ratio")}
    assert drop_in == native
    sim.set_counter_raw(tmp_path, 0, "nc_time_in_use", "0\n", core=2)  # started again from 0, as after a reload
    clock.now += 1.0
    after = {labels["core"]: v for labels, v in samples(c.render(), "neuron_core_utilization_ratio")}
    assert after == {"0": 0, "2": 0, "3": 0}  # no negative busy fraction for core 1, no figure at all


def test_neuron_monitor_wins_over_sysfs_while_it_reports(tmp_path: Path) -> None:
    sim.create(tmp_path, "trn2.3xlarge", driver_version="2.30.2.0")
    cfg = config_mod.parse(
        ["--host-root", str(tmp_path), "--pod-resources-socket", str(tmp_path / "none.sock"),
         "--listen", "127.0.0.1:0", "--neuron-monitor-command", "neuron-monitor"],
        env={},
    )  # fmt: skip
    assert cfg is not None
    exporter = Exporter(cfg, asyncio.Event())
    clock = Clock()
    exporter.collector.clock = clock
    exporter.collector.render()
    clock.now += 1.0
    busy(tmp_path, 0, 1.0)
    # configured, not running (no document yet): sysfs's figure
    assert {labels["runtime_tag"] for labels, _ in samples(exporter.collector.render(), UTILIZATION)} == {""}
    node = standin.node_from_root(tmp_path)
    exporter.monitor.feed(json.dumps(standin.document(node, standin.spread(node, 2, 2), random.Random(0))))
    clock.now += 1.0
    busy(tmp_path, 0, 1.0)
    text = exporter.collector.render()
    served = samples(text, UTILIZATION)
    assert served, "neuron-monitor's runtimes report utilization"
    assert all(labels["runtime_tag"] != "" for labels, _ in served)  # only neuron-monitor's, per runtime
    assert len({labels["core"] for labels, _ in samples(text, "neuron_core_busy_seconds_total")}) == 4  # kept


def test_a_plain_file_nc_time_in_use_is_read_as_well_as_the_drivers_counter_node(tmp_path: Path) -> None:
    """The driver writes other_info/<name> as a counter node (<name>/total, <name>/present), as the simulator
    does; a plain file (the simulator's old shape) is read too."""
    sim.create(tmp_path, "trn2.3xlarge", driver_version="2.30.2.0")
    for node in sorted(
        tmp_path.glob("sys/devices/virtual/neuron_device/neuron0/neuron_core*/stats/other_info/nc_time_in_use")
    ):
        assert (node / "total").is_file(), node
        assert (node / "present").is_file(), node
        (node / "total").unlink()
        (node / "present").unlink()
        node.rmdir()
        node.write_text(f"{2 * 10**12}\n")  # 2 s
    text = NeuronCollector(tmp_path, ALL, Attribution).render()
    assert {labels["core"]: v for labels, v in samples(text, "neuron_core_busy_seconds_total")} == {
        "0": 2.0,
        "1": 2.0,
        "2": 2.0,
        "3": 2.0,
    }


def by_device(text: str, name: str, **labels: str) -> dict[int, float]:
    """A family's samples by device, those carrying `labels`."""
    return {int(lab["device"]): v for lab, v in samples(text, name) if all(lab.get(k) == w for k, w in labels.items())}


def test_the_firmwares_verdict_is_served_as_the_node_agents_read_it(tmp_path: Path) -> None:
    """trn2.48xlarge on driver 2.30.2: each subsystem the firmware lists, with the fault table's fault and
    severity; a link fault as the link rule's answer (device_health.multi_node_unfit), which takes nothing out
    of allocatable and so shows in no other family; a heartbeat seen to move and then stand still as stale."""
    sim.create(tmp_path, "trn2.48xlarge", driver_version="2.30.2.0")
    clock = Clock()
    c = NeuronCollector(tmp_path, ALL, Attribution, clock=clock, heartbeat_stale_after=60)
    clean = c.render()
    assert by_device(clean, "neuron_device_multi_node_unfit") == dict.fromkeys(range(16), 0)
    assert by_device(clean, "neuron_device_firmware_heartbeat_stale") == dict.fromkeys(range(16), 0)
    assert {v for _, v in samples(clean, "neuron_device_firmware_unhealthy")} == {0}
    assert len(samples(clean, "neuron_device_firmware_unhealthy")) == 16 * 10  # every subsystem, every device
    sim.set_unhealthy_components(tmp_path, 5, ["hbm"])
    sim.set_unhealthy_components(tmp_path, 6, ["link_efa"])
    sim.beat_heartbeat(tmp_path, 3)  # seen to move
    text = c.render()
    failing = [(lab, v) for lab, v in samples(text, "neuron_device_firmware_unhealthy") if v]
    assert sorted((lab["device"], lab["component"], lab["fault"], lab["severity"]) for lab, _ in failing) == [
        ("5", "hbm", "UNHEALTHY_HBM", "replace-instance"),
        ("6", "link_efa", "UNHEALTHY_LINK_EFA", "multi-node-unfit"),
    ]
    assert by_device(text, "neuron_device_multi_node_unfit") == {**dict.fromkeys(range(16), 0), 6: 1}
    assert by_device(text, "neuron_device_firmware_heartbeat_stale")[3] == 0  # it has just moved
    clock.now += 61  # device 3's heartbeat stood still past --heartbeat-stale-after; the others never moved
    stale = by_device(c.render(), "neuron_device_firmware_heartbeat_stale")
    assert stale == {**dict.fromkeys(range(16), 0), 3: 1}
    sim.beat_heartbeat(tmp_path, 3)
    sim.set_unhealthy_components(tmp_path, 6, [])  # the link mended: fit again
    text = c.render()
    assert by_device(text, "neuron_device_firmware_heartbeat_stale")[3] == 0
    assert by_device(text, "neuron_device_multi_node_unfit")[6] == 0
    assert by_device(text, "neuron_device_firmware_unhealthy", component="hbm")[5] == 1


@pytest.mark.parametrize("driver_version", list(sim.GENERATION_VERSIONS.values()), ids=list(sim.GENERATION_VERSIONS))
def test_no_firmware_verdict_is_served_where_the_driver_writes_none(tmp_path: Path, driver_version: str | None) -> None:
    """Before 2.30.2, and on trn1 on every driver, there is no verdict: no series (unknown, not "healthy")."""
    for instance_type in ("trn1.32xlarge", "trn2.3xlarge"):
        root = tmp_path / instance_type
        sim.create(root, instance_type, driver_version=driver_version)
        text = NeuronCollector(root, ALL, Attribution).render()
        served = {n: samples(text, n) for n in ("neuron_device_firmware_unhealthy", "neuron_device_multi_node_unfit")}
        if driver_version == "2.30.2.0" and instance_type == "trn2.3xlarge":
            assert all(served.values()), served
        else:
            assert not any(served.values()), (instance_type, served)


def test_the_firmware_is_not_read_without_its_families_and_the_flag_reaches_the_watch(tmp_path: Path) -> None:
    sim.create(tmp_path, "trn2.3xlarge", driver_version="2.30.2.0")
    sim.set_unhealthy_components(tmp_path, 0, ["hbm"])
    left_out = NeuronCollector(tmp_path, ALL - {"neuron_device_firmware_unhealthy", "neuron_device_multi_node_unfit",
                                                "neuron_device_firmware_heartbeat_stale"}, Attribution)  # fmt: skip
    assert left_out.reader.firmware_devices == frozenset()
    assert "neuron_device_firmware" not in left_out.render()
    args = [
        "--host-root",
        str(tmp_path),
        "--pod-resources-socket",
        str(tmp_path / "none.sock"),
        "--listen",
        "127.0.0.1:0",
    ]
    by_flag = config_mod.parse([*args, "--heartbeat-stale-after", "90s"], env={})
    by_env = config_mod.parse(args, env={"NEURON_METRICS_HEARTBEAT_STALE_AFTER": "45s"})
    assert by_flag is not None
    assert by_env is not None
    assert Exporter(by_flag, asyncio.Event()).collector.heartbeats.stale_after == 90
    assert Exporter(by_env, asyncio.Event()).collector.heartbeats.stale_after == 45
