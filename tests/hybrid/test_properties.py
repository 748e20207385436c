"""Hypothesis: the bound of the docs holds on random traces of several HybridStores on
one backend (random costs, clock steps, sync rounds, outages aside)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import HybridStore, MemoryStore, Rule
from stormguard.testing import FakeClock

# (store index, cost, seconds to advance, sync this store after)
steps = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3),
                           st.sampled_from([0.0, 0.0, 0.001, 0.01, 0.05, 0.3]),
                           st.booleans()), min_size=1, max_size=300)


def run(algorithm: str, limit: int, window: float, trace: list[tuple[int, int, float, bool]],
        hold: float) -> list[tuple[float, int]]:
    clock = FakeClock(start=1_700_000_040.0)
    backend = MemoryStore(clock=clock)
    members = [HybridStore(backend, sync_interval=None, clock=clock, deny_hold=hold)
               for _ in range(4)]
    rule = Rule(limit, window, algorithm=algorithm)
    admitted = []
    for i, cost, dt, sync in trace:
        if members[i].hit("k", rule, cost).allowed:
            admitted.append((clock.wall(), cost))
        clock.advance(dt)
        if sync:
            members[i].sync()
    return admitted


@settings(max_examples=60, deadline=None)
@given(trace=steps, limit=st.integers(3, 40), hold=st.sampled_from([0.0, 0.1]))
def test_fixed_window_never_admits_more_than_the_limit_per_window(
        trace: list[tuple[int, int, float, bool]], limit: int, hold: float) -> None:
    admitted = run("fixed_window", limit, 1.0, trace, hold)
    per_window = Counter[int]()
    for t, cost in admitted:
        per_window[int(t // 1.0)] += cost
    assert all(v <= limit for v in per_window.values()), per_window


@settings(max_examples=60, deadline=None)
@given(trace=steps, limit=st.integers(3, 40), hold=st.sampled_from([0.0, 0.1]))
def test_sliding_window_estimate_of_what_was_admitted_stays_within_the_limit(
        trace: list[tuple[int, int, float, bool]], limit: int, hold: float) -> None:
    window = 1.0
    admitted = run("sliding_window_counter", limit, window, trace, hold)
    per_window = Counter[int]()
    for t, cost in admitted:
        w = int(t // window)
        per_window[w] += cost
        elapsed = (t - w * window) / window
        # what was admitted so far, weighted as the algorithm weighs it (1e-9: float noise)
        estimate = per_window[w - 1] * (1 - elapsed) + per_window[w]
        assert estimate <= limit + 1e-6, (t, dict(per_window))


@settings(max_examples=60, deadline=None)
@given(trace=steps, burst=st.integers(3, 40), algorithm=st.sampled_from(
    ["token_bucket", "gcra", "leaky_bucket"]), hold=st.sampled_from([0.0, 0.1]))
def test_buckets_never_admit_more_than_burst_plus_rate_since_the_start(
        trace: list[tuple[int, int, float, bool]], burst: int, algorithm: str,
        hold: float) -> None:
    rate = burst / 2.0  # `burst` per 2 s
    admitted = run(algorithm, burst, 2.0, trace, hold)
    if not admitted:
        return
    start = 1_700_000_040.0
    total = 0
    for t, cost in admitted:
        total += cost
        assert total <= burst + rate * (t - start) + 1e-6
