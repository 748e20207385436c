"""The capacity model: services with thread pools, dependencies, traffic and clients.

A :class:`~stormguard.sim.scenario.Scenario` (validated, durations in seconds) becomes
a running model on one :class:`~stormguard.sim.Engine`:

* **traffic**: an arrival process (constant or Poisson, its rate a schedule with
  steps, ramps and spikes) sends requests to ``service.endpoint`` through zero or more
  **client layers** (the mobile app, a gateway), each a real ``Pipeline`` of
  ``Timeout(total=)`` and ``Retry`` around a remote call to the next hop;
* a **service** has ``instances`` (round robin), each a pool of ``threads`` with a
  FIFO queue; a request holds one thread from the moment it gets one until its last
  step ends, which is what Little's law counts;
* an **endpoint** is a list of steps: ``work`` (the thread is busy for that long) or
  ``call`` of a dependency through that instance's real policies (``Fallback``,
  ``CircuitBreaker``, ``Retry`` with a shared ``RetryBudget``, ``Bulkhead``,
  ``Timeout``...), built from the scenario by the policy registry
  (:data:`stormguard.sim.policies.POLICIES`);
* a **dependency** answers after a latency drawn from its distribution, fails with
  its error rate, and serves at most ``capacity`` calls per second: beyond that, calls
  wait their turn (an overloaded provider gets slower), a call abandoned by its
  caller still takes its turn (the provider does not know), and with ``queue_limit``
  a full queue answers 503 at once. Latency, error rate and capacity change at the
  times given in ``changes``;
* the **front door** (:mod:`stormguard.sim.inbound`, imported only by the scenarios
  that use it): a service's rate limits (429) and load shedder (503, by tier) at each
  instance's entry, traffic key populations, and deferred queues drained by a worker.
  A request's final outcome is one of :data:`OUTCOMES`.

Calls honour the deadline in force the way a well-behaved client library does (the
httpx transport of stormguard clips its timeouts to it): a call stops waiting when
the deadline passes and raises ``TimeoutError``, which ``Timeout`` turns into
``DeadlineExceeded``. ``work`` steps are CPU: they are never interrupted.
"""

from __future__ import annotations

import bisect
import contextvars
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, Any

from stormguard._core.deadline import _current
from stormguard._core.errors import TransientError
from stormguard.observability.events import Event, StateChanged
from stormguard.resilience import Retry, Timeout
from stormguard.resilience._base import Policy
from stormguard.resilience.pipeline.blocking import chain
from stormguard.sim.engine import Engine
from stormguard.sim.policies import FALLBACK, BuildContext, build_policies
from stormguard.sim.runtime import (
    Gauge,
    Pool,
    PoolFull,
    Series,
    SimClock,
    Waiter,
    new_engine,
    start,
)
from stormguard.sim.scenario import Scenario

if TYPE_CHECKING:  # the inbound side is imported only by the scenarios that use it
    from stormguard.integrations.shedding import Priorities
    from stormguard.ratelimit.rules import RequestAttrs
    from stormguard.sim.inbound import Gate, QueueRun

__all__ = ["OUTCOMES", "DependencyDown", "Limited", "Overloaded", "Result", "ServiceUnavailable",
           "run"]

#: the request's key attributes, carried from a client task to the server's
_ATTRS: contextvars.ContextVar[RequestAttrs] = contextvars.ContextVar("stormguard_sim_attrs")


class DependencyDown(TransientError):
    """A simulated dependency answered with an error (a 503)."""


class ServiceUnavailable(TransientError):
    """A simulated service answered with an error (its request failed or was refused)."""


class Limited(TransientError):
    """A simulated service answered 429 (a rate limit denied the request)."""


class Overloaded(TransientError):
    """A simulated service answered 503 because its load shedder shed the request."""


# -- latency distributions -------------------------------------------------------------
def sampler(spec: dict[str, Any], rng: random.Random) -> Callable[[], float]:
    """A function drawing one latency (seconds) from a normalized distribution spec."""
    dist = spec["dist"]
    if dist == "constant":
        value = float(spec["value"])
        return lambda: value
    if dist == "exponential":
        rate = 1.0 / float(spec["mean"])
        return lambda: rng.expovariate(rate)
    if dist == "uniform":
        lo, hi = float(spec["low"]), float(spec["high"])
        return lambda: rng.uniform(lo, hi)
    # lognormal from its median and p99: mu = ln(median), sigma = ln(p99/median) / z99
    mu = math.log(float(spec["median"]))
    sigma = math.log(float(spec["p99"]) / float(spec["median"])) / 2.3263478740408408
    return lambda: rng.lognormvariate(mu, sigma)


def mean_of(spec: dict[str, Any]) -> float:
    dist = spec["dist"]
    if dist == "constant":
        return float(spec["value"])
    if dist == "exponential":
        return float(spec["mean"])
    if dist == "uniform":
        return (float(spec["low"]) + float(spec["high"])) / 2
    sigma = math.log(float(spec["p99"]) / float(spec["median"])) / 2.3263478740408408
    return float(spec["median"]) * math.exp(sigma * sigma / 2)


# -- dependencies ----------------------------------------------------------------------
class Dependency:
    """A provider with time-varying latency, error rate and capacity (calls/s, FIFO)."""

    __slots__ = ("_at", "_capacity", "_clock", "_errors", "_fixed", "_inv_res", "_lane", "_last",
                 "_latency", "_next_free", "_rng", "_rows", "_single", "name")

    def __init__(self, name: str, spec: dict[str, Any], clock: SimClock, rng: random.Random,
                 series: Series) -> None:
        self.name = name
        self._clock = clock
        self._rng = rng
        phases = [(0.0, spec)]
        base = dict(spec)
        for change in spec.get("changes", []):
            base = {**base, **{k: v for k, v in change.items() if k != "at"}}
            phases.append((float(change["at"]), base))
        self._at = [t for t, _ in phases]
        self._single = len(phases) == 1
        self._latency = [sampler(p["latency"], rng) for _, p in phases]
        # a constant latency, read without calling its sampler (which draws nothing)
        self._fixed = [float(p["latency"]["value"]) if p["latency"]["dist"] == "constant"
                       else None for _, p in phases]
        self._errors = [float(p.get("error_rate", 0.0)) for _, p in phases]
        self._capacity = [p.get("capacity") for _, p in phases]
        self._next_free = 0.0
        # the count rows, looked up once: calls, answered, failed, abandoned by the caller
        self._rows = tuple(series.row(f"{tag}") for tag in (
            f"calls:{name}", f"dep:{name}:ok", f"dep:{name}:error", f"dep:{name}:timeout"))
        self._inv_res = 1.0 / series.resolution
        self._last = series.buckets - 1
        # the answers' wake-ups, in time order as long as the latency is constant
        assert clock.engine is not None
        self._lane = clock.engine._lane()

    def call(self, _fn: object = None, _args: object = None, _kwargs: object = None) -> str:
        """One call from a simulated task: waits its answer or the deadline in force.

        (The arguments are ignored: so the method is also the innermost layer of a
        policy chain, ``(fn, args, kwargs)``, without a wrapper's call.)"""
        clock = self._clock
        now = clock._mono0 + clock._elapsed  # clock.monotonic(), inlined (once per call)
        inv_res, last = self._inv_res, self._last
        b = int(now * inv_res)
        calls, ok, err, abandoned = self._rows
        calls[b if b < last else last] += 1
        i = 0 if self._single else bisect.bisect_right(self._at, now) - 1
        capacity = self._capacity[i]
        start = now
        if capacity is not None:
            # one turn every 1/capacity s: a queue that lengthens when arrivals exceed it
            start = self._next_free if self._next_free > now else now
            self._next_free = start + 1.0 / float(capacity)
        fixed = self._fixed[i]
        answer_at = start + (self._latency[i]() if fixed is None else fixed)
        rate = self._errors[i]
        failed = rate > 0.0 and self._rng.random() < rate
        d = _current.get()
        if d is not None and d.at < answer_at:
            clock.sleep(d.at - now if d.at > now else 0.0)
            b = int(clock.monotonic() * inv_res)
            abandoned[b if b < last else last] += 1
            raise TimeoutError(f"{self.name}: no answer before the deadline")
        clock._sleep_in(self._lane, answer_at - now)
        b = int((clock._mono0 + clock._elapsed) * inv_res)
        b = b if b < last else last
        if failed:
            err[b] += 1
            raise DependencyDown(f"{self.name}: 503")
        ok[b] += 1
        return "ok"


# -- services --------------------------------------------------------------------------
#: one step of an endpoint, ready to run: ``partial(clock.sleep, work)`` or a dependency
#: call under its policies; a step answering FALLBACK served the request degraded
_Step = Callable[[], object]


class Instance:
    """One service instance: its thread pool, its endpoints' steps (own policies) and, when
    the service has rate limits or load shedding, its entry :class:`~.inbound.Gate`."""

    __slots__ = ("endpoints", "gate", "pool")

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.endpoints: dict[str, tuple[_Step, ...]] = {}
        self.gate: Gate | None = None


class Service:
    __slots__ = ("_next", "gauge", "instances", "name", "priorities", "queue_gauge", "threads")

    def __init__(self, name: str, threads: int | None, gauge: Gauge, queue_gauge: Gauge) -> None:
        self.name = name
        self.threads = threads
        self.instances: list[Instance] = []
        self.gauge = gauge
        self.queue_gauge = queue_gauge
        self.priorities: Priorities | None = None
        self._next = 0

    def pick(self) -> Instance:
        inst = self.instances[self._next]
        self._next = (self._next + 1) % len(self.instances)
        return inst


def _handle(inst: Instance, endpoint: str, clock: SimClock) -> str:
    """The server side of one request, in its own task: a thread, then the steps."""
    pool = inst.pool
    try:
        pool.acquire()
    except PoolFull as exc:
        raise ServiceUnavailable("503: queue full") from exc
    outcome = "success"
    try:
        for step in inst.endpoints[endpoint]:
            if step() is FALLBACK:
                outcome = "fallback"
    finally:
        pool.release()
    return outcome


# -- the run ---------------------------------------------------------------------------
OUTCOMES = ("success", "fallback", "error", "limited", "shed")
"""A request's final outcomes: ``limited`` is a 429 of a rate limit, ``shed`` a 503 of a
load shedder (``error`` is every other failure)."""


@dataclass
class Result:
    """What a run measured: counts and levels per bucket of virtual time."""

    scenario: Scenario
    resolution: float
    series: Series
    busy: dict[str, Gauge]
    queued: dict[str, Gauge]
    threads: dict[str, int | None]
    first_full_at: dict[str, float | None]
    transitions: list[tuple[float, str, str, str]] = field(default_factory=list)
    events: int = 0
    gates: dict[str, list[Gate]] = field(default_factory=dict)
    queues: dict[str, QueueRun] = field(default_factory=dict)
    tiers: dict[str, str] = field(default_factory=dict)  # traffic -> its endpoint's tier

    @property
    def duration(self) -> float:
        return self.scenario.duration

    def window(self) -> tuple[float, float]:
        m = self.scenario.measure
        return m[0], m[1]

    def busy_threads(self, service: str, start: float | None = None,
                     end: float | None = None) -> float:
        """Time-average busy threads of ``service`` (all instances) over the window."""
        lo, hi = self.window()
        return self.busy[service].mean(lo if start is None else start, hi if end is None else end)

    def calls_per_s(self, dependency: str, start: float | None = None,
                    end: float | None = None) -> float:
        lo, hi = self.window()
        return self.series.rate(f"calls:{dependency}", lo if start is None else start,
                                hi if end is None else end)

    def outcome_rates(self, traffic: str, start: float | None = None,
                      end: float | None = None) -> dict[str, float]:
        """Fractions of the requests that *arrived* in the window, by final outcome."""
        lo, hi = self.window()
        lo = lo if start is None else start
        hi = hi if end is None else end
        counts = {o: self.series.total(f"{traffic}:{o}", lo, hi) for o in OUTCOMES}
        total = sum(counts.values())
        return {o: (n / total if total else 0.0) for o, n in counts.items()}

    def limited_per_s(self, service: str, rule: str, start: float | None = None,
                      end: float | None = None) -> float:
        """Requests per second the rule ``rule`` of ``service`` denied (429s)."""
        lo, hi = self.window()
        return self.series.rate(f"limited:{service}:{rule}", lo if start is None else start,
                                hi if end is None else end)

    def admitted_per_s(self, traffic: str, start: float | None = None,
                       end: float | None = None) -> float:
        """Requests per second of ``traffic`` that passed the rate limits (every outcome
        but ``limited``), by arrival."""
        lo, hi = self.window()
        lo = lo if start is None else start
        hi = hi if end is None else end
        n = sum(self.series.total(f"{traffic}:{o}", lo, hi) for o in OUTCOMES if o != "limited")
        return n / (hi - lo) if hi > lo else 0.0

    def inbound_summary(self) -> dict[str, Any]:
        """Per gated service: 429s per rule, shed requests and shedder counters per tier."""
        lo, hi = self.window()
        out: dict[str, Any] = {}
        for name, gates in self.gates.items():
            entry: dict[str, Any] = {}
            rules = gates[0].rules
            if rules is not None:
                entry["limited_per_s"] = {r.name: round(self.limited_per_s(name, r.name), 3)
                                          for r in rules if not r.shadow}
                shadow = {r.name: round(self.series.rate(f"shadow:{name}:{r.name}", lo, hi), 3)
                          for r in rules if r.shadow}
                if shadow:  # dry-run rules: what they would have denied, per second
                    entry["shadow_denied_per_s"] = shadow
                entry["rate_limit_store"] = self.scenario.services[name]["rate_limit"]["store"]
                if entry["rate_limit_store"] == "hybrid":
                    from stormguard.stores.hybrid import HybridStore

                    trips = sum(g.limiter.store._b.round_trips for g in gates
                                if g.limiter is not None
                                and isinstance(g.limiter.store, HybridStore))
                    entry["backend_round_trips_per_s"] = round(trips / self.duration, 3)
            if gates[0].shedder is not None:
                tiers: dict[str, Any] = {}
                stats = [g.shedder.stats() for g in gates if g.shedder is not None]
                for t in ("critical", "degraded", "sheddable"):
                    admitted = sum(s["admitted"][t] for s in stats)
                    shed = sum(s["shed"][t] for s in stats)
                    tiers[t] = {"admitted": admitted, "shed": shed,
                                "shed_rate": round(shed / (admitted + shed), 4)
                                if admitted + shed else 0.0,
                                "shed_per_s": round(self.series.rate(f"shed:{name}:{t}", lo, hi),
                                                    3)}
                entry["shedding"] = {
                    "tiers": tiers, "limit_per_instance": [s["limit"] for s in stats],
                    "shed_codel": sum(s["shed_codel"] for s in stats),
                    "shed_queue_timeout": sum(s["shed_queue_timeout"] for s in stats)}
            out[name] = entry
        return out

    def tier_summary(self) -> dict[str, Any]:
        """Per tier (of the traffic sources' endpoints): outcome rates and mean response."""
        lo, hi = self.window()
        out: dict[str, Any] = {}
        for tier in ("critical", "degraded", "sheddable"):
            names = [t for t, tt in self.tiers.items() if tt == tier]
            if not names:
                continue
            counts = {o: sum(self.series.total(f"{n}:{o}", lo, hi) for n in names)
                      for o in OUTCOMES}
            total = sum(counts.values())
            lat = sum(self.series.total(f"{n}:latency_us", lo, hi) for n in names)
            out[tier] = {"traffic": names, "requests": total,
                         **{f"{o}_rate": round(c / total, 4) if total else 0.0
                            for o, c in counts.items()},
                         "mean_response_s": round(lat / 1e6 / total, 4) if total else None}
        return out

    def queue_depth(self, queue: str) -> list[int]:
        """Jobs of ``queue`` not done yet (pending or in flight) at the end of each bucket
        of virtual time."""
        return self.series.counts.get(f"queue:{queue}:pending", [])

    def queue_summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, q in self.queues.items():
            depth = self.queue_depth(name)
            deferred = self.series.total(f"queue:{name}:deferred")
            out[name] = {
                "deferred": deferred, "drained": q.worker.worker.completed,
                "worker_attempts": self.series.total(f"queue:{name}:taken"),
                "failed_attempts": q.worker.worker.failures,
                "pending_at_end": q.stats.get("pending", 0),
                "in_flight_at_end": q.stats.get("in_flight", 0),
                "dead": q.stats.get("dead", 0),
                "lost": deferred - q.worker.worker.completed - sum(q.stats.values()),
                "peak_pending": max(depth, default=0),
                "drained_at_s": _drained_at(depth, self.resolution, deferred),
                "pending_by_bucket": depth}
        return out

    def opened_at(self, policy: str | None = None) -> float | None:
        """Virtual time of the first transition to ``open`` (of the policy named)."""
        for at, name, _old, new in self.transitions:
            if new == "open" and (policy is None or name.split("#")[0] == policy):
                return at
        return None

    def summary(self) -> dict[str, Any]:
        """The figures as one JSON-ready object."""
        lo, hi = self.window()
        out: dict[str, Any] = {"scenario": self.scenario.name, "duration_s": self.duration,
                               "window_s": [lo, hi], "events": self.events}
        out["services"] = {
            name: {"threads_available": self.threads[name],
                   "busy_threads_mean": round(self.busy_threads(name), 3),
                   "busy_threads_peak": max(self.busy[name].peak, default=0),
                   "queued_mean": round(self.queued[name].mean(lo, hi), 3),
                   "all_threads_busy_at_s": self.first_full_at[name]}
            for name in self.busy}
        out["dependencies"] = {
            name: {"calls_per_s": round(self.calls_per_s(name), 3),
                   "errors_per_s": round(self.series.rate(f"dep:{name}:error", lo, hi), 3),
                   "abandoned_per_s": round(self.series.rate(f"dep:{name}:timeout", lo, hi), 3)}
            for name in self.scenario.dependencies}
        out["traffic"] = {}
        for t in self.scenario.traffic:
            name = t["name"]
            rates = self.outcome_rates(name)
            n = sum(self.series.total(f"{name}:{o}", lo, hi) for o in OUTCOMES)
            out["traffic"][name] = {
                "arrivals_per_s": round(self.series.rate(f"{name}:arrivals", lo, hi), 3),
                **{f"{o}_rate": round(r, 4) for o, r in rates.items()},
                "mean_response_s": round(
                    self.series.total(f"{name}:latency_us", lo, hi) / 1e6 / n, 4) if n else None}
            if name in self.tiers:
                out["traffic"][name]["tier"] = self.tiers[name]
        if self.gates:
            out["inbound"] = self.inbound_summary()
        if self.tiers:
            out["tiers"] = self.tier_summary()
        if self.queues:
            out["queues"] = self.queue_summary()
        out["breaker_transitions"] = [
            {"at_s": round(at, 3), "policy": name, "from": old, "to": new}
            for at, name, old, new in self.transitions[:50]]
        return out


class _Rate:
    """A piecewise-linear rate schedule: steps, ramps and spikes."""

    def __init__(self, spec: Any) -> None:
        points: list[tuple[float, float]] = []
        if isinstance(spec, int | float):
            points = [(0.0, float(spec))]
        else:
            rate = 0.0
            for entry in spec:
                at, new = float(entry["at"]), float(entry["rate"])
                ramp, hold = entry.get("ramp"), entry.get("for")
                points.append((at, rate))
                if ramp:
                    points.append((at + float(ramp), new))
                else:
                    points.append((at, new))
                if hold:
                    end = at + (float(ramp) if ramp else 0.0) + float(hold)
                    points.append((end, new))
                    points.append((end, rate))
                else:
                    rate = new
            if not points or points[0][0] > 0:
                points.insert(0, (0.0, 0.0))
        self.points = points
        self.times = [t for t, _ in points]
        self.peak = max((r for _, r in points), default=0.0)

    def __call__(self, t: float) -> float:
        pts = self.points
        i = bisect.bisect_right(self.times, t) - 1
        if i < 0:
            return pts[0][1]
        t0, r0 = pts[i]
        if i + 1 < len(pts):
            t1, r1 = pts[i + 1]
            if t1 > t0 and r1 != r0:
                return r0 + (r1 - r0) * (t - t0) / (t1 - t0)
        return r0

    def advance(self, t: float, need: float = 1.0) -> float | None:
        """The time after ``t`` at which the rate's integral has grown by ``need`` (the
        next arrival of the constant process), or None if it never does."""
        pts = self.points
        i = bisect.bisect_right(self.times, t) - 1
        while i + 1 < len(pts):
            t1, r1 = pts[i + 1]
            if t1 > t:
                r = self(t)
                slope = (r1 - r) / (t1 - t)
                area = (r + r1) / 2 * (t1 - t)
                if need <= area:
                    if abs(slope) < 1e-12:
                        return t + need / r
                    # r dt + slope dt^2 / 2 = need
                    return t + (math.sqrt(r * r + 2 * slope * need) - r) / slope
                need -= area
                t = t1
            i += 1
        last = pts[-1][1]
        return t + need / last if last > 0 else None


def _inbound_side(scenario: Scenario) -> ModuleType | None:
    """:mod:`stormguard.sim.inbound` if the scenario has rate limits, load shedding, keys
    or queues (only such scenarios pay for its import and its code paths), else None."""
    if scenario.queues or any("rate_limit" in s or "load_shedding" in s
                              for s in scenario.services.values()) \
            or any("keys" in t for t in scenario.traffic):
        from stormguard.sim import inbound

        return inbound
    return None


def run(scenario: Scenario, *, resolution: float = 1.0) -> Result:
    """Run ``scenario`` to its ``duration`` in virtual time and return what it measured."""
    eng, clock = new_engine()
    buckets = math.ceil(scenario.duration / resolution) + 1
    series = Series(clock, buckets, resolution)
    master = random.Random(scenario.seed)
    transitions: list[tuple[float, str, str, str]] = []

    def listener(instance: int) -> Callable[[Event], None]:
        def on_event(event: Event) -> None:
            if isinstance(event, StateChanged):
                transitions.append((event.at, f"{event.policy}#{instance}", event.old,
                                    event.new))
        return on_event

    deps = {name: Dependency(name, spec, clock, random.Random(master.random()), series)
            for name, spec in scenario.dependencies.items()}
    inbound = _inbound_side(scenario)
    queues: dict[str, QueueRun] = {} if inbound is None else inbound.start_queues(
        eng, clock, scenario, deps, series, master, listener)
    defer_listeners = () if inbound is None else inbound.defer_counter(queues, series)
    services: dict[str, Service] = {}
    gates: dict[str, list[Gate]] = {}
    work_lanes: dict[float, Any] = {}
    for sname, sspec in scenario.services.items():
        gauge, qgauge = Gauge(clock, buckets, resolution), Gauge(clock, buckets, resolution)
        svc = Service(sname, sspec["threads"], gauge, qgauge)
        make_gate = None if inbound is None else inbound.gates(eng, clock, series, sname, sspec)
        if inbound is not None and "load_shedding" in sspec:
            svc.priorities = inbound.build_priorities(f"services.{sname}.load_shedding",
                                                      sspec["load_shedding"])
        for i in range(sspec["instances"]):
            inst = Instance(Pool(eng, clock, sspec["threads"], sspec.get("queue_limit"),
                                 gauge, qgauge))
            if make_gate is not None:
                inst.gate = make_gate(i)
                gates.setdefault(sname, []).append(inst.gate)
            ctx = BuildContext(clock=clock, rng=random.Random(master.random()),
                               listener=listener(i), instance=i,
                               queues={n: q.queue for n, q in queues.items()},
                               defer_listeners=defer_listeners)
            for ename, espec in sspec["endpoints"].items():
                steps: list[_Step] = []
                for k, step in enumerate(espec["steps"]):
                    if "work" in step:
                        steps.append(_work(eng, clock, work_lanes, float(step["work"])))
                        continue
                    dep = deps[step["call"]]
                    where = f"services.{sname}.endpoints.{ename}.steps[{k}].policies"
                    policies = build_policies(step.get("policies", []), ctx, where,
                                              dependency=step["call"])
                    wrapped = _wrap(policies, dep.call, dep.call)
                    if inbound is not None and queues:
                        wrapped = inbound.deferring(wrapped, policies)
                    steps.append(wrapped)
                inst.endpoints[ename] = tuple(steps)
            svc.instances.append(inst)
        services[sname] = svc

    started = {t["name"]: _start_traffic(eng, clock, t, services, series,
                                         random.Random(master.random()), scenario.duration,
                                         scenario) for t in scenario.traffic}
    tiers = {name: tier for name, tier in started.items() if tier is not None}
    for q in queues.values():  # the workers start after the traffic (their first events)
        q.worker.start()
    eng.run(until=scenario.duration)
    clock.stop_tasks()  # requests still in flight end here (their memory with them)
    for q in queues.values():
        q.finish()
    for svc in services.values():
        svc.gauge.close(eng.now)
        svc.queue_gauge.close(eng.now)
    return Result(gates=gates, queues=queues, tiers=tiers,
        scenario=scenario, resolution=resolution, series=series,
        busy={n: s.gauge for n, s in services.items()},
        queued={n: s.queue_gauge for n, s in services.items()},
        threads={n: (None if s.threads is None else s.threads * len(s.instances))
                 for n, s in services.items()},
        first_full_at={n: _all_full(s) for n, s in services.items()},
        transitions=transitions, events=eng.events_run)


def _work(eng: Engine, clock: SimClock, lanes: dict[float, Any], seconds: float) -> _Step:
    """A ``work`` step: the thread busy ``seconds`` (one FIFO lane of the engine per length
    of work: their wake-ups come in time order)."""
    lane = lanes.get(seconds)
    if lane is None:
        lane = lanes[seconds] = eng._lane()
    return partial(clock._sleep_in, lane, seconds)


def _drained_at(depth: list[int], resolution: float, deferred: int) -> float | None:
    """The end of the last bucket with jobs pending (None: nothing deferred, or some
    still pending at the end)."""
    if not deferred or not depth or depth[-1] > 0:
        return None
    last = max((i for i, n in enumerate(depth) if n > 0), default=-1)
    return (last + 1) * resolution


def _all_full(svc: Service) -> float | None:
    times = [inst.pool.first_full_at for inst in svc.instances]
    if any(t is None for t in times):
        return None
    return max(t for t in times if t is not None)


def _wrap(policies: list[Policy], fn: Callable[[], Any],
          layer: Callable[[Any, Any, Any], Any] | None = None) -> Callable[[], Any]:
    """``fn`` under ``policies``: the chain ``Pipeline(*policies).call(fn)`` runs (the
    same ``resilience.pipeline.blocking.chain`` of the policies' ``_sync`` flows), built
    once with ``fn`` innermost, without ``Pipeline.call``'s argument packing per call.
    ``layer``: ``fn`` itself as the innermost layer (it takes and ignores ``(fn, args,
    kwargs)``: one call fewer than a wrapper)."""
    if not policies:
        return fn
    chained = chain(policies, (lambda _fn, _args, _kwargs: fn()) if layer is None else layer)
    return partial(chained, fn, (), {})


def _start_traffic(  # noqa: PLR0915 -- the closures of one traffic source, together
        eng: Engine, clock: SimClock, spec: dict[str, Any],
                   services: dict[str, Service], series: Series, rng: random.Random,
                   duration: float, scenario: Scenario | None = None) -> str | None:
    """Schedule the arrivals of one traffic source; answers the tier of its endpoint
    (None: its service sheds no load)."""
    name = spec["name"]
    sname, endpoint = spec["target"].split(".", 1)
    svc = services[sname]
    tag_arrivals = f"{name}:arrivals"
    tag_latency = f"{name}:latency_us"
    tags = {o: f"{name}:{o}" for o in OUTCOMES}
    gated = bool(svc.instances) and svc.instances[0].gate is not None
    keys = None
    route = f"GET /{endpoint}"
    if scenario is not None:
        route = scenario.services[sname]["endpoints"][endpoint].get("route", route)
    method, _, path = route.partition(" ")
    tier_index, shed_key = (1, route) if svc.priorities is None else svc.priorities.route(
        method, path)
    if spec.get("priority") is not None:  # the traffic's own tier (a trusted proxy's header)
        tier_index = ("critical", "degraded", "sheddable").index(spec["priority"])
    top: Callable[[], str]
    if gated or spec.get("keys") is not None:
        from stormguard.ratelimit.rules import RequestAttrs
        from stormguard.sim.inbound import Keys, handle_gated

        if spec.get("keys") is not None:
            # its own seeded source: giving a traffic source keys leaves its arrivals as
            # they were
            seed = 0 if scenario is None else scenario.seed
            keys = Keys(spec["keys"], random.Random(f"{seed}:{name}:keys"))
        static = RequestAttrs(method=method, path=path)

        def gated_server() -> str:
            attrs = _ATTRS.get() if keys is not None else static
            return handle_gated(svc.pick(), endpoint, attrs, tier_index, shed_key)

    instances = svc.instances

    def server() -> str:
        k = svc._next  # Service.pick(), inlined: round robin
        svc._next = (k + 1) % len(instances)
        return _handle(instances[k], endpoint, clock)

    # client layers, outermost first: each a pipeline around a remote call to the next hop
    def remote(inner: Callable[[], str], honour: bool) -> Callable[[], str]:
        def call() -> str:
            waiter = Waiter(eng, clock)
            attrs = _ATTRS.get() if keys is not None else None

            def hop() -> None:
                if attrs is not None:
                    _ATTRS.set(attrs)
                try:
                    waiter.complete(inner())
                except Exception as exc:
                    waiter.complete(exc)

            eng._fire_now(start, clock, hop)
            d = _current.get()
            if not waiter.wait(None if d is None else max(d.at - clock.monotonic(), 0.0)):
                raise TimeoutError(f"{sname}: no answer before the deadline")
            value = waiter.value
            if isinstance(value, Exception):
                if isinstance(value, Limited | Overloaded):  # a 429 / 503 with Retry-After
                    raise type(value)(str(value), retry_after=value.retry_after if honour
                                      else None) from value
                raise ServiceUnavailable(f"{sname}: 503") from value
            return str(value)
        return call

    top = gated_server if gated else server
    for layer in reversed(spec.get("clients", [])):
        policies: list[Policy] = []
        if layer.get("timeout") is not None:
            policies.append(Timeout(total=layer["timeout"], clock=clock,
                                    name=f"{layer['name']}.timeout"))
        r = layer.get("retry")
        if r is not None:
            policies.append(Retry(attempts=r["attempts"], base=r["base"],
                                  multiplier=r["multiplier"], max_delay=r["max_delay"],
                                  jitter=r["jitter"], max_retry_after=r.get("max_retry_after"),
                                  rng=random.Random(rng.random()),
                                  clock=clock, name=f"{layer['name']}.retry"))
        top = _wrap(policies, remote(top, bool(r is not None and r.get("retry_after"))))

    entry = top
    if keys is not None:
        inner_entry, draw = entry, keys.draw

        def keyed() -> str:
            _ATTRS.set(draw(method, path))
            return inner_entry()
        entry = keyed

    rows = {o: series.row(tag) for o, tag in tags.items()}
    latency = series.row(tag_latency)
    inv_res, last = 1.0 / series.resolution, series.buckets - 1

    def request() -> None:
        started = clock._mono0 + clock._elapsed  # clock.monotonic(), inlined
        try:
            outcome = entry()
        except Limited:
            outcome = "limited"
        except Overloaded:
            outcome = "shed"
        except Exception:
            outcome = "error"
        # counted in the bucket of its arrival: rates of the requests that arrived then
        i = int(started * inv_res)
        i = i if i < last else last
        rows[outcome][i] += 1
        latency[i] += int((clock._mono0 + clock._elapsed - started) * 1e6)

    rate = _Rate(spec["arrival"]["rate"])
    poisson = spec["arrival"]["process"] == "poisson"

    def next_time(t: float) -> float | None:
        if poisson:
            peak = rate.peak
            if peak <= 0:
                return None
            if len(rate.points) == 1:  # a constant rate: no thinning needed
                return t + rng.expovariate(peak)
            while True:  # thinning (Lewis-Shedler) for a time-varying rate
                t += rng.expovariate(peak)
                if t > duration:
                    return None
                if rng.random() * peak <= rate(t):
                    return t
        return rate.advance(t)

    arrivals = series.row(tag_arrivals)
    fire_later, monotonic = eng._fire_later, clock.monotonic
    steady = poisson and len(rate.points) == 1 and rate.peak > 0
    expovariate, peak = rng.expovariate, rate.peak

    def arrive() -> None:
        now = monotonic()
        i = int(now * inv_res)
        arrivals[i if i < last else last] += 1
        start(clock, request)
        if steady:  # the common case, a constant Poisson rate: one draw
            gap = expovariate(peak)
            if now + gap <= duration:
                fire_later(gap, arrive)
            return
        t = next_time(now)
        if t is not None and t <= duration:
            fire_later(t - now, arrive)

    first = next_time(0.0)
    if first is not None and first <= duration:
        eng.call_at(first, arrive)
    if svc.priorities is None:
        return None
    return ("critical", "degraded", "sheddable")[tier_index]
