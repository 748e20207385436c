"""The inbound side of a simulated service: rate limits, tiered load shedding, deferred work.

Each piece is the product's own code, driven in virtual time:

* **rate limits**: a service's ``rate_limit.rules`` are a rules file's rules, parsed by
  :class:`stormguard.ratelimit.rules.RuleSet` (the service's own parser: the same
  scopes, endpoint globs, tiers and counter keys), checked per request with
  ``RuleSet.check`` on a real :class:`~stormguard.RateLimiter` over a
  :class:`~stormguard.MemoryStore` on the engine's clock: one per instance
  (``store: instance``) or one for the whole service (``store: shared``, a fleet-wide
  store). A denied request is answered 429 with the decision's ``Retry-After``;
* **load shedding**: a real :class:`stormguard.overload.Shedder` per instance (a fixed
  limit or an :class:`~stormguard.AdaptiveLimit`, the tiers' shares, ``queue_timeout``,
  CoDel), each request's tier and latency key from the endpoint's route by the
  middleware's own :class:`~stormguard.integrations.shedding.Priorities`. A request that
  must wait for a slot waits in virtual time (:func:`acquire`, the flow of
  ``Shedder.acquire_blocking`` with the wait on the engine); a shed one is answered 503;
* **deferred work**: a ``defer`` fallback is the real
  :class:`~stormguard.queue.DeferFallback` of a ``memory://``
  :class:`~stormguard.DeferredQueue` on the engine's clock, and :class:`SimWorker` drains
  it with the real :class:`~stormguard.queue.Worker`'s decisions (leases, acknowledgements,
  backoff, dead letters, the pause on an open breaker), taking at most ``rate`` jobs per
  second, ``concurrency`` at a time, each job a simulated task calling the dependency
  through the worker's pipeline;
* **key populations** (:class:`Keys`): who sends a traffic source's requests: ``count``
  users (or API keys, or IPs) with uniform or Zipf popularity, or one named client.
"""

from __future__ import annotations

import bisect
import logging
import math
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from stormguard._core.errors import ConfigError, Shed
from stormguard.integrations.shedding import Priorities
from stormguard.observability.events import Event
from stormguard.overload.limit import AdaptiveLimit
from stormguard.overload.shedder import TIERS, Shedder, Ticket
from stormguard.queue.core import DeferredQueue
from stormguard.queue.events import JobDeferred
from stormguard.queue.fallback import DeferFallback
from stormguard.queue.job import Backoff, Deferred, Job
from stormguard.queue.worker import Lease, Worker
from stormguard.ratelimit.limiter import RateLimiter
from stormguard.ratelimit.rules import RequestAttrs, RulesError, RuleSet
from stormguard.resilience.pipeline import Pipeline
from stormguard.sim.engine import Engine
from stormguard.sim.model import (
    Dependency,
    Instance,
    Limited,
    Overloaded,
    ServiceUnavailable,
    _Step,
)
from stormguard.sim.policies import FALLBACK, BuildContext, build_policies
from stormguard.sim.runtime import PoolFull, Series, SimClock, Waiter, spawn
from stormguard.sim.scenario import Scenario
from stormguard.stores.hybrid import HybridStore
from stormguard.stores.memory import MemoryStore

__all__ = ["Gate", "Keys", "QueueRun", "SimWorker", "acquire", "build_priorities", "build_rules",
           "build_shedder", "defer_counter", "deferring", "gates", "handle_gated", "handler",
           "memory_queue", "start_queues"]


# -- who sends the requests ------------------------------------------------------------
class Keys:
    """A traffic source's key population: ``draw()`` answers the request's (user,
    API key, IP, tier). ``count`` clients, uniform or Zipf (``exponent``) popularity;
    ``user`` / ``api_key`` / ``ip`` are templates in which ``{i}`` is the client's rank
    (1 = the most popular), so ``{"user": "bot-1"}`` is one named client."""

    __slots__ = ("_cum", "_exponent", "_fixed", "_head", "_random", "_templates", "_tier",
                 "_total", "count")

    #: Zipf weights kept exactly for the first ranks; the tail beyond (a population of
    #: millions) is the integral of ``x ** -exponent`` between rank midpoints, inverted
    #: when drawn: within 1e-6 of each rank's exact weight there, without a table of them
    EXACT = 100_000

    def __init__(self, spec: dict[str, Any], rng: random.Random) -> None:
        self.count = int(spec.get("count", 1))
        self._templates = tuple(spec.get(k) for k in ("user", "api_key", "ip"))
        self._tier: str | None = spec.get("tier")
        self._random = rng.random
        self._fixed: tuple[str | None, ...] | None = None
        self._cum: list[float] = []
        self._total = self._head = 0.0
        self._exponent = float(spec.get("exponent", 1.0))
        if self.count == 1:
            self._fixed = self._attrs(1)
        elif spec.get("popularity", "uniform") == "zipf":
            s = self._exponent
            acc = 0.0
            for k in range(1, min(self.count, self.EXACT) + 1):
                acc += k ** -s
                self._cum.append(acc)
            self._head = acc
            tail = 0.0
            if self.count > self.EXACT:
                tail = self._integral(self.count + 0.5) - self._integral(self.EXACT + 0.5)
            self._total = acc + tail

    def _integral(self, x: float) -> float:
        s = self._exponent
        return math.log(x) if s == 1.0 else x ** (1 - s) / (1 - s)

    def _inverse(self, y: float) -> float:
        s = self._exponent
        return math.exp(y) if s == 1.0 else (y * (1 - s)) ** (1 / (1 - s))

    def _attrs(self, i: int) -> tuple[str | None, ...]:
        return tuple(None if t is None else t.replace("{i}", str(i)) for t in self._templates)

    def rank(self) -> int:
        """One draw of a client's rank (1-based)."""
        if self.count == 1:
            return 1
        if self._cum:
            v = self._random() * self._total
            if v < self._head:
                return bisect.bisect_left(self._cum, v) + 1
            x = self._inverse(self._integral(self.EXACT + 0.5) + v - self._head)
            return min(max(int(x + 0.5), self.EXACT + 1), self.count)
        return int(self._random() * self.count) + 1

    def share(self, rank: int) -> float:
        """The expected share of the traffic sent by the client of ``rank``."""
        if self.count == 1:
            return 1.0
        if self._cum:
            if rank <= self.EXACT:
                prev = self._cum[rank - 2] if rank > 1 else 0.0
                return (self._cum[rank - 1] - prev) / self._total
            return (self._integral(rank + 0.5) - self._integral(rank - 0.5)) / self._total
        return 1.0 / self.count

    def draw(self, method: str, path: str) -> RequestAttrs:
        user, api_key, ip = self._fixed if self._fixed is not None else self._attrs(self.rank())
        return RequestAttrs(user, api_key, ip, method, path, self._tier)


# -- rate limits and load shedding at an instance's entry --------------------------------
class _SimEvent(threading.Event):
    """What a shedder's waiter is woken with: ``set()`` completes the task's Waiter (the
    wake-up is scheduled on the engine, never switched to under the shedder's lock)."""

    def __init__(self, waiter: Waiter) -> None:
        super().__init__()
        self.waiter = waiter

    def set(self) -> None:
        self.waiter.complete(True)


def waking(eng: Engine, clock: SimClock) -> Callable[[], _SimEvent]:
    """The ``event`` factory :func:`acquire` hands a shedder: a new Waiter of the engine
    per request that must wait (made once per entry, not per request)."""
    def event() -> _SimEvent:
        return _SimEvent(Waiter(eng, clock))

    return event


def acquire(shedder: Shedder, tier: int, key: str, event: Callable[[], _SimEvent]
            ) -> Ticket | Shed:
    """``shedder.acquire_blocking(tier, key)`` in virtual time: the same decisions (the
    shedder's :meth:`~Shedder.enqueue` and :meth:`~Shedder.settle`), the wait of at most
    ``queue_timeout`` of its tier on the engine instead of a thread's (``event``: from
    :func:`waking`)."""
    got = shedder.enqueue(tier, key, event)
    if isinstance(got, Ticket | Shed):
        return got
    assert isinstance(got.event, _SimEvent)
    got.event.waiter.wait(shedder.queue_timeouts[TIERS[tier]])
    return shedder.settle(got)


class Gate:
    """One instance's entry: its rate limiter and rules, its shedder (either may be None),
    and the rows counting what they refused."""

    __slots__ = ("_clock", "_event", "_inv_res", "_last", "_limited", "_shadow",
                 "_shed", "limiter", "rules", "shedder")

    def __init__(self, eng: Engine, clock: SimClock, series: Series, service: str,
                 limiter: RateLimiter | None, rules: RuleSet | None,
                 shedder: Shedder | None) -> None:
        self._clock = clock
        self.limiter = limiter
        self.rules = rules
        self.shedder = shedder
        self._event = waking(eng, clock)
        self._inv_res = 1.0 / series.resolution
        self._last = series.buckets - 1
        self._limited: dict[str, list[int]] = {}
        self._shadow: dict[str, list[int]] = {}
        if rules is not None:
            self._limited = {r.name: series.row(f"limited:{service}:{r.name}") for r in rules
                             if not r.shadow}
            self._shadow = {r.name: series.row(f"shadow:{service}:{r.name}") for r in rules
                            if r.shadow}
        self._shed = tuple(series.row(f"shed:{service}:{t}")
                           for t in ("critical", "degraded", "sheddable"))

    def _bucket(self) -> int:
        i = int(self._clock.monotonic() * self._inv_res)
        return i if i < self._last else self._last

    def check(self, attrs: RequestAttrs) -> None:
        """Raise :class:`Limited` if the rules deny the request (a 429)."""
        rules, limiter = self.rules, self.limiter
        if rules is None or limiter is None:
            return
        result = rules.check(limiter, attrs)
        if result.shadow_denied:  # a dry-run rule would have denied it: counted, not refused
            b = self._bucket()
            for name in result.shadow_denied:
                self._shadow[name][b] += 1
        if result.allowed:
            return
        d = result.decision
        name = "" if d is None or d.rule is None else d.rule.name or ""
        row = self._limited.get(name)
        if row is not None:
            row[self._bucket()] += 1
        raise Limited(f"429: {name}", retry_after=None if d is None else d.retry_after)

    def admit(self, tier: int, key: str) -> Ticket:
        """A shedder slot, or :class:`Overloaded` (a 503) when the request is shed."""
        assert self.shedder is not None
        got = acquire(self.shedder, tier, key, self._event)
        if isinstance(got, Ticket):
            return got
        self._shed[tier][self._bucket()] += 1
        raise Overloaded(f"503: {got}", retry_after=got.retry_after)


# -- deferred work -----------------------------------------------------------------------
class _NotDurable(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "is not durable" not in record.getMessage()


@contextmanager
def _quiet() -> Iterator[None]:
    # a simulated queue is memory:// by design: its "not durable" warning says nothing
    log = logging.getLogger("stormguard.queue")
    f = _NotDurable()
    log.addFilter(f)
    try:
        yield
    finally:
        log.removeFilter(f)


def memory_queue(name: str, clock: SimClock) -> DeferredQueue:
    """A ``memory://`` DeferredQueue on the simulation's clock."""
    with _quiet():
        return DeferredQueue("memory://", clock=clock, name=name)


class SimWorker:
    """Drains one queue in virtual time with a real :class:`Worker`'s decisions.

    A loop task takes at most one job every ``1 / rate`` seconds (every due job at once
    when ``rate`` is None) while fewer than ``concurrency`` run, each job a task running
    :meth:`Worker.process` (the handler through the pipeline, then the outcome: ack, retry
    later with backoff, dead letter, or a pause while a breaker is open). Counts per
    bucket: jobs started (``queue:<name>:taken``) and handlers that succeeded
    (``queue:<name>:drained``)."""

    def __init__(self, eng: Engine, clock: SimClock, worker: Worker, series: Series,
                 name: str, rate: float | None, start: float) -> None:
        self.eng = eng
        self.clock = clock
        self.worker = worker
        self.rate = rate
        self.start_at = start
        self.running = 0
        self._held: dict[str, Lease] = {}
        self._taken = series.row(f"queue:{name}:taken")
        self._inv_res = 1.0 / series.resolution
        self._last = series.buckets - 1

    def start(self) -> None:
        self.eng.call_at(self.start_at, spawn, self.eng, self.clock, self._loop)

    def _process(self, job: Job) -> None:
        try:
            self.worker.process(job)
        finally:
            self.running -= 1
            self._held.pop(job.id, None)

    def _loop(self) -> None:
        w, clock = self.worker, self.clock
        gap = None if self.rate is None else 1.0 / self.rate
        poll = w.poll_interval
        while True:
            now = clock.monotonic()
            w.renew(list(self._held.values()), now)
            wait = w.paused_for(now)
            if wait > 0:
                w.take(0)
                clock.sleep(min(wait, poll))
                continue
            free = w.concurrency - self.running
            if free <= 0:
                w.take(0)
                clock.sleep(poll if gap is None else min(gap, poll))
                continue
            jobs = w.take(1 if gap is not None else free)
            if jobs:
                b = int(now * self._inv_res)
                for job in jobs:
                    self.running += 1
                    self._held[job.id] = Lease(job, now)
                    self._taken[b if b < self._last else self._last] += 1
                    spawn(self.eng, clock, self._process, job)
                if gap is not None:
                    clock.sleep(gap)
                continue
            clock.sleep(w.idle_delay())

    def finish(self) -> None:
        """The run is over: acknowledge the jobs done since the last round."""
        self.worker.take(0)


def handler(call: Callable[[], object], series: Series, name: str, clock: SimClock
            ) -> Callable[[], object]:
    """The worker's handler for a queue: the dependency call, counted when it succeeds."""
    row = series.row(f"queue:{name}:drained")
    inv_res, last = 1.0 / series.resolution, series.buckets - 1

    def run() -> object:
        out = call()
        b = int(clock.monotonic() * inv_res)
        row[b if b < last else last] += 1
        return out
    return run


# -- building from the scenario (the same code validates a file and runs it) -------------
def _prefixed(where: str, exc: ConfigError) -> ConfigError:
    return ConfigError(f"{where}.{exc.field}", exc.value, exc.problem)


def build_rules(where: str, rules: object) -> RuleSet:
    """A service's ``rate_limit.rules`` (a rules file's list) as a RuleSet; a problem is a
    ConfigError naming ``<where>[i].<field>``."""
    try:
        return RuleSet.from_data(rules)
    except RulesError as exc:
        p = exc.problems[0]
        items = rules if isinstance(rules, list) else []
        index = next((i for i, r in enumerate(items) if isinstance(r, dict)
                      and r.get("name") == p.rule), None)
        if index is None and p.rule.startswith("#") and p.rule[1:].isdigit():
            index = int(p.rule[1:]) - 1
        at = where if index is None else f"{where}[{index}]"
        value = items[index].get(p.field) if index is not None and isinstance(
            items[index], dict) else None
        raise ConfigError(f"{at}.{p.field}", value, p.problem) from None


def build_shedder(where: str, spec: dict[str, Any], clock: SimClock, name: str) -> Shedder:
    """One instance's Shedder from a normalized ``load_shedding`` mapping."""
    limit: AdaptiveLimit | int | None
    raw = spec.get("limit")
    if isinstance(raw, dict):
        try:
            limit = AdaptiveLimit(**raw["adaptive"])
        except ConfigError as exc:
            raise _prefixed(f"{where}.limit.adaptive", exc) from None
    else:
        limit = raw
    try:
        return Shedder(limit, queue_timeout=spec["queue_timeout"], shares=spec.get("shares"),
                       codel_target=spec["codel_target"],
                       codel_interval=spec["codel_interval"], max_queue=spec["max_queue"],
                       retry_after=spec["retry_after"], name=name, clock=clock)
    except ConfigError as exc:
        raise _prefixed(where, exc) from None


def build_priorities(where: str, spec: dict[str, Any]) -> Priorities:
    """The middleware's route -> tier classification from ``load_shedding``."""
    try:
        return Priorities(spec.get("priorities"), spec.get("default", "degraded"), None,
                          None, ())
    except ConfigError as exc:
        raise _prefixed(where, exc) from None


# -- the model's wiring (imported by the scenarios that use the inbound side) ----------
@dataclass
class QueueRun:
    """A deferred queue of the run and its worker."""

    queue: DeferredQueue
    worker: SimWorker
    stats: dict[str, int] = field(default_factory=dict)  # at the end of the run

    def finish(self) -> None:
        """The run is over: the last acknowledgements, then the queue's counts."""
        self.worker.finish()
        self.stats = self.queue.stats()


def handle_gated(inst: Instance, endpoint: str, attrs: RequestAttrs, tier: int,
                  key: str) -> str:
    """:func:`_handle` behind the instance's entry: the rate limits (a 429), then the load
    shedder's slot (a 503 when shed), then the steps; the thread is held throughout, as
    a thread-pool server runs its middleware."""
    pool = inst.pool
    try:
        pool.acquire()
    except PoolFull as exc:
        raise ServiceUnavailable("503: queue full") from exc
    outcome = "success"
    gate = inst.gate
    assert gate is not None
    try:
        gate.check(attrs)
        if gate.shedder is None:
            for step in inst.endpoints[endpoint]:
                if step() is FALLBACK:
                    outcome = "fallback"
            return outcome
        ticket = gate.admit(tier, key)
        ok = False
        try:
            for step in inst.endpoints[endpoint]:
                if step() is FALLBACK:
                    outcome = "fallback"
            ok = True
        finally:
            gate.shedder.release(ticket, ok)
    finally:
        pool.release()
    return outcome


def deferring(step: _Step, policies: list[Any]) -> _Step:
    """``step`` if none of its policies defers; else the step answering FALLBACK for a
    ``Deferred`` answer (the request was served degraded)."""
    if not any(isinstance(p, DeferFallback) for p in policies):
        return step

    def run() -> object:
        out = step()
        return FALLBACK if isinstance(out, Deferred) else out
    return run


def defer_counter(queues: dict[str, QueueRun], series: Series
                   ) -> tuple[Callable[[Event], None], ...]:
    """The listener of every ``defer`` fallback: deferrals per queue and bucket."""
    if not queues:
        return ()
    inv_res, last = 1.0 / series.resolution, series.buckets - 1
    deferred = {name: series.row(f"queue:{name}:deferred") for name in queues}

    def on_deferred(event: Event) -> None:
        if isinstance(event, JobDeferred):
            b = int(event.at * inv_res)
            deferred[event.task][b if b < last else last] += 1
    return (on_deferred,)


def gates(eng: Engine, clock: SimClock, series: Series, sname: str, sspec: dict[str, Any]
           ) -> Callable[[int], Gate] | None:
    """A maker of the instances' entry gates (None: the service has neither rate limits
    nor load shedding, and its requests take the plain path)."""
    rl, ls = sspec.get("rate_limit"), sspec.get("load_shedding")
    if rl is None and ls is None:
        return None
    where = f"services.{sname}"
    rules = None if rl is None else build_rules(f"{where}.rate_limit.rules", rl["rules"])
    shared = backend = None
    if rl is not None and rl["store"] == "shared":
        shared = RateLimiter(MemoryStore(clock=clock), name=f"{sname}.limiter")
    elif rl is not None and rl["store"] == "hybrid":
        backend = MemoryStore(clock=clock)  # the shared store (the Redis) of the instances
    phases = random.Random(f"{sname}:sync")

    def make(i: int) -> Gate:
        limiter = shared
        if backend is not None:
            assert rl is not None
            # each instance's HybridStore over the shared backend, its sync rounds on the
            # engine at its own phase (a round trip takes no virtual time here)
            store = HybridStore(backend, sync_interval=None, hot_rate=rl["hot_rate"],
                                clock=clock, name=f"{sname}#{i}")
            interval = rl["sync_interval"]
            eng.every(interval, store.sync, start=phases.random() * interval)
            limiter = RateLimiter(store, name=f"{sname}#{i}.limiter")
        elif rl is not None and limiter is None:
            limiter = RateLimiter(MemoryStore(clock=clock), name=f"{sname}#{i}.limiter")
        shedder = None if ls is None else build_shedder(
            f"{where}.load_shedding", ls, clock, f"{sname}#{i}.shedder")
        return Gate(eng, clock, series, sname, limiter, rules, shedder)
    return make


def start_queues(eng: Engine, clock: SimClock, scenario: Scenario,
                  deps: dict[str, Dependency], series: Series, master: random.Random,
                  listener: Callable[[int], Callable[[Event], None]]) -> dict[str, QueueRun]:
    """The scenario's deferred queues and their workers (not started yet)."""
    out: dict[str, QueueRun] = {}
    for name, spec in scenario.queues.items():
        queue = memory_queue(name, clock)
        ctx = BuildContext(clock=clock, rng=random.Random(master.random()),
                           listener=listener(-1), instance=-1)
        policies = build_policies(spec["policies"], ctx, f"queues.{name}.policies",
                                  spec["call"])
        b = spec["backoff"]
        worker = Worker(queue, {name: handler(deps[spec["call"]].call, series, name, clock)},
                        pipeline=Pipeline(*policies, name=f"{name}.worker") if policies
                        else None,
                        concurrency=spec["concurrency"], max_attempts=spec["max_attempts"],
                        visibility_timeout=spec["visibility_timeout"],
                        backoff=Backoff(b["base"], b["multiplier"], b["max_delay"], b["jitter"],
                                        random.Random(master.random())),
                        poll_interval=spec["poll_interval"], name=f"{name}.worker", clock=clock)
        sim = SimWorker(eng, clock, worker, series, name, spec["rate"], spec["start"])
        out[name] = QueueRun(queue, sim)
        row = series.row(f"queue:{name}:pending")
        res = series.resolution

        def sample(q: DeferredQueue = queue, row: list[int] = row, res: float = res) -> None:
            i = round(clock.monotonic() / res) - 1
            if 0 <= i < len(row):
                s = q.stats()
                row[i] = s["pending"] + s["in_flight"]
        eng.every(res, sample, start=res)
    return out
