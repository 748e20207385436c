"""The policy registry: scenario entries -> the real stormguard policies.

A step's ``policies`` is a list, outermost first, of one-key mappings
(``{"retry": {"attempts": 4}}``). Each key names a builder in :data:`POLICIES`; a
builder gets the options, a :class:`BuildContext` (the simulation's clock, a seeded
random source, the listener that records breaker transitions, the instance number and
a per-instance store of shared objects such as a ``RetryBudget``) and answers a
:class:`stormguard.resilience._base.Policy`. New policies (an outbound shaper, load
shedding, a rate limit) plug in with :func:`register_policy` without touching the
model; their options are validated by the builder (errors name the field).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stormguard._core import validate
from stormguard._core.errors import ConfigError
from stormguard.observability.events import Listener
from stormguard.overload.limit import AdaptiveLimit
from stormguard.resilience import (
    AdaptiveThrottle,
    Bulkhead,
    CircuitBreaker,
    ConcurrencyLimit,
    Fallback,
    Retry,
    RetryBudget,
    Timeout,
)
from stormguard.resilience._base import Policy
from stormguard.sim.runtime import SimClock

__all__ = ["FALLBACK", "POLICIES", "BuildContext", "PolicyBuilder", "build_policies",
           "register_policy"]


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


#: What a simulated ``Fallback`` answers: the request counts as served degraded.
FALLBACK = _Marker("fallback")


@dataclass
class BuildContext:
    clock: SimClock
    rng: random.Random
    listener: Listener
    instance: int
    shared: dict[tuple[str, ...], Any] = field(default_factory=dict)
    #: the scenario's deferred queues by name (``DeferredQueue``), for ``defer``
    queues: dict[str, Any] = field(default_factory=dict)
    #: listeners given to every ``defer`` fallback (the model counts deferrals)
    defer_listeners: tuple[Listener, ...] = ()


PolicyBuilder = Callable[[dict[str, Any], BuildContext, str, str], Policy]
"""``builder(options, ctx, field, dependency)``; ``field`` prefixes error messages."""

POLICIES: dict[str, PolicyBuilder] = {}


def register_policy(name: str) -> Callable[[PolicyBuilder], PolicyBuilder]:
    """Register a builder under ``name`` (a scenario's policy key)."""
    def deco(builder: PolicyBuilder) -> PolicyBuilder:
        POLICIES[name] = builder
        return builder
    return deco


def _options(value: object, where: str, allowed: dict[str, str]) -> dict[str, Any]:
    """Options as a dict, unknown names refused, durations parsed (``kind`` per name)."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ConfigError(where, value, "must be a mapping of options")
    out: dict[str, Any] = {}
    for key, v in value.items():
        kind = allowed.get(key)
        if kind is None:
            raise ConfigError(f"{where}.{key}", v, f"unknown option (known: {', '.join(allowed)})")
        f = f"{where}.{key}"
        if kind == "duration":
            out[key] = validate.duration(f, v)
        elif kind == "duration0":
            out[key] = validate.duration(f, v, allow_zero=True)
        elif kind == "number":
            out[key] = validate.number(f, v, allow_zero=True)
        elif kind == "int":
            out[key] = validate.integer(f, v)
        else:
            out[key] = v
    return out


def _build(where: str, make: Callable[[], Policy]) -> Policy:
    try:
        return make()
    except ConfigError as exc:
        raise ConfigError(f"{where}.{exc.field}", exc.value, exc.problem) from None


def _build_value(where: str, make: Callable[[], AdaptiveLimit]) -> AdaptiveLimit:
    try:
        return make()
    except ConfigError as exc:
        raise ConfigError(f"{where}.{exc.field}", exc.value, exc.problem) from None


@register_policy("timeout")
def _timeout(opts: Any, ctx: BuildContext, where: str, dep: str) -> Policy:
    if not isinstance(opts, dict):
        seconds = validate.duration(where, opts)
        return Timeout(seconds, clock=ctx.clock, name=f"{dep}.timeout")
    o = _options(opts, where, {"seconds": "duration", "total": "duration"})
    return _build(where, lambda: Timeout(o.get("seconds"), total=o.get("total"),
                                         clock=ctx.clock, name=f"{dep}.timeout"))


@register_policy("retry")
def _retry(opts: Any, ctx: BuildContext, where: str, dep: str) -> Policy:
    o = _options(opts, where, {"attempts": "int", "base": "duration0",
                               "multiplier": "number", "max_delay": "duration0",
                               "jitter": "any", "budget": "any"})
    budget = None
    if "budget" in o:
        b = _options(o.pop("budget"), f"{where}.budget",
                     {"ratio": "number", "min_per_second": "number", "window": "duration"})
        key = ("budget", dep)  # one budget per instance and dependency, shared by its retries
        budget = ctx.shared.get(key)
        if budget is None:
            budget = ctx.shared[key] = RetryBudget(**b, clock=ctx.clock)
    return _build(where, lambda: Retry(**o, budget=budget, rng=random.Random(ctx.rng.random()),
                                       clock=ctx.clock, name=f"{dep}.retry"))


@register_policy("circuit_breaker")
def _breaker(opts: Any, ctx: BuildContext, where: str, dep: str) -> Policy:
    o = _options(opts, where, {"window": "any", "failure_rate": "number",
                               "min_calls": "int", "open_for": "duration",
                               "half_open_calls": "int", "slow_call_duration": "duration",
                               "slow_call_rate": "number", "window_type": "any"})
    return _build(where, lambda: CircuitBreaker(**o, name=dep, clock=ctx.clock,
                                                listeners=(ctx.listener,)))


@register_policy("bulkhead")
def _bulkhead(opts: Any, ctx: BuildContext, where: str, dep: str) -> Policy:
    o = _options(opts, where, {"max_concurrent": "int", "max_wait": "duration0"})
    if o.get("max_wait", 0.0) != 0.0:
        # a waiting blocking Bulkhead polls a non-system clock in real time slices: in
        # virtual time it would wait in real time. A full bulkhead rejects at once here.
        raise ConfigError(f"{where}.max_wait", o["max_wait"],
                          "the simulator runs bulkheads that reject at once: must be 0")
    return _build(where, lambda: Bulkhead(**o, clock=ctx.clock, name=f"{dep}.bulkhead"))


@register_policy("concurrency_limit")
def _concurrency(opts: Any, ctx: BuildContext, where: str, dep: str) -> Policy:
    o = _options(opts, where, {"limit": "int", "adaptive": "any", "max_wait": "duration0",
                               "retry_after": "duration0"})
    if o.get("max_wait", 0.0) != 0.0:
        raise ConfigError(f"{where}.max_wait", o["max_wait"],
                          "the simulator runs limits that reject at once: must be 0")
    if "limit" in o and "adaptive" in o:
        raise ConfigError(f"{where}.adaptive", opts["adaptive"],
                          "give either limit (fixed) or adaptive, not both")
    limit: AdaptiveLimit | int | None = o.pop("limit", None)
    if "adaptive" in o:
        a = _options(o.pop("adaptive"), f"{where}.adaptive",
                     {"initial": "int", "min": "int", "max": "int", "tolerance": "number",
                      "window": "duration", "min_samples": "int"})
        limit = _build_value(f"{where}.adaptive", lambda: AdaptiveLimit(**a))
    return _build(where, lambda: ConcurrencyLimit(limit, **o, clock=ctx.clock,
                                                  name=f"{dep}.concurrency"))


@register_policy("adaptive_throttle")
def _throttle(opts: Any, ctx: BuildContext, where: str, dep: str) -> Policy:
    o = _options(opts, where, {"k": "number", "window": "duration"})
    return _build(where, lambda: AdaptiveThrottle(**o, rng=random.Random(ctx.rng.random()),
                                                  clock=ctx.clock, name=f"{dep}.throttle"))


@register_policy("shaper")
def _shaper(opts: Any, ctx: BuildContext, where: str, dep: str) -> Policy:
    """A leaky-bucket shaper per instance (in process: the pace of one instance's calls)."""
    from stormguard.resilience.shaper import Shaper

    o = _options(opts, where, {"rate": "number", "per": "duration", "max_wait": "duration0",
                               "burst": "int", "max_queue": "int"})
    if "rate" not in o:
        raise ConfigError(f"{where}.rate", None, "is required: calls per `per` (default 1 s)")
    rate = o.pop("rate")
    return _build(where, lambda: Shaper(rate, **o, clock=ctx.clock, name=f"{dep}.shaper"))


@register_policy("defer")
def _defer(opts: Any, ctx: BuildContext, where: str, dep: str) -> Policy:
    """The queue's fallback: a failed call is deferred to the scenario queue named
    ``queue`` (its worker calls the dependency later) and the request is served degraded."""
    o = _options(opts, where, {"queue": "any"})
    name = o.get("queue")
    if name is None:
        raise ConfigError(f"{where}.queue", None, "is required: the name of a queue under "
                          "`queues`")
    queue = ctx.queues.get(name) if isinstance(name, str) else None
    if queue is None:
        known = ", ".join(ctx.queues) or "none"
        raise ConfigError(f"{where}.queue", name, f"no such queue (known: {known})")
    return _build(where, lambda: queue.fallback(name, name=f"{dep}.defer",
                                                listeners=ctx.defer_listeners))


@register_policy("fallback")
def _fallback(opts: Any, ctx: BuildContext, where: str, dep: str) -> Policy:
    _options(opts, where, {"value": "any"})  # the answer itself is irrelevant to capacity
    return Fallback(lambda _cause: FALLBACK, clock=ctx.clock, name=f"{dep}.fallback")


def build_policies(entries: list[Any], ctx: BuildContext, where: str,
                   dependency: str) -> list[Policy]:
    """The policies of one step, outermost first."""
    if not isinstance(entries, list):
        raise ConfigError(where, entries, "must be a list of policies, outermost first")
    out: list[Policy] = []
    for i, entry in enumerate(entries):
        f = f"{where}[{i}]"
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ConfigError(f, entry, "must be a mapping with one policy name, such as "
                              "{'timeout': '1s'}")
        (kind, opts), = entry.items()
        builder = POLICIES.get(kind)
        if builder is None:
            raise ConfigError(f, kind, f"unknown policy (known: {', '.join(sorted(POLICIES))})")
        out.append(builder(opts, ctx, f"{f}.{kind}", dependency))
    return out
