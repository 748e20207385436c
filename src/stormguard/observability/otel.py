"""The metrics schema (:mod:`.metrics`) as OpenTelemetry observable instruments.

Needs ``opentelemetry-api`` (the ``otel`` extra). Every metric of the schema becomes an
observable counter or gauge of the meter ``"stormguard"``, whose callback reads
:func:`~stormguard.observability.metrics.snapshot`: the same names, labels (as
attributes) and values as the Prometheus collector.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from stormguard.observability import metrics

__all__ = ["enable_opentelemetry"]

_MAX_AGE = 5.0
"""One collection reads the snapshot once, not once per instrument: the first instrument's
callback (the SDK calls them in the order they were created) takes a fresh one, the
others reuse it unless it is older than this (another order, a stalled collection)."""
_enabled_for: dict[int, Any] = {}
_lock = threading.Lock()


class _Snapshot:
    def __init__(self) -> None:
        self._at = -1.0
        self._snap: dict[str, dict[tuple[str, ...], float]] = {}
        self._lock = threading.Lock()

    def get(self, fresh: bool = False) -> dict[str, dict[tuple[str, ...], float]]:
        with self._lock:
            now = time.monotonic()
            if fresh or now - self._at > _MAX_AGE:
                self._snap, self._at = metrics.snapshot(), now
            return self._snap


def enable_opentelemetry(meter_provider: Any = None) -> Any:
    """Report every policy, store and limiter (created before or after this call) through
    ``meter_provider`` (the global one when omitted); returns the meter. Calling it again
    with the same provider returns the same meter."""
    try:
        from opentelemetry import metrics as otel
        from opentelemetry.metrics import CallbackOptions, Observation
    except ImportError as exc:  # pragma: no cover - the extra is installed in dev
        raise ImportError("enable_opentelemetry needs opentelemetry-api: install the "
                          "'otel' extra") from exc
    provider = otel.get_meter_provider() if meter_provider is None else meter_provider
    if not hasattr(provider, "get_meter"):
        raise TypeError(f"meter_provider: must be an OpenTelemetry MeterProvider, got "
                        f"{type(provider).__name__}")
    with _lock:
        known = _enabled_for.get(id(provider))
        if known is not None and known[0] is provider:
            return known[1]
        metrics.enable()
        meter = provider.get_meter("stormguard")
        snap = _Snapshot()
        for i, (name, spec) in enumerate(metrics.SCHEMA.items()):
            def callback(options: CallbackOptions, name: str = name,
                         labels: tuple[str, ...] = spec.labels,
                         first: bool = i == 0) -> Iterable[Observation]:
                series = snap.get(fresh=first).get(name, {})
                return [Observation(v, dict(zip(labels, k, strict=True)))
                        for k, v in sorted(series.items())]

            if spec.kind == "counter":
                meter.create_observable_counter(name, [callback], description=spec.help)
            else:
                meter.create_observable_gauge(name, [callback], description=spec.help)
        _enabled_for[id(provider)] = (provider, meter)
        return meter
