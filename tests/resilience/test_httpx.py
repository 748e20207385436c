"""ResilientTransport / AsyncResilientTransport against a real local HTTP server."""

from __future__ import annotations

import email.utils
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from stormguard import (
    CircuitBreaker,
    CircuitOpen,
    DeadlineExceeded,
    Fallback,
    Pipeline,
    Retry,
    RetryBudget,
    Timeout,
)
from stormguard.integrations.httpx import (
    AsyncResilientTransport,
    ResilientTransport,
    parse_retry_after,
)
from stormguard.resilience import Policy
from stormguard.testing import FakeClock
from tests.resilience.conftest import Mode
from tests.resilience.http_server import Reply, ScriptedServer, closed_port, scripted_server


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with scripted_server() as s:
        yield s


class Recording(httpx.HTTPTransport):
    """The real transport, remembering the timeouts each attempt was given."""

    def __init__(self) -> None:
        super().__init__(verify=False)  # plain http; skips loading CA certificates (~50 ms)
        self.timeouts: list[dict[str, float]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.timeouts.append(dict(request.extensions["timeout"]))
        return super().handle_request(request)


class AsyncRecording(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__(verify=False)  # plain http; skips loading CA certificates (~50 ms)
        self.timeouts: list[dict[str, float]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.timeouts.append(dict(request.extensions["timeout"]))
        return await super().handle_async_request(request)


async def send(mode: Mode, pipeline: Policy, method: str, url: str, *,
               record: list[Any] | None = None, opt_in: bool = False,
               clock: FakeClock | None = None, **kwargs: Any) -> httpx.Response:
    if mode.is_async:
        inner_a = AsyncRecording()
        transport_a = AsyncResilientTransport(pipeline, inner_a, retry_non_idempotent=opt_in,
                                              clock=clock)
        try:
            async with httpx.AsyncClient(transport=transport_a, timeout=5.0) as client:
                return await client.request(method, url, **kwargs)
        finally:
            if record is not None:
                record.extend(inner_a.timeouts)
    inner = Recording()
    transport = ResilientTransport(pipeline, inner, retry_non_idempotent=opt_in, clock=clock)
    try:
        with httpx.Client(transport=transport, timeout=5.0) as client:
            return client.request(method, url, **kwargs)
    finally:
        if record is not None:
            record.extend(inner.timeouts)


def retry(clock: FakeClock, **kw: Any) -> Retry:
    return Retry(**{"attempts": 3, "base": 0.1, "jitter": "none", "clock": clock, **kw})


@pytest.mark.parametrize("status", [502, 503, 504, 429])
async def test_retryable_statuses_are_retried(mode: Mode, server: ScriptedServer,
                                              clock: FakeClock, status: int) -> None:
    server.script(Reply(status), Reply(status))
    r = await send(mode, retry(clock), "GET", server.url + "/sms")
    assert (r.status_code, r.text) == (200, "ok")
    assert len(server.seen) == 3
    assert clock.sleeps == [0.1, 0.2]


@pytest.mark.parametrize("status", [400, 401, 404, 500])
async def test_other_statuses_are_not_retried(mode: Mode, server: ScriptedServer,
                                              clock: FakeClock, status: int) -> None:
    server.script(Reply(status, body=b"nope"))
    r = await send(mode, retry(clock), "GET", server.url)
    assert (r.status_code, r.text) == (status, "nope")
    assert len(server.seen) == 1


async def test_5xx_counts_as_a_breaker_failure(mode: Mode, server: ScriptedServer,
                                               clock: FakeClock) -> None:
    breaker = CircuitBreaker(window=3, min_calls=3, failure_rate=0.6, clock=clock)
    server.script(Reply(500), Reply(404), Reply(500))
    for expected in (500, 404, 500):
        assert (await send(mode, breaker, "GET", server.url)).status_code == expected
    assert breaker.state == "open"
    with pytest.raises(CircuitOpen):
        await send(mode, breaker, "GET", server.url)
    assert len(server.seen) == 3


async def test_last_failing_response_is_returned_readable(mode: Mode, server: ScriptedServer,
                                                          clock: FakeClock) -> None:
    server.script(*[Reply(503, body=f"busy {i}".encode()) for i in range(3)])
    r = await send(mode, retry(clock), "GET", server.url)
    assert (r.status_code, r.text) == (503, "busy 2")


async def test_retry_after_seconds_and_http_date(mode: Mode, server: ScriptedServer,
                                                 clock: FakeClock) -> None:
    date = email.utils.formatdate(clock.wall() + 6, usegmt=True)  # 4 s after the first sleep
    server.script(Reply(429, headers={"Retry-After": "2"}),
                  Reply(503, headers={"Retry-After": date}))
    r = await send(mode, retry(clock, max_retry_after=30.0), "GET", server.url, clock=clock)
    assert r.status_code == 200
    assert clock.sleeps[0] == 2.0
    assert 3.0 <= clock.sleeps[1] <= 4.0  # HTTP dates have 1 s resolution


def test_parse_retry_after() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("120", now) == 120.0
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now) == 30.0
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now) == 0.0
    for bad in (None, "", "soon", "-5", "nan"):
        assert parse_retry_after(bad, now) is None


async def test_post_is_not_retried_unless_idempotency_key_or_opt_in(
        mode: Mode, server: ScriptedServer, clock: FakeClock) -> None:
    server.script(Reply(503), Reply(503))
    r = await send(mode, retry(clock), "POST", server.url, content=b"order 4711")
    assert r.status_code == 503
    assert len(server.seen) == 1
    r = await send(mode, retry(clock), "PATCH", server.url, content=b"x",
                   headers={"Idempotency-Key": "4711"})
    assert r.status_code == 200
    assert [s.body for s in server.seen[1:]] == [b"x", b"x"]
    server.script(Reply(502))
    r = await send(mode, retry(clock), "POST", server.url, content=b"y", opt_in=True)
    assert r.status_code == 200
    assert len(server.seen) == 5


async def test_connect_errors_are_retried_for_every_method(mode: Mode,
                                                           clock: FakeClock) -> None:
    url = f"http://127.0.0.1:{closed_port()}/"
    with pytest.raises(httpx.ConnectError):
        await send(mode, retry(clock), "POST", url, content=b"z")
    assert clock.sleeps == [0.1, 0.2]  # retried twice (nothing was ever sent)


# The next three tests run against the real server with real (short) timeouts: a socket
# read timeout is real time whatever the clock, and they prove exactly that the deadline
# reaches the socket. They assert no duration: the slow reply (3 s) is not completed when
# the call returns.

async def test_read_timeout_per_attempt_is_retried(mode: Mode, server: ScriptedServer,
                                                   clock: FakeClock) -> None:
    server.script(Reply(201, delay=3.0, body=b"late"))
    r = await send(mode, Pipeline(retry(clock), Timeout(0.05)), "GET", server.url)
    assert (r.status_code, r.text) == (200, "ok")
    assert len(server.seen) == 2
    assert 201 not in server.completed  # did not wait for the slow reply


async def test_read_timeout_on_post_is_not_retried(mode: Mode, server: ScriptedServer,
                                                   clock: FakeClock) -> None:
    server.script(Reply(200, delay=3.0))
    with pytest.raises((DeadlineExceeded, httpx.ReadTimeout)):
        await send(mode, Pipeline(retry(clock), Timeout(0.05)), "POST", server.url,
                   content=b"charge")
    assert len(server.seen) == 1
    assert server.completed == []


async def test_attempt_timeouts_are_clipped_to_the_deadline(mode: Mode, server: ScriptedServer,
                                                            clock: FakeClock) -> None:
    record: list[dict[str, float]] = []

    server.script(Reply(503), Reply(503))
    p = Pipeline(Timeout(total=2.0, clock=clock), retry(clock, base=0.5),
                 Timeout(1.5, clock=clock))
    r = await send(mode, p, "GET", server.url, record=record)
    assert r.status_code == 200
    assert [t["read"] for t in record] == pytest.approx([1.5, 1.5, 0.5])
    assert all(set(t.values()) == {t["read"]} for t in record)  # connect/write/pool too


async def test_real_deadline_cuts_a_slow_server_short(mode: Mode, server: ScriptedServer) -> None:
    server.script(Reply(200, delay=3.0))
    with pytest.raises((DeadlineExceeded, httpx.ReadTimeout)):
        await send(mode, Pipeline(Timeout(total=0.08), Retry(attempts=1)), "GET", server.url)
    assert server.completed == []  # the client gave up first


async def test_budget_spent_returns_the_failing_response(mode: Mode, server: ScriptedServer,
                                                         clock: FakeClock) -> None:
    budget = RetryBudget(ratio=0.0, min_per_second=0.0, window=10.0, clock=clock)
    server.script(Reply(503, body=b"down"))
    r = await send(mode, retry(clock, budget=budget), "GET", server.url)
    assert (r.status_code, r.text) == (503, "down")
    assert len(server.seen) == 1


async def test_fallback_answers_with_a_response(mode: Mode, server: ScriptedServer,
                                                clock: FakeClock) -> None:
    breaker = CircuitBreaker(window=1, min_calls=1, clock=clock)
    breaker.force_open()
    p = Pipeline(Fallback(lambda e: httpx.Response(202, text="queued"), on=CircuitOpen), breaker)
    r = await send(mode, p, "GET", server.url)
    assert (r.status_code, r.text) == (202, "queued")
    assert server.seen == []
    bad = Pipeline(Fallback(lambda e: "not a response", on=CircuitOpen), breaker)
    with pytest.raises(TypeError, match=r"httpx\.Response"):
        await send(mode, bad, "GET", server.url)
