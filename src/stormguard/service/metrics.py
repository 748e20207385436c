"""Prometheus metrics of one service instance (a private registry per app).

The hot path only bumps plain integers (one event loop serves every check); a custom
collector turns them into Prometheus families when ``/metrics`` is scraped.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from stormguard.ratelimit.rules import CheckResult

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
           0.25, 1.0)
_MAX_LABELS = 10_000  # rule names come from the rule set; this only bounds a runaway


class Metrics(Collector):
    """``stormguard_checks_total{rule,result}``, ``stormguard_shadow_denials_total{rule}``,
    ``stormguard_degraded_decisions_total``, ``stormguard_check_latency_seconds``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.checks: dict[tuple[str, str], int] = {}
        self.shadow_denials: dict[str, int] = {}
        self.degraded = 0
        self._buckets = [0] * (len(BUCKETS) + 1)
        self._sum = 0.0
        self.registry.register(self)

    def record(self, result: CheckResult, seconds: float) -> None:
        d = result.decision
        rule = d.rule.name if d is not None and d.rule is not None else None
        k = (rule or "(none)", "allowed" if result.allowed else "denied")
        checks = self.checks
        if k in checks:
            checks[k] += 1
        elif len(checks) < _MAX_LABELS:
            checks[k] = 1
        for name in result.shadow_denied:
            self.shadow_denials[name] = self.shadow_denials.get(name, 0) + 1
        if result.degraded:
            self.degraded += 1
        self._buckets[bisect.bisect_left(BUCKETS, seconds)] += 1
        self._sum += seconds

    def collect(self) -> Iterator[Metric]:
        c = CounterMetricFamily("stormguard_checks", "Rate-limit checks by binding rule and "
                                "result", labels=["rule", "result"])
        for (rule, result), n in sorted(self.checks.items()):
            c.add_metric([rule, result], n)
        yield c
        s = CounterMetricFamily("stormguard_shadow_denials",
                                "Requests a shadow (dry-run) rule would have denied",
                                labels=["rule"])
        for rule, n in sorted(self.shadow_denials.items()):
            s.add_metric([rule], n)
        yield s
        yield CounterMetricFamily("stormguard_degraded_decisions",
                                  "Decisions answered by on_error because the store failed",
                                  value=self.degraded)
        cumulative, acc = [], 0
        for bound, n in zip((*BUCKETS, float("inf")), self._buckets, strict=True):
            acc += n
            cumulative.append((repr(bound) if bound != float("inf") else "+Inf", acc))
        h = HistogramMetricFamily("stormguard_check_latency_seconds",
                                  "Time to decide one check (store calls included)",
                                  buckets=cumulative, sum_value=self._sum)
        yield h

    def render(self) -> bytes:
        return generate_latest(self.registry)
