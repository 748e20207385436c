"""One metrics schema for every component, and the registry that feeds it.

Two sources feed the same figures, and both exporters (:mod:`.prometheus`,
:mod:`.otel`) read them from :func:`snapshot`, so Prometheus and OpenTelemetry can never
disagree on a name, a label or a value:

* **events** (:mod:`.events`): one global listener, installed by :func:`enable`, turns
  each event into counter increments through :data:`EVENT_METRICS` (event class ->
  function answering ``(metric, labels, amount)`` triples). Events are emitted on slow
  paths only (a retry, a rejection, a transition, a timeout).
* **tracked components**: every breaker, bulkhead, limiter and store registers itself
  at construction with :func:`track` (a weak reference: tracking never keeps a component
  alive). When scraped, :data:`READERS` turns each one into gauge and counter values,
  read from its own state. A component that offers a ``stats()`` dict is wired with one
  entry in :data:`STATS_METRICS`.

Labels are names that configuration gives (a policy's ``name``, a rule's name, a reason
from a fixed set), never request data such as keys: cardinality is bounded by design
(and :data:`MAX_SERIES` bounds a runaway configuration per metric).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from stormguard.observability.events import (
    BudgetExhausted,
    BulkheadRejected,
    CallRejected,
    CallThrottled,
    Event,
    FallbackUsed,
    LimitChanged,
    RequestShed,
    RetryGaveUp,
    RetryScheduled,
    StateChanged,
    TimedOut,
    add_listener,
)

__all__ = [
    "EVENT_METRICS",
    "MAX_SERIES",
    "READERS",
    "SCHEMA",
    "STATS_METRICS",
    "MetricSpec",
    "Sample",
    "Select",
    "enable",
    "enabled",
    "snapshot",
    "track",
    "tracked",
]

_log = logging.getLogger("stormguard")

MAX_SERIES = 10_000
"""Label combinations one metric may hold; beyond it new combinations are dropped (names
come from configuration: this bounds only a runaway one)."""

BREAKER_STATES = ("closed", "open", "half_open")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric: its name (Prometheus adds ``_total`` to counters), kind, labels, help."""

    name: str
    kind: str  # "counter" | "gauge"
    labels: tuple[str, ...]
    help: str
    planned: bool = False
    """True for a metric whose component is not wired yet (listed, never reported)."""


def _c(name: str, labels: tuple[str, ...], text: str, planned: bool = False) -> MetricSpec:
    return MetricSpec(name, "counter", labels, text, planned)


def _g(name: str, labels: tuple[str, ...], text: str, planned: bool = False) -> MetricSpec:
    return MetricSpec(name, "gauge", labels, text, planned)


_N = ("name",)
SCHEMA: dict[str, MetricSpec] = {s.name: s for s in (
    # rate limiting
    _c("stormguard_limiter_decisions", ("name", "rule", "result"),
       "Rate-limit decisions by limiter, rule and result (allowed, denied, shadow_denied, "
       "degraded)"),
    _g("stormguard_limiter_top_keys", _N,
       "Keys held by the limiter's top-denied sketch (bounded by its capacity)"),
    # stores
    _c("stormguard_store_round_trips", _N, "Network round trips of a store"),
    _c("stormguard_store_errors", _N,
       "Store failures a limiter answered with on_error (degraded decisions)"),
    _g("stormguard_store_breaker_state", ("name", "breaker", "state"),
       "A store's breaker per node: 1 for its current state, 0 for the others"),
    # circuit breakers
    _g("stormguard_breaker_state", ("name", "state"),
       "Circuit breaker state: 1 for the current one (closed, open, half_open), 0 else"),
    _c("stormguard_breaker_transitions", ("name", "from", "to"),
       "Circuit breaker (and store breaker) state transitions"),
    _c("stormguard_breaker_calls", ("name", "outcome"),
       "Calls through a circuit breaker by outcome (success, failure, rejected)"),
    # retries
    _c("stormguard_retries", _N, "Retries scheduled"),
    _c("stormguard_retry_gave_up", ("name", "reason"),
       "Calls a retry gave up on (attempts, not_retryable, deadline)"),
    _c("stormguard_retry_budget_exhausted", _N, "Retries the shared retry budget refused"),
    # bulkheads, timeouts, fallbacks
    _g("stormguard_bulkhead_in_flight", _N, "Calls in flight in a bulkhead"),
    _g("stormguard_bulkhead_waiting", _N, "Callers waiting for a bulkhead slot"),
    _g("stormguard_bulkhead_capacity", _N, "A bulkhead's max_concurrent"),
    _c("stormguard_bulkhead_rejected", _N, "Calls a bulkhead rejected"),
    _c("stormguard_timeouts", ("name", "kind"), "Timeouts that fired (kind: attempt, total)"),
    _c("stormguard_fallbacks", _N, "Answers a fallback gave instead of the call"),
    # overload protection: the shedder (also inside ConcurrencyLimit and the LoadShedding
    # middleware) and the adaptive throttle, read from their stats()
    _g("stormguard_concurrency_limit_in_flight", _N,
       "Calls in flight under a concurrency limit or load shedder"),
    _g("stormguard_concurrency_limit_waiting", _N,
       "Calls waiting for a concurrency limit or load shedder"),
    _g("stormguard_adaptive_limit", _N, "The (adaptive) concurrency limit's current value"),
    _c("stormguard_shed", ("name", "tier"), "Requests shed, by tier"),
    _c("stormguard_limit_changes", _N, "Moves of an adaptive concurrency limit"),
    _g("stormguard_throttle_probability", _N,
       "Client-side throttling: the probability that a call is rejected locally now"),
    _c("stormguard_throttled", _N, "Calls client-side throttling rejected locally"),
    # components whose gauges come from their stats() (STATS_METRICS below); they report
    # from the moment their constructors call track(self, kind)
    _g("stormguard_shaper_queue_depth", _N, "Calls waiting in a shaper"),
    _c("stormguard_shaper_waits", _N, "Calls a shaper delayed"),
    _c("stormguard_shaper_rejected", _N, "Calls a shaper rejected"),
    _g("stormguard_queue_pending", _N, "Deferred-queue jobs pending"),
    _g("stormguard_queue_in_flight", _N, "Deferred-queue jobs in flight"),
    _g("stormguard_queue_dead", _N, "Deferred-queue jobs dead-lettered"),
    _c("stormguard_hybrid_syncs", _N, "Hybrid store sync rounds"),
    _c("stormguard_hybrid_keys_synced", _N, "Keys a hybrid store synced"),
    _c("stormguard_hybrid_local_decisions", _N, "Decisions a hybrid store took locally"),
    _g("stormguard_hybrid_degraded", _N,
       "1 while a hybrid store cannot sync (it decides on its outage share)"),
)}

Labels = tuple[str, ...]
Sample = tuple[str, Labels, float]
"""``(metric name, label values in the schema's order, value)``."""


# -- events -> counters ----------------------------------------------------------------
def _retry_scheduled(e: Any) -> Iterable[Sample]:
    return (("stormguard_retries", (e.policy,), 1),)


def _retry_gave_up(e: Any) -> Iterable[Sample]:
    return (("stormguard_retry_gave_up", (e.policy, e.reason), 1),)


def _budget(e: Any) -> Iterable[Sample]:
    return (("stormguard_retry_budget_exhausted", (e.policy,), 1),)


def _state_changed(e: Any) -> Iterable[Sample]:
    return (("stormguard_breaker_transitions", (e.policy, e.old, e.new), 1),)


def _bulkhead(e: Any) -> Iterable[Sample]:
    return (("stormguard_bulkhead_rejected", (e.policy,), 1),)


def _timed_out(e: Any) -> Iterable[Sample]:
    return (("stormguard_timeouts", (e.policy, "total" if e.total else "attempt"), 1),)


def _fallback(e: Any) -> Iterable[Sample]:
    return (("stormguard_fallbacks", (e.policy,), 1),)


def _limit_changed(e: Any) -> Iterable[Sample]:
    return (("stormguard_limit_changes", (e.policy,), 1),)


def _throttled(e: Any) -> Iterable[Sample]:
    return (("stormguard_throttled", (e.policy,), 1),)


EVENT_METRICS: dict[type[Event], Callable[[Any], Iterable[Sample]]] = {
    RetryScheduled: _retry_scheduled,
    RetryGaveUp: _retry_gave_up,
    BudgetExhausted: _budget,
    StateChanged: _state_changed,
    BulkheadRejected: _bulkhead,
    TimedOut: _timed_out,
    FallbackUsed: _fallback,
    LimitChanged: _limit_changed,
    CallThrottled: _throttled,
    # read from the components themselves: a breaker's rejections
    # (stormguard_breaker_calls), a shedder's sheds (stormguard_shed, by tier)
    CallRejected: lambda e: (),
    RequestShed: lambda e: (),
}
"""Event class -> the counter increments it makes. Adding a component's event is one entry
(its subclasses are looked up through the class's MRO, once per class: add entries before
the first event of that class is emitted, i.e. at import time)."""

_lock = threading.Lock()
_counters: dict[str, dict[Labels, float]] = {}
_state = {"enabled": False}


_resolved: dict[type[Any], Callable[[Any], Iterable[Sample]] | None] = {}


def _resolve(cls: type[Any]) -> Callable[[Any], Iterable[Sample]] | None:
    fn = next((EVENT_METRICS[c] for c in cls.__mro__ if c in EVENT_METRICS), None)
    _resolved[cls] = fn
    return fn


def _listener(event: Event) -> None:
    # on every event of the process once enabled: one dict lookup by type, one lock
    cls = type(event)
    fn = _resolved[cls] if cls in _resolved else _resolve(cls)
    if fn is None:
        return
    with _lock:
        for metric, labels, amount in fn(event):
            series = _counters.get(metric)
            if series is None:
                series = _counters[metric] = {}
            if labels in series:
                series[labels] += amount
            elif len(series) < MAX_SERIES:
                series[labels] = amount


# -- tracked components -> gauges (and counters they keep themselves) -----------------
_tracked: dict[str, weakref.WeakSet[Any]] = {}
_tracked_lock = threading.Lock()


def track(obj: Any, kind: str) -> None:
    """Report ``obj`` (a component with a ``name``) under ``kind`` ("breaker",
    "bulkhead", "limiter", "store", or a kind of :data:`STATS_METRICS`) while it lives.

    Components call it when they are built, whether or not metrics are enabled; it holds
    a weak reference only."""
    with _tracked_lock:
        _tracked.setdefault(kind, weakref.WeakSet()).add(obj)
    if _state["enabled"]:
        hook = getattr(obj, "_enable_metrics", None)
        if hook is not None:
            hook()


def tracked(kind: str) -> list[Any]:
    """The live components of ``kind`` (sorted by name, for stable output)."""
    with _tracked_lock:
        objs = list(_tracked.get(kind, ()))
    return sorted(objs, key=lambda o: str(getattr(o, "name", "")))


def enabled() -> bool:
    """True once an exporter is enabled (components then keep their counters)."""
    return _state["enabled"]


def enable() -> None:
    """Start counting: install the event listener (once) and tell every tracked component
    that keeps counters only when asked (the limiters) to start. Idempotent."""
    with _lock:
        if _state["enabled"]:
            return
        _state["enabled"] = True
    add_listener(_listener)
    with _tracked_lock:
        objs = [o for s in _tracked.values() for o in s]
    for obj in objs:
        hook = getattr(obj, "_enable_metrics", None)
        if hook is not None:
            hook()


def _states(prefix: Labels, current: str) -> Iterator[tuple[Labels, float]]:
    for s in BREAKER_STATES:
        yield (*prefix, s), 1.0 if s == current else 0.0


def _read_breaker(b: Any) -> Iterator[Sample]:
    for labels, v in _states((b.name,), b.state):
        yield "stormguard_breaker_state", labels, v
    ok, failed, rejected = b.machine.outcomes()
    yield "stormguard_breaker_calls", (b.name, "success"), ok
    yield "stormguard_breaker_calls", (b.name, "failure"), failed
    yield "stormguard_breaker_calls", (b.name, "rejected"), rejected


def _read_bulkhead(b: Any) -> Iterator[Sample]:
    yield "stormguard_bulkhead_in_flight", (b.name,), b.in_flight
    yield "stormguard_bulkhead_waiting", (b.name,), b.waiting
    yield "stormguard_bulkhead_capacity", (b.name,), b.max_concurrent


def _read_limiter(lim: Any) -> Iterator[Sample]:
    for (rule, result), n in lim.decision_counts().items():
        yield "stormguard_limiter_decisions", (lim.name, rule, result), n
    if lim.top is not None:
        yield "stormguard_limiter_top_keys", (lim.name,), len(lim.top)
    errors = lim.store_errors
    if errors:
        yield "stormguard_store_errors", (lim.store_name,), errors


def _read_store(store: Any) -> Iterator[Sample]:
    trips = getattr(store, "round_trips", None)  # a network store's; the service client has none
    if isinstance(trips, int):
        yield "stormguard_store_round_trips", (store.name,), trips
    for b in store.breaker_machines():
        for labels, v in _states((store.name, b.name), b.state):
            yield "stormguard_store_breaker_state", labels, v


def _read_shedder(obj: Any) -> Iterator[Sample]:
    # a Shedder's stats() (a ConcurrencyLimit and the LoadShedding middleware each hold
    # one, registered on its own): scalars and "shed" by tier
    stats = obj.stats()
    name = (str(obj.name),)
    for key, metric in (("in_flight", "stormguard_concurrency_limit_in_flight"),
                        ("waiting", "stormguard_concurrency_limit_waiting"),
                        ("limit", "stormguard_adaptive_limit")):
        v = stats.get(key)
        if isinstance(v, int | float):
            yield metric, name, float(v)
    shed = stats.get("shed")
    if isinstance(shed, dict):
        for tier, n in sorted(shed.items()):
            yield "stormguard_shed", (*name, str(tier)), float(n)


READERS: dict[str, Callable[[Any], Iterable[Sample]]] = {
    "breaker": _read_breaker,
    "bulkhead": _read_bulkhead,
    "limiter": _read_limiter,
    "store": _read_store,
    "shedder": _read_shedder,
}
"""Component kind -> the samples read from one live component of that kind."""

STATS_METRICS: dict[str, dict[str, str]] = {
    "throttle": {"probability": "stormguard_throttle_probability"},
    "shaper": {"waiting": "stormguard_shaper_queue_depth",
               "waited": "stormguard_shaper_waits",
               "rejected": "stormguard_shaper_rejected"},
    "queue": {"pending": "stormguard_queue_pending",
              "in_flight": "stormguard_queue_in_flight",
              "dead": "stormguard_queue_dead"},
    "hybrid": {"syncs": "stormguard_hybrid_syncs",
               "keys_synced": "stormguard_hybrid_keys_synced",
               "local_decisions": "stormguard_hybrid_local_decisions",
               "degraded": "stormguard_hybrid_degraded"},
}
"""Kind -> {key of the component's ``stats()`` dict: metric name}: wiring a component that
offers ``stats()`` is one entry here (the metric in :data:`SCHEMA` with labels
``("name",)``) and ``track(self, kind)`` in its constructor. Numbers are read as they
are, booleans as 0 / 1."""


def _read_stats(kind: str, obj: Any) -> Iterator[Sample]:
    stats = obj.stats()
    for key, metric in STATS_METRICS[kind].items():
        value = stats.get(key)
        if isinstance(value, int | float):  # bool is an int: 0 / 1
            yield metric, (str(obj.name),), float(value)


Select = Callable[[str, Any], bool]
"""``select(kind, component)``: whether a live component is reported."""


def snapshot(select: Select | None = None) -> dict[str, dict[Labels, float]]:
    """Every metric's current series: ``{name: {label values: value}}`` (only metrics with
    at least one series appear). Both exporters read this. ``select`` keeps only some
    live components (the service reports its own limiter, not other apps')."""
    with _lock:
        out = {m: dict(series) for m, series in _counters.items()}
    kinds = set(READERS) | set(STATS_METRICS)
    for kind in sorted(kinds):
        for obj in tracked(kind):
            if select is not None and not select(kind, obj):
                continue
            try:  # one component failing to answer (a queue's store down) hides only itself
                samples = list(READERS[kind](obj) if kind in READERS
                               else _read_stats(kind, obj))
            except Exception:
                _log.warning("stormguard metrics: reading %s %r failed", kind,
                             getattr(obj, "name", obj), exc_info=True)
                continue
            for metric, labels, value in samples:
                series = out.setdefault(metric, {})
                if labels in series:
                    # two live components of one name: their figures add up
                    series[labels] += value
                elif len(series) < MAX_SERIES:
                    series[labels] = float(value)
    return out
