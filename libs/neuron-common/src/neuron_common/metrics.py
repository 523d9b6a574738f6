"""A service's own Prometheus metrics, declared with its name prefix and registry said once.

The names are a contract (the dashboards and alert rules use them), so a declaration names the
metric's suffix and the set adds the prefix: a service cannot publish a name outside its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Label values to expose at zero from the start: rate() and increase() see a series' first step only
# if they saw the series before it. A value is a string for one label, a tuple of strings for several.
Shown = Iterable[str | Sequence[str]]

M = TypeVar("M", Counter, Gauge, Histogram)


class MetricSet:
    def __init__(self, prefix: str, registry: CollectorRegistry | None = None) -> None:
        """`prefix` '' keeps the names as given (node-problem-detector's own, which its dashboards know)."""
        self.prefix = prefix
        self.registry = CollectorRegistry() if registry is None else registry

    def name(self, suffix: str) -> str:
        return f"{self.prefix}_{suffix}" if self.prefix else suffix

    def counter(self, suffix: str, documentation: str, labels: Sequence[str] = (), *, shown: Shown = ()) -> Counter:
        return _show(Counter(self.name(suffix), documentation, labels, registry=self.registry), shown)

    def gauge(self, suffix: str, documentation: str, labels: Sequence[str] = (), *, shown: Shown = ()) -> Gauge:
        return _show(Gauge(self.name(suffix), documentation, labels, registry=self.registry), shown)

    def histogram(
        self,
        suffix: str,
        documentation: str,
        labels: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        shown: Shown = (),
    ) -> Histogram:
        metric = Histogram(self.name(suffix), documentation, labels, buckets=buckets, registry=self.registry)
        return _show(metric, shown)


def _show(metric: M, shown: Shown) -> M:
    for values in shown:
        metric.labels(*((values,) if isinstance(values, str) else values))
    return metric
