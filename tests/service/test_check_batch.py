"""``POST /v1/check/batch`` runs its checks concurrently over a store that waits on I/O
(issue 17, 4), answering in order; the planning bounds still refuse a batch whole."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx
import pytest

from stormguard import AsyncRateLimiter, Decision, MemoryStore, Rule, Store
from stormguard.service import create_app
from stormguard.testing import FakeClock
from tests.service.helpers import RULES, RefusingStore


class SlowStore(Store):
    """A memory store whose coroutines wait (as a network store does) and count how many
    checks are in flight at once."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.inner = MemoryStore(clock=clock)
        self.in_flight = self.most = 0

    async def _wait(self) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        self.in_flight -= 1

    def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self.inner.hit(key, rule, cost)

    def peek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        return self.inner.peek(key, rule, cost)

    def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        return self.inner.hit_all(key, rules, cost)

    def reset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        self.inner.reset(key, rule)

    async def ahit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        await self._wait()
        return self.inner.hit(key, rule, cost)

    async def apeek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        await self._wait()
        return self.inner.peek(key, rule, cost)

    async def ahit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        await self._wait()
        return self.inner.hit_all(key, rules, cost)


def _client(store: Store) -> httpx.AsyncClient:
    app = create_app(AsyncRateLimiter(store), RULES, admin_token=None)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sg")


async def test_batch_checks_run_concurrently_and_answer_in_order(clock: FakeClock) -> None:
    store = SlowStore(clock)
    # user:0 three times (3, 2, 1 then denied), the others once; by key and by attributes
    checks = [{"key": "user:0", "rule": "search"} for _ in range(4)]
    checks += [{"key": f"user:{i}", "rule": "search", "cost": 1 + i % 3}
               for i in range(1, 300)]
    checks.append({"user": "0", "method": "GET", "path": "/search"})
    async with _client(store) as c:
        r = await c.post("/v1/check/batch", json={"checks": checks})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == len(checks)
    assert [a["remaining"] for a in results[:4]] == [2, 1, 0, 0]
    assert [a["allowed"] for a in results[:4]] == [True, True, True, False]
    assert [a["remaining"] for a in results[4:-1]] == [3 - (1 + i % 3) for i in range(1, 300)]
    assert results[-1]["allowed"] is False
    assert results[-1]["rule"] == "search"
    assert store.most > 100  # not one after another


async def test_a_store_that_refuses_a_rule_is_still_422(clock: FakeClock) -> None:
    async with _client(RefusingStore()) as c:
        r = await c.post("/v1/check/batch", json={"checks": [{"key": "a", "rule": "search"}]
                                                  * 5})
    assert r.status_code == 422
    assert "refuses the rule" in r.json()["error"]


def test_a_batch_on_redis_answers_every_check_in_order(redis_url: str) -> None:
    """The 1,000 checks go out in one pipelined write; their replies must come within
    the store's timeout. The default (50 ms) is for a quiet machine: on a loaded one the
    event loop may not even run for that long, so the checks would be answered degraded
    (on_error's allow) before their replies are read. This test is about the answers and
    their order, not the timeout: 2 s."""
    pytest.importorskip("stormguard.stores.redis")

    async def run() -> list[dict[str, object]]:
        limiter = AsyncRateLimiter(redis_url, timeout=2.0)
        hourly = [{**RULES[0], "window": 3600}]  # no window boundary within the test
        app = create_app(limiter, hourly, admin_token=None)
        checks = [{"key": f"user:{i // 4}", "rule": "search"} for i in range(1000)]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://sg") as c:
            r = await c.post("/v1/check/batch", json={"checks": checks})
        await limiter.aclose()
        assert r.status_code == 200, r.text
        results: list[dict[str, object]] = r.json()["results"]
        return results

    results = asyncio.run(run())
    assert len(results) == 1000
    assert not any(a["degraded"] for a in results)  # every check reached Redis
    # four checks per key, limit 3: the store admits three of each key, whichever order
    # the concurrent checks reached it in
    for k in range(250):
        group = results[4 * k: 4 * k + 4]
        assert sorted(a["allowed"] for a in group) == [False, True, True, True]  # type: ignore[type-var]
        assert sorted(a["remaining"] for a in group) == [0, 0, 1, 2]  # type: ignore[type-var]
