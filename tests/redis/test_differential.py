"""Python (MemoryStore) and Lua (RedisStore, client time) give identical Decisions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from stormguard import MemoryStore, RedisStore, Rule
from stormguard.ratelimit.algorithms import ALGORITHMS
from stormguard.testing import FakeClock
from tests.redis_servers import RedisServer

WINDOWS = [0.001, 0.5, 1, 7.3, 60, 3600, 86400 * 7]


@st.composite
def rules(draw: Any, algorithm: str | None = None) -> Rule:
    algo = algorithm or draw(st.sampled_from(sorted(ALGORITHMS)))
    limit = draw(st.sampled_from([1, 2, 3, 5, 10, 100, 997, 10**6]))
    window = draw(st.sampled_from(WINDOWS))
    burst = None
    if ALGORITHMS[algo].uses_burst and draw(st.booleans()):
        burst = draw(st.integers(1, 2 * limit))
    rule = Rule(limit, window, algorithm=algo, burst=burst)
    # the Redis store rejects rules whose capacity x window reaches 2**53 (test_keys.py)
    assume(rule.capacity * rule._algo.W + limit < 2**53)
    return rule


ops = st.lists(
    st.tuples(
        st.sampled_from(["hit", "hit", "peek", "hit_all"]),
        st.sampled_from(["a", "b"]),
        st.integers(1, 3),  # cost (clipped to the capacity)
        st.sampled_from([0, 0, 1, 7, 999, 10_000, 250_000, 1_000_000, 61_000_000]),  # us
    ),
    min_size=1, max_size=40,
)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rule_list=st.lists(rules(), min_size=1, max_size=3), trace=ops,
       start=st.integers(0, 10**9))
def test_memory_and_redis_agree(redis_server: RedisServer, rule_list: list[Rule],
                                trace: list[tuple[str, str, int, int]], start: int) -> None:
    redis_server.client().flushall()
    t0 = 1_700_000_000 + start / 1e3
    mclock, rclock = FakeClock(start=t0), FakeClock(start=t0)
    memory = MemoryStore(clock=mclock)
    store = RedisStore.from_url(redis_server.url, clock=rclock, time_source="client",
                                timeout=1.0, ttl_slack=3600)
    try:
        for i, (op, key, cost, dt_us) in enumerate(trace):
            rule = rule_list[i % len(rule_list)]
            if op == "hit_all":
                c = min(cost, *(r.capacity for r in rule_list))
                got = store.hit_all(key, rule_list, c)
                want = memory.hit_all(key, rule_list, c)
            else:
                c = min(cost, rule.capacity)
                got = getattr(store, op)(key, rule, c)
                want = getattr(memory, op)(key, rule, c)
            assert got == want, (i, op, key, c, rule)
            mclock.advance(dt_us / 1e6)
            rclock.advance(dt_us / 1e6)
    finally:
        store.close()


SLACK_MS = 3_600_000  # the stores' clocks are fake: real-time TTLs must not expire keys

# how far behind the shared time a call's clock is, in windows of the first rule
SKEWS = [0.0, 0.0, 0.0, 0.0, 0.001, 0.3, 0.7, 1.0, 1.5, 3.0]

skewed_ops = st.lists(
    st.tuples(
        st.sampled_from(["hit", "hit", "peek", "hit_all"]),
        st.sampled_from(["a", "b"]),
        st.integers(1, 3),
        st.sampled_from([0, 0, 1, 7, 999, 10_000, 250_000, 1_000_000, 61_000_000]),
        st.sampled_from(SKEWS),
    ),
    min_size=2, max_size=40,
)


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), trace=skewed_ops, start=st.integers(0, 10**9))
def test_memory_and_redis_agree_when_the_clock_steps_back(
        redis_server: RedisServer, algo: str, data: st.DataObject,
        trace: list[tuple[str, str, int, int, float]], start: int) -> None:
    """Non-monotonic client time (skewed app servers, a clock stepped back): the Lua
    scripts must make exactly the Python decisions, for every algorithm."""
    # every rule of the trace uses ``algo`` (so a mismatch names its algorithm); the
    # first rule's window sets how far the clock steps back
    rule_list = data.draw(st.lists(rules(algo), min_size=1, max_size=3), label="rules")
    redis_server.client().flushall()
    w0 = rule_list[0]._algo.W
    # wall time that steps back: skewed app servers, or one clock an NTP correction moves
    # back; integer microseconds set on both clocks, so both stores read exactly one ``now``
    base_us = 1_700_000_000_000_000 + start * 1000
    mclock, rclock = FakeClock(), FakeClock()
    memory = MemoryStore(clock=mclock)
    store = RedisStore.from_url(redis_server.url, clock=rclock, time_source="client",
                                timeout=1.0, ttl_slack=SLACK_MS / 1000)
    # expiry model: the Python entries ([expires_at_us, *state]) of admitted hits
    entries: dict[tuple[str, str], list[Any]] = {}
    client = redis_server.client()
    try:
        for i, (op, key, cost, dt_us, skew) in enumerate(trace):
            now = base_us - round(skew * w0)
            mclock.set_wall(now / 1e6)
            rclock.set_wall(now / 1e6)
            rule = rule_list[i % len(rule_list)]
            if op == "hit_all":
                c = min(cost, *(r.capacity for r in rule_list))
                got = store.hit_all(key, rule_list, c)
                want = memory.hit_all(key, rule_list, c)
                written = rule_list if want.allowed else []
            else:
                c = min(cost, rule.capacity)
                got = getattr(store, op)(key, rule, c)
                want = getattr(memory, op)(key, rule, c)
                written = [rule] if want.allowed and op == "hit" else []
            assert got == want, (i, op, key, c, skew, rule)
            # every key written gets a positive TTL, no longer than its state matters
            # (the Python expiry, seen from this call's clock) plus the slack
            for r in {r._id: r for r in written}.values():
                e = entries.setdefault((r._id, key), r._algo.fresh())
                assert r._algo.apply(e, now, c, True)[0]  # allowed
                ms = max(1, -((now - e[0]) // 1000) + SLACK_MS)
                ttl = client.pttl(store.key(key, r))
                assert ms - 5000 < ttl <= ms, (i, key, r, ttl, ms)
            base_us += dt_us
    finally:
        store.close()
