"""Client time with skewed app servers: two stores whose clocks disagree share one key.

With ``time_source="client"`` the script takes each caller's clock. A caller whose clock
is behind the one that wrote the state must not restart the count (fixed and sliding
windows) nor move the bucket's timestamp back (which would hand the next caller with
the faster clock a refill it never earned): the Lua scripts follow the Python
algorithms, so the shared key never admits more than the fast clock's time allows,
and a MemoryStore fed the same calls at the same times decides exactly the same.
"""

from __future__ import annotations

import pytest

from stormguard import MemoryStore, RedisStore, Rule
from stormguard.ratelimit.algorithms import ALGORITHMS
from stormguard.testing import FakeClock
from tests.redis_servers import RedisServer

T0 = 1_700_000_000.0  # a multiple of the window: fixed windows start here
WINDOW = 1.0
LIMIT = 5
SKEW = 0.7 * WINDOW  # server B's clock is this far behind server A's
STEP = 0.05 * WINDOW
STEPS = 60
WINDOW_ALGOS = ("fixed_window", "sliding_window_counter", "sliding_window_log")


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_skewed_app_servers_share_one_limit(server: RedisServer, algorithm: str) -> None:
    server.client().flushall()
    rule = Rule(LIMIT, WINDOW, algorithm=algorithm)
    fast = FakeClock(start=T0 + 0.1 * WINDOW)
    slow = FakeClock(start=T0 + 0.1 * WINDOW - SKEW)
    a = RedisStore.from_url(server.url, clock=fast, time_source="client", timeout=1.0)
    b = RedisStore.from_url(server.url, clock=slow, time_source="client", timeout=1.0)
    clock = FakeClock()  # the MemoryStore's: set to the calling app server's wall time
    memory = MemoryStore(clock=clock)
    admitted = {"a": 0, "b": 0}
    try:
        for _ in range(STEPS):
            for name, store, own in (("a", a, fast), ("b", b, slow)) * 2:
                clock.set_wall(own.wall())
                got = store.hit("shared", rule)
                assert got == memory.hit("shared", rule), (name, own.wall())
                admitted[name] += got.allowed
            fast.advance(STEP)
            slow.advance(STEP)
    finally:
        a.close()
        b.close()
    span = (STEPS - 1) * STEP  # from the fast clock's first call to its last
    total = admitted["a"] + admitted["b"]
    if algorithm in WINDOW_ALGOS:
        # every admission belongs to one of the fast clock's windows, each holding LIMIT
        first = int((T0 + 0.1 * WINDOW) // WINDOW)
        last = int((T0 + 0.1 * WINDOW + span) // WINDOW)
        bound = LIMIT * (last - first + 1)
    else:
        # a full bucket plus what the fast clock's time refills, never the skew again
        bound = rule.capacity + int(LIMIT * span / WINDOW)
    assert total <= bound, (admitted, bound)
    assert admitted["a"] > 0


@pytest.mark.parametrize("algorithm", ["fixed_window", "token_bucket"])
def test_a_client_behind_gets_nothing_extra(server: RedisServer, algorithm: str) -> None:
    """The short form: A takes all but one; B, 0.7 of a window behind (still in the
    previous fixed window), gets the one left and no more, and does not reopen the
    bucket for A either."""
    server.client().flushall()
    rule = Rule(LIMIT, WINDOW, algorithm=algorithm)
    fast = FakeClock(start=T0 + 0.2 * WINDOW)
    slow = FakeClock(start=T0 + 0.2 * WINDOW - SKEW)
    a = RedisStore.from_url(server.url, clock=fast, time_source="client", timeout=1.0)
    b = RedisStore.from_url(server.url, clock=slow, time_source="client", timeout=1.0)
    clock = FakeClock()  # the MemoryStore's: set to the calling app server's wall time
    memory = MemoryStore(clock=clock)
    try:
        calls = [("a", a, fast)] * (LIMIT - 1) + [("b", b, slow)] * 3 + [("a", a, fast)] * 3
        decisions = []
        for _, store, own in calls:
            clock.set_wall(own.wall())
            d = store.hit("shared", rule)
            assert d == memory.hit("shared", rule)
            decisions.append(d)
        assert [d.allowed for d in decisions] == [True] * LIMIT + [False] * 5
        # B is held to A's state: it waits as long as A would (fixed window: B is treated
        # as at the start of A's window; bucket: no time passed since A's last hit)
        assert decisions[LIMIT].retry_after == pytest.approx(
            WINDOW if algorithm == "fixed_window" else WINDOW / LIMIT)
        assert decisions[-1].retry_after == pytest.approx(
            0.8 * WINDOW if algorithm == "fixed_window" else WINDOW / LIMIT)
        ttl = server.client().pttl(a.key("shared", rule))
        # the key lives until the slow clock too is past the state (plus the 1 s slack)
        assert 0 < ttl <= 1000 * (1.0 + (0.8 * WINDOW if algorithm == "fixed_window"
                                         else WINDOW) + SKEW)
    finally:
        a.close()
        b.close()
