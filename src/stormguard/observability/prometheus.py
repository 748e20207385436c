"""The metrics schema (:mod:`.metrics`) as a prometheus-client collector."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from stormguard.observability import metrics

__all__ = ["StormguardCollector", "enable_prometheus"]


class StormguardCollector:
    """Yields every metric of :data:`~stormguard.observability.metrics.SCHEMA` that has a
    series, read from :func:`~stormguard.observability.metrics.snapshot` at scrape time
    (``select``: which live components to report, default all)."""

    def __init__(self, select: metrics.Select | None = None) -> None:
        self.select = select

    def collect(self) -> Iterator[Metric]:
        snap = metrics.snapshot(self.select)
        for name, spec in metrics.SCHEMA.items():
            series = snap.get(name)
            if not series:
                continue
            family: CounterMetricFamily | GaugeMetricFamily
            if spec.kind == "counter":
                family = CounterMetricFamily(name, spec.help, labels=spec.labels)
            else:
                family = GaugeMetricFamily(name, spec.help, labels=spec.labels)
            for labels in sorted(series):
                family.add_metric([str(v) for v in labels], series[labels])
            yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())  # names depend on what is live: describe nothing, check nothing


_collectors: dict[int, tuple[CollectorRegistry, StormguardCollector]] = {}


def enable_prometheus(registry: CollectorRegistry | None = None, *,
                      select: metrics.Select | None = None) -> StormguardCollector:
    """Report every policy, store and limiter (created before or after this call) on
    ``registry`` (prometheus-client's default registry when omitted). Calling it again
    with the same registry returns the collector already registered. ``select(kind,
    component)`` reports only the live components it accepts."""
    reg = REGISTRY if registry is None else registry
    if not isinstance(reg, CollectorRegistry):
        raise TypeError(f"registry: must be a prometheus_client CollectorRegistry, got "
                        f"{type(reg).__name__}")
    known = _collectors.get(id(reg))
    if known is not None and known[0] is reg:
        return known[1]
    metrics.enable()
    collector = StormguardCollector(select)
    reg.register(collector)
    _collectors[id(reg)] = (reg, collector)
    return collector
