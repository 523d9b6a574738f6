"""A service's own Prometheus metrics, declared with its name prefix and registry said once.

The names are a contract (the dashboards and alert rules use them), so a declaration names the
metric's suffix and the set adds the prefix: a service cannot publish a name outside its own.
The set keeps what it declared: `series()` is the catalogue of what it serves, as Prometheus
stores it (tests/test_metric_names.py holds every rule and panel expression to the catalogues).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Label values to expose at zero from the start: rate() and increase() see a series' first step only
# if they saw the series before it. A value is a string for one label, a tuple of strings for several.
Shown = Iterable[str | Sequence[str]]

M = TypeVar("M", Counter, Gauge, Histogram)


@dataclass(frozen=True)
class Series:
    """One series name as Prometheus stores it (a counter's with `_total`, a histogram's `_bucket`,
    `_sum`, `_count`), with the names of the labels its exporter gives it (not the scrape's own)."""

    name: str
    labels: tuple[str, ...] = ()


def exposed(family: str, kind: str, labels: Sequence[str] = (), *, created: bool = True) -> tuple[Series, ...]:
    """The series one family of prometheus_client's becomes: `family` is the name as declared (a
    counter's with or without `_total`); `created`: prometheus_client's `_created` series (its
    Counter and Histogram have one, a collector's CounterMetricFamily has none unless given)."""
    labels = tuple(labels)
    if kind == "gauge":
        return (Series(family, labels),)
    if kind == "counter":
        base = family.removesuffix("_total")
        return (Series(f"{base}_total", labels), *((Series(f"{base}_created", labels),) if created else ()))
    if kind == "histogram":
        return (
            Series(f"{family}_bucket", (*labels, "le")),
            Series(f"{family}_sum", labels),
            Series(f"{family}_count", labels),
            *((Series(f"{family}_created", labels),) if created else ()),
        )
    raise ValueError(f"no such metric type: {kind}")


class MetricSet:
    def __init__(self, prefix: str, registry: CollectorRegistry | None = None) -> None:
        """`prefix` '' keeps the names as given (node-problem-detector's own, which its dashboards know)."""
        self.prefix = prefix
        self.registry = CollectorRegistry() if registry is None else registry
        self._declared: list[Series] = []

    def name(self, suffix: str) -> str:
        return f"{self.prefix}_{suffix}" if self.prefix else suffix

    def series(self) -> tuple[Series, ...]:
        """Every series the metrics declared here serve."""
        return tuple(self._declared)

    def _declare(self, suffix: str, kind: str, labels: Sequence[str]) -> str:
        name = self.name(suffix)
        self._declared.extend(exposed(name, kind, labels))
        return name

    def counter(self, suffix: str, documentation: str, labels: Sequence[str] = (), *, shown: Shown = ()) -> Counter:
        name = self._declare(suffix, "counter", labels)
        return _show(Counter(name, documentation, labels, registry=self.registry), shown)

    def gauge(self, suffix: str, documentation: str, labels: Sequence[str] = (), *, shown: Shown = ()) -> Gauge:
        name = self._declare(suffix, "gauge", labels)
        return _show(Gauge(name, documentation, labels, registry=self.registry), shown)

    def histogram(
        self,
        suffix: str,
        documentation: str,
        labels: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        shown: Shown = (),
    ) -> Histogram:
        name = self._declare(suffix, "histogram", labels)
        metric = Histogram(name, documentation, labels, buckets=buckets, registry=self.registry)
        return _show(metric, shown)


def _show(metric: M, shown: Shown) -> M:
    for values in shown:
        metric.labels(*((values,) if isinstance(values, str) else values))
    return metric
