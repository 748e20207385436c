"""Prometheus metrics of one service instance (a private registry per app)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from stormguard.ruleset import CheckResult

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
            0.25, 1.0)


class Metrics:
    """``stormguard_checks_total{rule,result}``, ``stormguard_shadow_denials_total{rule}``,
    ``stormguard_degraded_decisions_total``, ``stormguard_check_latency_seconds``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.checks = Counter("stormguard_checks", "Rate-limit checks by binding rule and result",
                              ["rule", "result"], registry=self.registry)
        self.shadow_denials = Counter("stormguard_shadow_denials",
                                      "Requests a shadow (dry-run) rule would have denied",
                                      ["rule"], registry=self.registry)
        self.degraded = Counter("stormguard_degraded_decisions",
                                "Decisions answered by on_error because the store failed",
                                registry=self.registry)
        self.latency = Histogram("stormguard_check_latency_seconds",
                                 "Time to decide one check (store calls included)",
                                 buckets=_BUCKETS, registry=self.registry)
        self._children: dict[tuple[str, str], Counter] = {}

    def record(self, result: CheckResult, seconds: float) -> None:
        d = result.decision
        rule = d.rule.name if d is not None and d.rule is not None else None
        result_label = "allowed" if result.allowed else "denied"
        k = (rule or "", result_label)
        child = self._children.get(k)
        if child is None:
            if len(self._children) > 10_000:  # rule names are bounded by the rule set
                self._children.clear()
            child = self._children[k] = self.checks.labels(rule=k[0] or "(none)",
                                                           result=result_label)
        child.inc()
        for name in result.shadow_denied:
            self.shadow_denials.labels(rule=name).inc()
        if result.degraded:
            self.degraded.inc()
        self.latency.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
