"""lua/reserve.lua answers as the Python reference (``Algorithm.reserve``), and it shares
the rate-limit script's state: random traces of reservations, hits and peeks on one key
(client time passed as an argument, clocks stepping back), run on a private redis-server
through plain redis-py scripts."""

from __future__ import annotations

import importlib.resources
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from stormguard.ratelimit.algorithms import ALGORITHMS
from stormguard.stores.redis import SCRIPT
from tests.redis_servers import RedisServer

CODES = {"token_bucket": "tb", "gcra": "gcra", "leaky_bucket": "lb"}
FILES = ("prelude.lua", "token_bucket.lua", "gcra.lua", "leaky_bucket.lua", "reservation.lua",
         "reserve.lua")
SLACK_MS = "3600000"  # the keys outlive the test in real time, whatever the virtual clock
NO_LIMIT = 2**62


def reserve_script() -> str:
    lua = importlib.resources.files("stormguard.stores.redis") / "lua"
    return "\n".join(lua.joinpath(name).read_text(encoding="utf-8") for name in FILES)


@pytest.fixture
def client(redis_server: RedisServer) -> redis.Redis:
    c = redis_server.client()
    c.flushall()
    return c


ops = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "reserve", "hit", "peek"]),
        st.integers(1, 3),  # cost (clipped to the capacity)
        st.one_of(st.integers(-2_000_000, 3_000_000), st.sampled_from([0, 1, 999])),  # dt µs
        st.one_of(st.just(0), st.integers(0, 5_000_000), st.just(NO_LIMIT)),  # max wait µs
        st.booleans(),  # book
    ),
    min_size=1, max_size=40,
)


def lua_state(client: redis.Redis, key: str, name: str, n: int) -> Any:
    raw = client.get(key)
    if raw is None:
        return None
    a, b = (int(x) for x in raw.split())
    return (a * n + b,) if name == "gcra" else (a, b)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(CODES)),
       limit=st.sampled_from([1, 2, 3, 7, 10, 997, 10**6]),
       window_us=st.sampled_from([1_000, 250_000, 1_000_000, 7_300_000, 60_000_000,
                                  3_600_000_000]),
       burst=st.integers(1, 20), trace=ops, start=st.integers(0, 10**12))
def test_reserve_lua_agrees_with_python(client: redis.Redis, name: str, limit: int,
                                        window_us: int, burst: int,
                                        trace: list[tuple[str, int, int, int, bool]],
                                        start: int) -> None:
    algo = ALGORITHMS[name](limit, window_us, burst)
    assume(algo.magnitude < 2**53)  # what the Redis store accepts
    reserve = client.register_script(reserve_script())
    check = client.register_script(SCRIPT)
    key = f"r:{name}:{limit}:{window_us}:{burst}:{start}"
    client.delete(key)
    params = [CODES[name], algo.N, algo.W, algo.B]
    state: Any = None
    now = 1_700_000_000_000_000 + start
    for op, cost, dt, max_wait, book in trace:
        now = max(0, now + dt)
        c = min(cost, algo.B)
        if op == "reserve":
            ok, at, state = algo.reserve(state, now, c, max_wait, book)
            got = reserve(keys=[key], args=[now, c, "1" if book else "0", SLACK_MS, *params,
                                            max_wait])
            assert got == [int(ok), at, now], (op, now, c, max_wait, book)
        else:
            allowed, state, remaining, reset, retry, _ = algo.decide(state, now, c, op == "hit")
            got = check(keys=[key], args=[now, c, "1" if op == "hit" else "0", SLACK_MS,
                                          *params])
            assert got == [int(allowed), int(allowed), remaining, reset, retry], (op, now, c)
        assert lua_state(client, key, name, algo.N) == state


def test_reserve_lua_refuses_other_algorithms(client: redis.Redis) -> None:
    script = client.register_script(reserve_script())
    with pytest.raises(redis.ResponseError, match="no reservation for algorithm fw"):
        script(keys=["k"], args=[1_700_000_000_000_000, 1, "1", "0", "fw", 5, 1_000_000, 5,
                                 0])


def test_reserve_lua_with_server_time(client: redis.Redis) -> None:
    """Without a client time the script reads TIME; slots still follow the bucket."""
    script = client.register_script(reserve_script())
    args = ["", 1, "1", "0", "gcra", 10, 1_000_000, 2, NO_LIMIT]
    got = [script(keys=["srv"], args=args) for _ in range(4)]
    assert [ok for ok, _, _ in got] == [1, 1, 1, 1]
    ats = [at for _, at, _ in got]
    assert all(now <= at for _, at, now in got)
    assert ats[2] - ats[0] >= 100_000  # the third waits one emission interval
    assert ats[3] - ats[2] == 100_000  # then exactly one interval apart
    assert client.pttl("srv") > 0
