"""AdaptiveLimit: within [min, max], shrinks under latency growth, grows near the
no-load minimum, and does not creep upward under moderate overload (Gradient2's flaw)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import AdaptiveLimit, ConfigError
from stormguard.overload import FixedLimit


def drive(limit: AdaptiveLimit, rtt_of: object, windows: int, per_window: int = 20,
          window: float = 0.1, now: float = 0.0) -> float:
    """Feed ``windows`` windows of samples; the load is always at the limit (every slot
    taken), ``rtt_of(limit)`` gives the latency of a request at that concurrency."""
    assert callable(rtt_of)
    for _ in range(windows):
        for i in range(per_window):
            limit.sample(rtt_of(limit.limit), now + i * window / per_window, limit.limit)
        now += window
    return now


def server(capacity: int, base: float = 0.01) -> object:
    """A server that runs ``capacity`` requests in parallel: beyond, they queue, and the
    latency grows with the concurrency (Little's law)."""
    return lambda concurrency: base * max(1.0, concurrency / capacity)


class Gradient2Model:
    """Netflix concurrency-limits' Gradient2 (defaults: tolerance 1.5, smoothing 0.2,
    long window 600 samples, queue allowance sqrt(limit)), one update per window of
    samples, as the library does: the reference the moderate-overload test compares to."""

    def __init__(self, initial: int = 20, max_limit: int = 1000) -> None:
        self.limit = float(initial)
        self.long_rtt: float | None = None
        self.max = max_limit

    def window(self, short_rtt: float) -> None:
        if self.long_rtt is None:
            self.long_rtt = short_rtt
        self.long_rtt += (short_rtt - self.long_rtt) / 600 * 20  # 20 samples per window
        if self.long_rtt / short_rtt > 2:
            self.long_rtt *= 0.95
        gradient = max(0.5, min(1.0, 1.5 * self.long_rtt / short_rtt))
        new = self.limit * gradient + math.sqrt(self.limit)
        self.limit = min(self.max, max(1.0, self.limit * 0.8 + new * 0.2))


def test_bad_arguments_name_the_field() -> None:
    for kwargs, field in [({"min": 0}, "min"), ({"min": 5, "max": 4}, "max"),
                          ({"initial": 2000}, "initial"), ({"tolerance": 0.5}, "tolerance"),
                          ({"window": -1}, "window"), ({"initial": 1.5}, "initial")]:
        with pytest.raises(ConfigError, match=field):
            AdaptiveLimit(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="limit"):
        FixedLimit(0)


def test_grows_while_latency_stays_at_the_no_load_minimum() -> None:
    limit = AdaptiveLimit(initial=10, max=200)
    drive(limit, lambda c: 0.01, windows=30)  # an I/O-bound dependency: no queueing
    assert limit.limit == 200


def test_does_not_grow_when_the_limit_is_not_used() -> None:
    limit = AdaptiveLimit(initial=10)
    for i in range(500):  # one request at a time: no evidence that more would be fine
        limit.sample(0.01, i * 0.01, 1)
    assert limit.limit == 10


def test_finds_the_capacity_of_a_server_and_stays_there() -> None:
    limit = AdaptiveLimit(initial=1, max=1000)
    seen = []
    now = 0.0
    for _ in range(200):
        now = drive(limit, server(capacity=16), windows=1, now=now)
        seen.append(limit.limit)
    tail = seen[50:]
    assert min(tail) >= 8, tail
    assert max(tail) <= 16 * limit.tolerance, tail  # latency at most 2x the no-load one


def one_core(limit: AdaptiveLimit, seconds: float, now: float = 0.0,
             parallel: bool = False) -> tuple[float, list[tuple[float, int]]]:
    """CPU-bound 10 ms requests on one core at every slot of the limit: ``c`` at once take
    ``c`` times as long each and one finishes every 10 ms (``parallel``: I/O-bound, each
    takes 10 ms whatever ``c``). Answers the time and every change of the limit."""
    changes = [(now, limit.limit)]
    end = now + seconds
    while now < end:
        c = limit.limit
        limit.sample(0.01 if parallel else 0.01 * c, now, float(c))
        now += 0.01 / c if parallel else 0.01
        if limit.limit != changes[-1][1]:
            changes.append((now, limit.limit))
    return now, changes


def tries_of(changes: list[tuple[float, int]]) -> list[float]:
    """When the limit went from 1 to 2."""
    return [t for (_, a), (t, b) in itertools.pairwise(changes) if a == 1 and b == 2]


def test_requests_that_share_one_core_step_down_to_running_alone() -> None:
    """CPU-bound work on one core (one GIL): two requests at once take twice as long each,
    no more throughput. A ratio of 2 is within the tolerance, but it grew with the
    concurrency: the limit steps down to 1. At 1 there is no evidence that 2 would not be
    better, so it tries 2 again after 10 windows (1 s), then after twice as long each time
    the try failed at once, up to 80 windows (8 s): each try is latency for everyone."""
    limit = AdaptiveLimit(initial=8)
    for i in range(20):  # the no-load latency, learnt alone
        limit.sample(0.01, i * 0.01, 1)
    _, changes = one_core(limit, 40.0, now=1.0)
    down = next(t for t, v in changes if v == 1)
    assert down <= 1.5, changes  # at once
    assert max(v for t, v in changes if t >= down) <= 2, changes
    tries = tries_of(changes)
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert len(tries) >= 6, changes  # it does try again, and again
    assert 0.9 <= tries[0] - down <= 1.3, tries  # the first after 1 s, longer after each
    assert gaps[0] >= 2.0, gaps
    assert gaps[1] >= 4.0, gaps
    assert all(7.9 <= g <= 8.8 for g in gaps[2:]), gaps  # but never much more than 8 s
    at_two = sum(b - a for (a, v), (b, _) in itertools.pairwise(changes) if v == 2
                 and a >= down)
    assert at_two <= 0.05 * len(tries), changes  # each try ends within 50 ms


def test_a_try_that_holds_resets_the_wait_before_the_next() -> None:
    """Once more at once does not share (the work became parallel: I/O), the try holds,
    the limit grows, and the wait after a later failed try starts again at 1 s."""
    limit = AdaptiveLimit(initial=8)
    for i in range(20):
        limit.sample(0.01, i * 0.01, 1)
    now, changes = one_core(limit, 30.0, now=1.0)  # the hold is at its longest
    assert changes[-1][1] == 1
    now, changes = one_core(limit, 12.0, now=now, parallel=True)  # parallel work now
    assert limit.limit >= 4, changes  # found within one hold and then grown
    _, changes = one_core(limit, 6.0, now=now)
    tries = tries_of(changes)
    assert len(tries) >= 2, changes
    assert tries[1] - tries[0] <= 2.3, tries  # 1 s, then 2 s: not 8 s


def test_a_cold_start_into_cpu_bound_overload_finds_one_in_flight() -> None:
    """Started at 20 under overload on one core: every latency it sees was measured with
    many requests sharing the core, so its baselines are loaded (up to 20x). The probes
    (halving, every 3 windows while they find a lower baseline, down to the floor when the
    baseline was measured one above it) and the shared-core rule bring it to 1 within
    2 s of 100 ms windows, and it stays at 1-2 (never back to 3-5)."""
    limit = AdaptiveLimit()
    now = 0.0
    seen = []
    for _ in range(100):
        c = limit.limit
        for i in range(10):  # one core, 10 ms of work each: 10 finish per 100 ms window
            limit.sample(0.01 * c, now + i * 0.01, c)
        now += 0.1
        seen.append(limit.limit)
    assert 1 in seen[:20], seen
    tail = seen[30:]
    assert max(tail) <= 3, seen
    assert tail.count(1) >= 0.8 * len(tail), seen


def test_parallel_work_is_not_taken_for_a_shared_core() -> None:
    """Two cores: latency doubles only past 2 in flight, less than in proportion to the
    concurrency; the limit stays where both cores are used."""
    limit = AdaptiveLimit(initial=8)
    for i in range(20):
        limit.sample(0.01, i * 0.01, 1)
    now = drive(limit, server(capacity=2), windows=30, now=1.0)
    seen = []
    for _ in range(60):
        now = drive(limit, server(capacity=2), windows=1, now=now)
        seen.append(limit.limit)
    assert min(seen) >= 2, seen
    assert max(seen) <= 4, seen  # latency at most 2x the no-load one


def test_per_key_baselines_tell_a_slow_route_from_a_queue() -> None:
    """A 20 ms checkout beside a 5 ms cart is not queueing: each is compared with its
    own no-load minimum."""
    limit = AdaptiveLimit(initial=10, max=100)
    now = 0.0
    for _ in range(40):
        for i in range(20):
            key, rtt = ("/checkout", 0.020) if i % 2 else ("/cart", 0.005)
            limit.sample(rtt, now + i * 0.005, limit.limit, key)
        now += 0.1
    assert limit.limit == 100
    assert limit.baseline("/cart") == pytest.approx(0.005)
    assert limit.baseline("/checkout") == pytest.approx(0.020)


def test_a_service_that_really_became_slower_is_relearnt_without_a_probe() -> None:
    limit = AdaptiveLimit(initial=10, max=100)
    drive(limit, lambda c: 0.01, windows=10)
    # a slower release: 3x the latency at any load; the limit shrinks to the floor, where
    # requests run alone and re-teach the baseline, and then it grows back
    now = drive(limit, lambda c: 0.03, windows=80, now=10.0)
    assert 0.02 < (limit.baseline("") or 0) <= 0.03
    drive(limit, lambda c: 0.03, windows=60, now=now)
    assert limit.limit == 100


@settings(max_examples=200, deadline=None)
@given(initial=st.integers(1, 50), lo=st.integers(1, 10), hi=st.integers(50, 300),
       samples=st.lists(st.tuples(st.one_of(st.floats(0, 10), st.just(math.nan),
                                            st.just(math.inf)), st.floats(0, 0.5),
                                  st.integers(0, 400), st.sampled_from(["", "/a", "/b"])),
                        max_size=400))
def test_always_within_min_and_max(initial: int, lo: int, hi: int,
                                   samples: list[tuple[float, float, int, str]]) -> None:
    initial = max(lo, min(hi, initial))
    limit = AdaptiveLimit(initial=initial, min=lo, max=hi, min_samples=1, window=0.0)
    now = 0.0
    for rtt, dt, in_flight, key in samples:
        now += dt
        limit.sample(rtt, now, in_flight, key)
        assert lo <= limit.limit <= hi


@settings(max_examples=100, deadline=None)
@given(initial=st.integers(10, 500), growth=st.floats(0.05, 2.0), base=st.floats(1e-4, 1.0))
def test_shrinks_under_sustained_latency_growth(initial: int, growth: float,
                                                base: float) -> None:
    """Latency rising window after window (a queue building up): the limit never grows
    once the latency is past the tolerance, and it ends well below where it started."""
    limit = AdaptiveLimit(initial=initial, max=1000)
    drive(limit, lambda c: base, windows=1)  # learn the no-load minimum
    start = limit.limit
    now = 1.0
    rtt = base
    last = start
    for _ in range(40):
        before = rtt  # a window is judged when the next one's first sample arrives
        rtt *= 1 + growth
        now = drive(limit, lambda c, r=rtt: r, windows=1, now=now)
        # the limit itself, not a probe window's lowered one (a probe hides for one window
        # the growth the window before it earned)
        level = int(limit._limit)
        if before > base * 1.5:
            assert level <= last
        last = level
    assert limit.limit < start
    assert limit.limit <= max(1, start // 2)


@settings(max_examples=50, deadline=None)
@given(capacity=st.integers(2, 64), initial=st.integers(1, 100))
def test_does_not_creep_upward_under_moderate_overload(capacity: int, initial: int) -> None:
    """Offered load beyond capacity without end (every slot always taken), latency
    proportional to the excess concurrency: Gradient2's long-term average follows the
    loaded latency, its gradient reads 1 and its queue allowance lifts the limit every
    window, without end. The no-load minimum does not follow: ours settles within 100
    windows and never grows again. (Started in overload it may settle above the capacity,
    having never seen the no-load latency; it does not creep.)"""
    ours = AdaptiveLimit(initial=initial, max=10_000)
    g2 = Gradient2Model(initial=initial, max_limit=10_000)
    rtt_of = server(capacity)
    now = 0.0
    settled = None
    for i in range(1000):
        now = drive(ours, rtt_of, windows=1, now=now)
        g2.window(rtt_of(int(g2.limit)))  # type: ignore[operator]
        if ours.probing:
            continue
        if i >= 100 and settled is None:
            settled = ours.limit
        elif settled is not None:
            assert ours.limit <= settled, (i, ours.limit, settled)
    assert ours.limit <= 2 * max(initial, capacity)
    # the scenario is the one that catches the flaw: the reference model ran away
    assert g2.limit > 10 * capacity


def test_fixed_limit_never_moves() -> None:
    limit = FixedLimit(7)
    assert limit.sample(10.0, 1.0, 7) is None
    assert limit.limit == 7


def test_slowness_that_requests_alone_share_is_not_a_queue() -> None:
    """A busy machine slows every request, the ones that ran alone too: a lower limit
    would not shorten anything, so the limit holds. When only the concurrent ones are
    slow, that is a queue, and it shrinks."""
    external = AdaptiveLimit(initial=10)
    queue = AdaptiveLimit(initial=10)
    now = 0.0
    for lim in (external, queue):
        for i in range(20):  # learn the no-load latency
            lim.sample(0.01, now + i * 0.005, 5)
    now = 1.0
    for _ in range(10):
        for i in range(20):
            alone = i % 4 == 0
            external.sample(0.05, now + i * 0.005, 1 if alone else 8)
            queue.sample(0.01 if alone else 0.05, now + i * 0.005, 1 if alone else 8)
        now += 0.1
    assert external.limit >= 10  # (it grew in the learning window; it never shrank)
    assert queue.limit < 5


def test_a_limit_that_learnt_at_no_load_never_probes() -> None:
    limit = AdaptiveLimit(initial=20, max=1000)
    for i in range(20):  # requests alone: a no-load baseline
        limit.sample(0.01, i * 0.01, 1)
    now = 1.0
    for _ in range(100):
        for i in range(20):
            limit.sample(0.01 * max(1.0, limit.limit / 8), now + i * 0.005, limit.limit)
        now += 0.1
        assert not limit.probing


def test_probes_stop_for_good_and_give_back_what_cost_throughput() -> None:
    """Started in overload on four cores: each probe halves the limit at most; one that
    finds a lower latency at a lower throughput (fewer than the cores busy) gives the
    limit back instead of keeping it; they stop once one finds no lower latency, and the
    limit ends where the four cores are used with at most one more request each."""
    limit = AdaptiveLimit(initial=40, max=1000)
    probes: list[int] = []
    seen = shared_core(limit, 30.0, costs=(0.010,), cores=4, probes=probes)
    assert probes
    assert limit._probe_at is None  # then never again
    assert min(seen[20:]) >= 4, seen
    assert max(seen[20:]) <= 8, seen


def shared_core(limit: AdaptiveLimit, seconds: float, costs: tuple[float, ...] = (
        0.020, 0.005, 0.010, 0.015), step: float = 0.001, cores: int = 1,
        probes: list[int] | None = None) -> list[int]:
    """``cores`` cores shared by every request in flight (processor sharing, as the GIL
    shares one), an endless queue in front (overload), each request admitted while fewer
    than ``limit.limit`` are in flight; a request's latency is what it really took, from
    its admission, so one admitted before the limit moved finishes at the old
    concurrency. Answers the limit every 100 ms (and appends the limit of every probing
    step to ``probes``)."""
    flight: list[list[float]] = []  # [cpu left, started, in flight at start, cost]
    now, seen, n, next_seen = 0.0, [], 0, 0.1
    while now < seconds:
        admitted = []
        while len(flight) < limit.limit:
            cost = costs[n % len(costs)]
            n += 1
            admitted.append([cost, now, 0, cost])
            flight.append(admitted[-1])
        for req in admitted:  # those admitted at one instant started together
            req[2] = len(flight)
        share = step * min(1.0, cores / len(flight))
        now += step
        if probes is not None and limit.probing:
            probes.append(limit.limit)
        for req in flight:
            req[0] -= share
        for req in [r for r in flight if r[0] <= 1e-12]:
            flight.remove(req)
            limit.sample(now - req[1], now, int(req[2]), f"{req[3]}")
        if now >= next_seen:
            seen.append(limit.limit)
            next_seen += 0.1
    return seen


def test_a_cold_start_finds_one_in_flight_when_requests_outlast_a_window() -> None:
    """At 20 in flight a 20 ms request takes ~250 ms, longer than a 100 ms window: the
    requests that finish in a probe's window were admitted before it, at the old
    concurrency, and say nothing of the lower limit; only the requests admitted within
    the probe tell whether the baseline was a loaded one. Within 3 s the limit is at 1
    to 2 and stays there."""
    limit = AdaptiveLimit()
    seen = shared_core(limit, 8.0)
    assert min(seen[:30]) <= 2, seen
    tail = seen[30:]
    assert max(tail) <= 3, seen
    assert sum(1 for x in tail if x <= 2) >= 0.9 * len(tail), seen


def test_a_try_on_one_shared_core_ends_at_the_third_joined_request() -> None:
    """The window after a growth from 1 to 2 closes as soon as three requests that ran
    joined were slowed in proportion (each of them is latency for everyone), not after
    the ten samples of a window."""
    limit = AdaptiveLimit(initial=1)
    now = 0.0
    for _ in range(200):  # alone at 1: no evidence against 2, so it grows
        limit.sample(0.01, now, 1.0)
        now += 0.01
        if limit.limit == 2:
            break
    assert limit.limit == 2
    fed = 0
    while limit.limit == 2:
        fed += 1
        now += 0.02
        limit.sample(0.02, now, 2.0)  # two at once on one core: twice as long
        assert fed <= 10, fed
    assert fed == 3
    assert limit.limit == 1
