"""ServiceStore against a real ``stormguard serve`` process (tests/client/conftest.py):
the same limiter API, batching of concurrent checks, every failure a degraded decision."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid

import httpx
import pytest

from stormguard import AsyncRateLimiter, ConfigError, RateLimiter, Rule, StorageError
from stormguard._core.errors import StorageCircuitOpen
from stormguard.client import ServiceError, ServiceStore
from stormguard.testing import FakeClock
from tests.client.conftest import TOKEN

THREE = Rule(3, 3600, "fixed_window", name="three")
BIG = Rule(1_000_000, 3600, "fixed_window", name="big")


def _key() -> str:
    return f"user:{uuid.uuid4().hex[:12]}"


def test_blocking_limiter_counts_on_the_service(service_url: str) -> None:
    store = ServiceStore(service_url, rules="named")
    limiter = RateLimiter(store)
    key = _key()
    decisions = [limiter.hit(key, THREE) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions] == [2, 1, 0, 0]
    assert decisions[0].rule is THREE
    assert decisions[0].limit == 3
    assert not any(d.degraded for d in decisions)
    assert 0 < decisions[3].retry_after <= 3600  # the end of the fixed window
    assert int(decisions[3].headers()["Retry-After"]) >= 1
    # the service's own check of key + rule shares the counter
    r = httpx.post(f"{service_url}/v1/check", json={"key": key, "rule": "three"})
    assert r.json()["allowed"] is False
    assert store.requests_sent == 4
    assert store.ping() is True
    limiter.close()


def test_cost_and_hit_all_of_one_rule(service_url: str) -> None:
    with RateLimiter(ServiceStore(service_url, rules="named")) as limiter:
        key = _key()
        assert limiter.hit(key, THREE, cost=2).remaining == 1
        assert limiter.hit_all(key, [THREE, THREE]).remaining == 0
        with pytest.raises(ConfigError, match="cost"):
            limiter.hit(key, THREE, cost=4)  # above the capacity: refused before sending


def test_peek_hit_all_and_reset_on_the_service(service_url: str) -> None:
    """Every Store operation goes to the service: peek consumes nothing, hit_all is all or
    nothing over several rules in one call, reset (with the admin token) forgets."""
    a = Rule(2, 3600, "fixed_window", name="a")
    b = Rule(3, 3600, "fixed_window", name="b")
    store = ServiceStore(service_url, token=TOKEN)
    limiter = RateLimiter(store)
    key = _key()
    assert limiter.peek(key, a).remaining == 2
    assert limiter.peek(key, a).remaining == 2  # nothing consumed
    decisions = [limiter.hit_all(key, [a, b]) for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]
    assert decisions[2].rule is a  # the binding rule, as the service named it
    assert limiter.peek(key, b).remaining == 1  # the denied hit_all took nothing from b
    sent = store.requests_sent
    limiter.reset(key, [a, b])
    assert store.requests_sent == sent + 1
    assert limiter.hit_all(key, [a, b]).remaining == 1
    # named mode: the service's rules, several at once
    named = RateLimiter(ServiceStore(service_url, rules="named", token=TOKEN))
    assert [named.hit_all(key, [THREE, BIG]).allowed for _ in range(4)] == [
        True, True, True, False]
    assert named.peek(key, BIG).remaining == 1_000_000 - 3
    named.reset(key, THREE)
    assert named.hit(key, THREE).remaining == 2
    with pytest.raises(ConfigError, match="name"):
        named.store.hit(_key(), Rule(3, 60))  # named mode needs a rule name
    # reset is a control-plane call: without the token the service refuses it
    tokenless = ServiceStore(service_url)
    with pytest.raises(ServiceError, match="401") as info:
        tokenless.reset(key, a)
    assert info.value.status == 401
    tokenless.close()
    limiter.close()
    named.close()


async def test_async_peek_hit_all_and_reset(service_url: str) -> None:
    a = Rule(2, 3600, "fixed_window", name="a")
    b = Rule(3, 3600, "fixed_window", name="b")
    store = ServiceStore(service_url, token=TOKEN)
    limiter = AsyncRateLimiter(store)
    key = _key()
    # concurrent peeks and hits of one iteration: one batch, each answered as itself
    peek, hit = await asyncio.gather(limiter.peek(key, a), limiter.hit_all(key, [a, b]))
    assert store.requests_sent == 1
    assert (peek.remaining, hit.remaining) == (2, 1)
    assert (await limiter.hit_all(key, [a, b])).remaining == 0
    assert not (await limiter.hit_all(key, [a, b])).allowed
    await limiter.reset(key, [a, b])
    assert (await limiter.peek(key, a)).remaining == 2
    await limiter.aclose()


def test_a_failing_service_opens_the_client_breaker(down_url: str) -> None:
    """After breaker_threshold failures, checks are refused at once without a request
    (each would otherwise wait for the timeout); one probe after the cool-down."""
    clock = FakeClock()
    store = ServiceStore(down_url, rules="named", breaker_threshold=3, breaker_cooldown=2.0,
                         clock=clock)
    limiter = RateLimiter(store)
    for _ in range(3):
        assert limiter.hit(_key(), THREE).degraded
    assert store.requests_sent == 3
    assert store.breaker.state == "open"
    with pytest.raises(StorageCircuitOpen) as info:
        store.hit(_key(), THREE)
    assert info.value.remaining == pytest.approx(2.0)
    d = limiter.hit(_key(), THREE)
    assert d.allowed  # on_error="allow"
    assert d.degraded
    assert store.requests_sent == 3  # no request while open
    clock.advance(2.0)
    assert limiter.hit(_key(), THREE).degraded  # the probe: still down
    assert store.requests_sent == 4
    assert store.breaker.state == "open"
    store.close()


def test_the_breaker_closes_when_the_service_answers(service_url: str) -> None:
    clock = FakeClock()
    store = ServiceStore(service_url, rules="named", breaker_threshold=2, breaker_cooldown=1.0,
                         clock=clock)
    for _ in range(2):
        store.breaker.on_failure(store.breaker.acquire())  # two failures seen before
    assert store.breaker.state == "open"
    clock.advance(1.0)
    assert store.hit(_key(), THREE).remaining == 2  # the probe succeeds
    assert store.breaker.state == "closed"
    # a refusal (4xx) is an answer: the service is up, the breaker does not count it
    for _ in range(3):
        with pytest.raises(ServiceError, match="404"):
            store.hit(_key(), Rule(3, 60, name="no-such-rule"))
    assert store.breaker.state == "closed"
    store.close()


async def test_async_checks_fail_fast_while_open(down_url: str) -> None:
    clock = FakeClock()
    store = ServiceStore(down_url, breaker_threshold=1, breaker_cooldown=5.0, clock=clock)
    limiter = AsyncRateLimiter(store, on_error="deny")
    assert not (await limiter.hit(_key(), THREE)).allowed
    sent = store.requests_sent
    decisions = await asyncio.gather(*(limiter.hit(_key(), THREE) for _ in range(5)))
    assert all(d.degraded and not d.allowed for d in decisions)
    assert store.requests_sent == sent  # refused by the breaker, no request
    with pytest.raises(StorageCircuitOpen):
        await store.ahit(_key(), THREE)
    await limiter.aclose()


async def test_concurrent_checks_go_as_one_batch(service_url: str) -> None:
    store = ServiceStore(service_url, rules="named")
    limiter = AsyncRateLimiter(store)
    key = _key()
    decisions = await asyncio.gather(*(limiter.hit(key, THREE) for _ in range(5)))
    assert sorted(d.remaining for d in decisions) == [0, 0, 0, 1, 2]
    assert [d.allowed for d in decisions].count(True) == 3
    assert (store.requests_sent, store.checks_sent) == (1, 5)  # one /v1/check/batch
    # a lone check is a plain /v1/check
    d = await limiter.hit(_key(), BIG)
    assert d.allowed
    assert d.remaining == 999_999
    assert (store.requests_sent, store.checks_sent) == (2, 6)
    assert await store.aping() is True
    await limiter.aclose()


async def test_batches_are_split_at_max_batch(service_url: str) -> None:
    store = ServiceStore(service_url, rules="named", max_batch=4)
    keys = [_key() for _ in range(10)]
    decisions = await asyncio.gather(*(store.ahit(k, BIG) for k in keys))
    assert all(d.allowed and d.remaining == 999_999 for d in decisions)
    assert (store.requests_sent, store.checks_sent) == (3, 10)
    await store.aclose()


async def test_a_refused_check_fails_alone(service_url: str) -> None:
    """The service refuses a batch whole (an unknown rule): the client sends its checks
    one by one, so only the check at fault fails (and the limiter degrades it)."""
    store = ServiceStore(service_url, rules="named")
    limiter = AsyncRateLimiter(store, on_error="deny")
    key = _key()
    nope = Rule(3, 3600, "fixed_window", name="no-such-rule")
    good, bad = await asyncio.gather(limiter.hit(key, BIG), limiter.hit(key, nope))
    assert good.allowed
    assert not good.degraded
    assert not bad.allowed
    assert bad.degraded
    assert limiter.degraded_count == 1
    with pytest.raises(ServiceError, match="404") as info:
        await store.ahit(key, nope)
    assert info.value.status == 404
    await limiter.aclose()


def test_service_down_blocking(down_url: str) -> None:
    store = ServiceStore(down_url, rules="named")
    with pytest.raises(StorageError, match="ConnectError"):
        store.hit(_key(), THREE)
    assert store.ping() is False
    allow = RateLimiter(store)
    d = allow.hit(_key(), THREE)
    assert d.allowed
    assert d.degraded
    deny = RateLimiter(store, on_error="deny")
    assert not deny.hit(_key(), THREE).allowed
    local = RateLimiter(store, on_error="local")
    key = _key()
    assert [local.hit(key, THREE).allowed for _ in range(4)] == [True, True, True, False]
    store.close()


async def test_service_down_async(down_url: str) -> None:
    store = ServiceStore(down_url, rules="inline")
    limiter = AsyncRateLimiter(store, on_error="local")
    key = _key()
    decisions = await asyncio.gather(*(limiter.hit(key, THREE) for _ in range(4)))
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert all(d.degraded for d in decisions)
    assert limiter.degraded_count == 4
    assert await store.aping() is False
    await limiter.aclose()


def test_timeout_is_a_storage_error() -> None:
    """A service that accepts the connection and never answers: the short timeout ends
    the call (this waits on the real clock for the 50 ms timeout itself)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # accepted by the kernel, never answered
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        store = ServiceStore(url, timeout=0.05, rules="named")
        with pytest.raises(StorageError, match="Timeout"):
            store.hit(_key(), THREE)
        assert RateLimiter(store).hit(_key(), THREE).degraded
        store.close()


def test_store_url_scheme(service_url: str) -> None:
    url = service_url.replace("http://", "stormguard+http://") + "?rules=named&timeout=2"
    limiter = RateLimiter(url)
    assert isinstance(limiter.store, ServiceStore)
    assert limiter.store.timeout == 2.0
    assert limiter.store.rules == "named"
    assert limiter.hit(_key(), THREE).remaining == 2
    limiter.close()
    with pytest.raises(ConfigError, match="unknown option"):
        RateLimiter(service_url.replace("http://", "stormguard+http://") + "?bogus=1")
    with pytest.raises(ConfigError, match="url"):
        ServiceStore("redis://localhost")
    with pytest.raises(ConfigError, match="max_batch"):
        ServiceStore(service_url, max_batch=5000)


def _recording(answer: dict[str, object]) -> tuple[list[object], httpx.MockTransport]:
    seen: list[object] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, json=answer)

    return seen, httpx.MockTransport(handler)


ANSWER = {"allowed": True, "limit": 5, "remaining": 4, "reset_after": 12.0,
          "retry_after": 0.0, "rule": None, "degraded": False, "reset": 1_800_000_000}


def test_inline_wire_format() -> None:
    """The inline form of /v1/check: the rules' parameters and names under ``limits``."""
    seen, transport = _recording(ANSWER)
    store = ServiceStore("http://sg", transport=transport)
    rule = Rule(5, 60, "token_bucket", burst=5, name="api")
    d = store.hit("user:1", rule, cost=2)
    assert d.allowed
    assert d.remaining == 4
    assert d.rule is rule
    assert d.reset_after == 12.0
    store.hit("user:1", Rule.parse("10/minute"))
    store.peek("user:1", rule)
    other = Rule(5, 60, "fixed_window", name="other")
    assert store.hit_all("user:1", [rule, other]).rule is rule  # same limit: the first
    api = {"limit": 5, "window": 60, "algorithm": "token_bucket", "burst": 5, "name": "api"}
    assert seen == [
        ("/v1/check", {"key": "user:1", "limits": [api], "cost": 2}),
        ("/v1/check", {"key": "user:1", "limits": [
            {"limit": 10, "window": 60, "algorithm": "sliding_window_counter"}]}),
        ("/v1/check", {"key": "user:1", "limits": [api], "peek": True}),
        ("/v1/check", {"key": "user:1", "limits": [
            api, {"limit": 5, "window": 60, "algorithm": "fixed_window", "name": "other"}]}),
    ]


def test_malformed_answers_are_storage_errors() -> None:
    for answer in ({"allowed": "yes"}, {"results": []}, {}):
        _, transport = _recording(answer)
        store = ServiceStore("http://sg", transport=transport)
        with pytest.raises(ServiceError, match="not a decision"):
            store.hit("k", THREE)
    store = ServiceStore("http://sg", transport=httpx.MockTransport(
        lambda r: httpx.Response(503, text="<html>bad gateway</html>")))
    with pytest.raises(ServiceError, match="503") as info:
        store.hit("k", THREE)
    assert info.value.status == 503


def _inline_supported(url: str) -> bool:
    r = httpx.post(f"{url}/v1/check", json={"key": _key(), "limit": 1, "window": 60})
    return r.status_code == 200


def test_inline_limits_on_the_service(service_url: str) -> None:
    if not _inline_supported(service_url):
        pytest.skip("this service's /v1/check does not take inline limits yet")
    with RateLimiter(ServiceStore(service_url)) as limiter:
        key = _key()
        rule = Rule.parse("2/minute", algorithm="fixed_window")
        assert [limiter.hit(key, rule).allowed for _ in range(3)] == [True, True, False]
        other = Rule.parse("2/minute", algorithm="fixed_window", name="other")
        assert limiter.hit(key, other).remaining == 1  # a named rule: its own counter


async def test_an_unexpected_error_fails_the_waiting_checks() -> None:
    """Whatever goes wrong while sending, no caller is left waiting: a lone check and a
    batch both end in a StorageError (a degraded decision through the limiter)."""
    def broken(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("bug in a transport")

    store = ServiceStore("http://sg", rules="named", async_transport=httpx.MockTransport(broken))
    with pytest.raises(ServiceError, match="bug in a transport"):
        await store.ahit("k", THREE)
    limiter = AsyncRateLimiter(store)
    decisions = await asyncio.gather(*(limiter.hit(f"k{i}", THREE) for i in range(3)))
    assert all(d.degraded for d in decisions)
    await store.aclose()


async def test_the_middleware_checks_several_keys_through_the_service(service_url: str) -> None:
    """A request matching a per-user and a per-ip rule (two keys: the check peeks one and
    hits the other) works over ServiceStore: the counters live in the service."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from stormguard.middleware import RateLimitMiddleware

    async def hello(request: object) -> PlainTextResponse:
        return PlainTextResponse("hi")

    tag = uuid.uuid4().hex[:8]
    rules = [{"name": f"ip-{tag}", "scope": "ip", "limit": 3, "window": 3600,
              "algorithm": "fixed_window"},
             {"name": f"user-{tag}", "scope": "user", "limit": 2, "window": 3600,
              "algorithm": "fixed_window"}]
    store = ServiceStore(service_url)
    app = RateLimitMiddleware(Starlette(routes=[Route("/", hello)]),
                              limiter=AsyncRateLimiter(store), rules=rules,
                              user=lambda scope: "alice")
    transport = httpx.ASGITransport(app=app, client=("192.0.2.7", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as c:
        codes = [(await c.get("/")).status_code for _ in range(3)]
    assert codes == [200, 200, 429]  # the user's 2 bind first
    assert store.checks_sent >= 3
    # the per-ip counter lives in the service: two requests charged it, the denied one not
    d = await AsyncRateLimiter(store).peek("ip:192.0.2.7", Rule(3, 3600, "fixed_window",
                                                               name=f"ip-{tag}"))
    assert d.remaining == 1
    await store.aclose()
