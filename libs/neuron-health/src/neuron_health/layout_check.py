"""The driver-layout check as every node agent runs it at start: logged, counted in a gauge, and handed
back so the problem detector can say it on the node ("health counters unreadable: ..."). `recheck` runs it
again (the problem detector does on every new inventory, and while a path is missing), so a driver reloaded
into another layout is found, and one back in a known layout clears.

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


def recheck(
    root: str | Path,
    inventory: NodeInventory,
    before: LayoutReport,
    logger: logging.Logger,
    gauge: Gauge | None = None,
    **extra: str,
) -> LayoutReport | None:
    """The check again: the new report when what is missing changed since `before` (logged as at start,
    or the recovery as such, and counted in `gauge`), else None."""
    report = driver_layout.check_layout(root, inventory)
    if report.summary() == before.summary():
        return None
    if report.ok:
        logger.info(
            "health counters readable again: every path the stack reads is there (driver %s)",
            report.driver_version or "of unknown version",
            extra=extra,
        )
    else:
        driver_layout.log_report(report, logger, **extra)
    if gauge is not None:
        gauge.set(len(report.missing))
    return report
