"""The driver-layout check as every node agent runs it at start: logged, counted in a gauge, and handed
back so the problem detector can say it on the node ("health counters unreadable: ...").

The check itself is `neuron_driver.driver_layout.check_layout`; what it expects per core are the
hardware-error statuses (`HW_ERROR_STATUS_NAMES`) and per device the `stats/hardware` counters and
each generation's health files, and tests hold both to this package's fault table.
"""

from __future__ import annotations

import logging
from pathlib import Path

from prometheus_client import Gauge

from neuron_common.metrics import MetricSet
from neuron_driver import driver_layout
from neuron_driver.driver_layout import LayoutReport
from neuron_driver.inventory import NodeInventory

GAUGE = "health_sources_missing"
GAUGE_HELP = "Paths the stack reads for health that this node's driver does not expose (per device; checked at start)"
REASON = "NeuronHealthCountersUnreadable"  # the problem detector's Event and condition reason


def declare_gauge(m: MetricSet) -> Gauge:
    """`<prefix>_health_sources_missing`: one gauge name for every agent that runs the check."""
    return m.gauge(GAUGE, GAUGE_HELP)


def check_at_start(
    root: str | Path, inventory: NodeInventory, logger: logging.Logger, gauge: Gauge | None = None, **extra: str
) -> LayoutReport:
    """Check the layout, log every missing path (an error each), and set `gauge` to how many."""
    report = driver_layout.check_at_start(root, inventory, logger, **extra)
    if gauge is not None:
        gauge.set(len(report.missing))
    return report
