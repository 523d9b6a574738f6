"""One fault table, one behaviour: every fault kind, through every source the table names, does
the same to a device whichever components are installed.

For each (fault, source) on a simulated node:
- plugin alone (the chart with `npd.enabled=false`): the device plugin reads the kernel log and
  the driver's counters itself;
- plugin with the detector (the chart's default): the plugin reads no kernel log; the problem
  detector reads both and hands its verdicts over the verdict directory.
Both must agree with the table: the device leaves allocatable exactly when the fault's severity
says so, the detector sets `NeuronHealth` exactly then, and after a driver reload the device comes
back exactly for `until-reboot` faults (a reload only shows to either through its counters).

STAND-IN: the detector reports to tests/standins/apiserver.py (the real API server is used by the
cluster suites); nothing here depends on the API server's answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from standins.apiserver import FakeApiServer, serving

from neuron_device_plugin.metrics import PluginMetrics
from neuron_device_plugin.state import PluginState
from neuron_driver import kmsg, layout
from neuron_driver.inventory import scan
from neuron_health import faults
from neuron_health.faults import Fault, Severity
from neuron_health.monitor import HealthMonitor, KmsgWatcher
from neuron_model import resources
from neuron_problem_detector import config as npd_config
from neuron_problem_detector import rules
from neuron_problem_detector.app import Detector
from neuron_sim import node as sim

NODE = "fault-table-node"
DEVICE = 1
CASES = [pytest.param(fault, via, id=f"{fault.kind}-{via}") for fault in faults.FAULTS for via in sim.sources_of(fault)]


def test_every_fault_has_a_source_and_a_reason() -> None:
    for fault in faults.FAULTS:
        assert fault.kernel_pattern or fault.counters, fault.kind
        assert fault.why, fault.kind
    reasons = [f.reason for f in faults.FAULTS]
    # one reason per fault, so a condition's reason names the fault
    assert len(set(reasons)) == len(reasons)


class Plugin:
    def __init__(self, root: Path, verdict_dir: Path | None) -> None:
        metrics = PluginMetrics()
        self.state = PluginState(
            scan(root),
            [resources.neuron(resources.DEFAULT_PREFIX), resources.neuroncore(resources.DEFAULT_PREFIX)],
            metrics,
            quiet_period=3600,
            pending_ttl=60,
        )
        self.monitor = HealthMonitor(self.state, root, 1.0, verdict_dir, after_tick=self.state.expire_pending)
        self.kmsg = None if verdict_dir is not None else KmsgWatcher(self.state, root / layout.KMSG_FILE)

    def tick(self, times: int = 4) -> None:
        for _ in range(times):  # core status counters are read every few ticks
            self.monitor.tick()

    def read_kernel_line(self, message: str) -> None:
        if self.kmsg is not None:
            self.kmsg.handle(message)

    def healthy(self) -> bool:
        return self.state.verdict(DEVICE).healthy


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with serving(NODE) as server:
        yield server


def last_kernel_message(root: Path) -> str:
    records, _ = kmsg.split_records(layout.HostLayout(root).kmsg.read_text())
    return kmsg.parse_record(records[-1]).message


@pytest.mark.parametrize(("fault", "via"), CASES)
async def test_same_behaviour_with_and_without_the_detector(
    tmp_path: Path, api: FakeApiServer, fault: Fault, via: str
) -> None:
    root = tmp_path / "node"
    if via == "firmware":  # the firmware's verdict: driver 2.30.2, on trn2 and trn3
        sim.create(root, "trn2.48xlarge", driver_version="2.30.2.0")
    else:
        sim.create(root, "inf2.24xlarge")
    verdict_dir = tmp_path / "verdicts"
    cfg = npd_config.parse(
        ["--host-root", str(root), "--node-name", NODE, "--kubeconfig", str(api.kubeconfig(tmp_path / "kc")),
         "--listen", "127.0.0.1:0", "--state-file", str(tmp_path / "state.json"), "--verdict-dir", str(verdict_dir)],
        env={},
    )  # fmt: skip
    detector = Detector(cfg, asyncio.Event())  # its client from --kubeconfig, as the process makes it
    alone, with_detector = Plugin(root, None), Plugin(root, verdict_dir)
    detector.check_counters()
    alone.tick()
    with_detector.tick()

    sim.inject_fault(root, fault.kind, DEVICE, via=via, core=1)
    if via == "kernel":
        message = last_kernel_message(root)
        alone.read_kernel_line(message)
        detector.handle(rules.match_message(detector.rules, message))
    detector.check_counters()
    alone.tick()
    with_detector.tick()

    out = not fault.takes_device_out
    assert (alone.healthy(), with_detector.healthy()) == (out, out)
    conditions = {c.type: c for c in detector.state.conditions(detector.rules, 0)}
    assert (conditions[faults.CONDITION].status == "True") is fault.takes_device_out
    if fault.takes_device_out:
        assert conditions[faults.CONDITION].reason == fault.reason

    sim.reload_driver(root)
    detector.check_counters()
    alone.tick()
    with_detector.tick()
    # the reload shows only through counters that went down; a kernel line's fault waits for a reboot;
    # the firmware keeps its verdict across a reload, so a subsystem it lists keeps the device out
    back = fault.severity is not Severity.REPLACE_INSTANCE and (
        via not in ("kernel", "firmware") or not fault.takes_device_out
    )
    assert (alone.healthy(), with_detector.healthy()) == (back, back)
