"""queue.fallback(task): a pipeline policy that defers the failed call's arguments."""

from __future__ import annotations

from typing import Any

import pytest

from stormguard import (
    Bulkhead,
    BulkheadFull,
    CircuitBreaker,
    CircuitOpen,
    DeadlineExceeded,
    Deferred,
    DeferredQueue,
    Fallback,
    Pipeline,
    RetryBudgetExhausted,
    StorageError,
    StormguardError,
    Timeout,
    TransientError,
)
from stormguard.queue import JobDeferred, bind_payload
from stormguard.testing import FakeClock
from tests.redis_servers import start_redis


def send_sms(order: int, to: str, text: str = "your order shipped") -> str:
    raise CircuitOpen(remaining=30.0)


class ShaperFullLike(StormguardError):
    def __init__(self) -> None:
        super().__init__("no slot within max_wait")
        self.retry_after = 0.25


@pytest.mark.parametrize("exc", [
    CircuitOpen(remaining=1.0), BulkheadFull("full"), DeadlineExceeded("slow"),
    RetryBudgetExhausted("spent"), TransientError("503"), ShaperFullLike()])
def test_each_planned_failure_is_deferred(queue: DeferredQueue, exc: Exception) -> None:
    fb = queue.fallback("send_sms")
    assert isinstance(fb, Fallback)

    def provider(order: int, to: str) -> str:
        raise exc

    answer = fb.call(provider, 4711, to="+8801700000000")
    assert isinstance(answer, Deferred)
    assert answer.task == "send_sms"
    [job] = queue.backend.take(5, queue.clock.wall(), 1.0, "t")
    assert job.id == answer.job_id
    assert (job.task, job.arguments()) == ("send_sms", {"order": 4711, "to": "+8801700000000"})


def test_other_failures_and_results_pass_through(queue: DeferredQueue) -> None:
    fb = queue.fallback("send_sms")
    assert fb.call(lambda order: f"sent {order}", 1) == "sent 1"

    def broken(order: int) -> None:
        raise KeyError("a bug, not an outage")

    with pytest.raises(KeyError):
        fb.call(broken, 1)
    assert queue.stats()["pending"] == 0


def test_on_picks_the_failures(queue: DeferredQueue) -> None:
    fb = queue.fallback("send_sms", on=(KeyError,))
    with pytest.raises(CircuitOpen):
        fb.call(send_sms, 1, "x")
    assert isinstance(fb.call(lambda order: {}[order], 1), Deferred)


def test_arguments_are_bound_by_parameter_name() -> None:
    assert bind_payload(send_sms, (1, "x"), {}) == {"order": 1, "to": "x"}
    assert bind_payload(send_sms, (1,), {"to": "x", "text": "t"}) == {
        "order": 1, "to": "x", "text": "t"}

    def kw(order: int, **extra: Any) -> None: ...

    assert bind_payload(kw, (1,), {"a": 2}) == {"order": 1, "a": 2}

    def star(*numbers: int) -> None: ...

    with pytest.raises(TypeError, match=r"its \*numbers arguments have no names"):
        bind_payload(star, (1, 2), {})

    class Provider:
        def send(self, order: int, to: str) -> None: ...

    assert bind_payload(Provider().send, (1, "x"), {}) == {"order": 1, "to": "x"}


def test_the_deferred_call_runs_later_with_the_same_arguments(
        queue: DeferredQueue, clock: FakeClock) -> None:
    sent: list[tuple[int, str, str]] = []
    breaker = CircuitBreaker(window=2, failure_rate=1.0, min_calls=2, open_for=30.0,
                             clock=clock)
    breaker.force_open()
    pipeline = Pipeline(queue.fallback("send_sms"), breaker)

    def provider(order: int, to: str, text: str = "default") -> None:
        sent.append((order, to, text))

    answers = [pipeline.call(provider, i, to=f"+{i}") for i in range(3)]
    assert all(isinstance(a, Deferred) for a in answers)
    assert sent == []
    assert queue.worker({"send_sms": provider}).drain(timeout=10)
    assert sorted(sent) == [(0, "+0", "default"), (1, "+1", "default"), (2, "+2", "default")]


def test_an_argument_json_cannot_hold_is_a_type_error_and_nothing_is_written(
        queue: DeferredQueue) -> None:
    fb = queue.fallback("send_sms")
    with pytest.raises(TypeError) as err:
        fb.call(send_sms, 1, to=object())
    assert "send_sms() argument['to']" in str(err.value)
    assert isinstance(err.value.__cause__, CircuitOpen)  # why it was being deferred
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 0}


def test_the_key_function_makes_deferrals_idempotent(queue: DeferredQueue) -> None:
    fb = queue.fallback("send_sms", key=lambda p: f"sms:{p['order']}")
    a = fb.call(send_sms, 1, "x")
    b = fb.call(send_sms, 1, "x")
    c = fb.call(send_sms, 2, "x")
    assert a == b != c
    assert queue.stats()["pending"] == 2
    bad = queue.fallback("send_sms", key=lambda p: 42)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="key function must give a non-empty string"):
        bad.call(send_sms, 3, "x")


def test_events_say_what_was_deferred(queue: DeferredQueue) -> None:
    events: list[object] = []
    fb = queue.fallback("send_sms", listeners=(events.append,))
    answer = fb.call(send_sms, 1, "x")
    [ev] = [e for e in events if isinstance(e, JobDeferred)]
    assert (ev.task, ev.job_id, type(ev.cause)) == ("send_sms", answer.job_id, CircuitOpen)


def test_asyncio_calls_are_deferred(queue: DeferredQueue, clock: FakeClock,
                                    backend: str) -> None:
    async def slow(order: int, to: str) -> str:
        import asyncio

        await asyncio.sleep(10)  # virtual time
        return "sent"

    pipeline = Pipeline(queue.fallback("send_sms"), Timeout(1.0, clock=clock),
                        Bulkhead(2, clock=clock))

    async def main() -> Any:
        try:
            return await pipeline.acall(slow, 5, to="y")
        finally:
            await queue.aclose()  # this loop's connections (Redis)

    # a Redis queue defers over a real socket: let the virtual loop wait for real I/O
    # (up to 0.2 real seconds) before it jumps to the next timer
    answer = clock.run(main(), autojump_threshold=0.2 if backend == "redis" else 0.0)
    assert isinstance(answer, Deferred)
    [job] = queue.backend.take(1, clock.wall(), 1.0, "t")
    assert job.arguments() == {"order": 5, "to": "y"}


def test_a_queue_that_cannot_write_raises_storage_error_caused_by_the_failure() -> None:
    server = start_redis()
    try:
        q = DeferredQueue(server.url, timeout=0.5, connect_timeout=0.5)
        q.defer("warm", {})
        server.stop()  # SIGKILL: the queue's storage is gone
        with pytest.raises(StorageError) as err:
            q.fallback("send_sms").call(send_sms, 1, "x")
        assert isinstance(err.value.__cause__, CircuitOpen)
        q.close()
    finally:
        server.stop()
