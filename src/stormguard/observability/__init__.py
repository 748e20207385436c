"""Events, metrics (one schema for Prometheus and OpenTelemetry), top limited keys.

* :mod:`.events`: the typed events every component emits, and their listeners;
* :mod:`.metrics`: the schema (:data:`~.metrics.SCHEMA`) and :func:`track`;
* :func:`enable_prometheus` / :func:`enable_opentelemetry`: report every policy, store
  and limiter, created before or after the call;
* :class:`SpaceSaving`: the bounded sketch of the most-denied keys;
* :class:`JsonFormatter`: one JSON object per log line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stormguard.observability.logs import JsonFormatter
from stormguard.observability.metrics import SCHEMA, MetricSpec, snapshot, track
from stormguard.observability.topk import SpaceSaving, TopKey

if TYPE_CHECKING:
    from stormguard.observability.otel import enable_opentelemetry
    from stormguard.observability.prometheus import enable_prometheus

__all__ = ["SCHEMA", "JsonFormatter", "MetricSpec", "SpaceSaving", "TopKey",
           "enable_opentelemetry", "enable_prometheus", "snapshot", "track"]


def __getattr__(name: str) -> Any:
    # the exporters import their client libraries: only when asked for
    if name == "enable_prometheus":
        from stormguard.observability.prometheus import enable_prometheus

        return enable_prometheus
    if name == "enable_opentelemetry":
        from stormguard.observability.otel import enable_opentelemetry

        return enable_opentelemetry
    raise AttributeError(f"module 'stormguard.observability' has no attribute {name!r}")
