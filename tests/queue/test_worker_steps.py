"""A worker driven one dispatcher step at a time (``take``, ``process``, ``paused_for``,
``renew``, ``idle_delay``: what the simulator drives in virtual time), on every backend."""

from __future__ import annotations

from typing import Any

import pytest

from stormguard import CircuitOpen, DeferredQueue
from stormguard.queue import Backoff
from stormguard.queue.worker import Lease
from stormguard.testing import FakeClock


def test_take_and_process_acknowledge_with_the_next_take(queue: DeferredQueue,
                                                         clock: FakeClock) -> None:
    calls: list[int] = []

    def send(order: int) -> None:
        calls.append(order)

    for i in range(3):
        queue.defer("send_sms", {"order": i})
    worker = queue.worker({"send_sms": send}, concurrency=2)
    jobs = worker.take(2)
    assert len(jobs) == 2
    assert queue.stats() == {"pending": 1, "in_flight": 2, "dead": 0}
    assert worker.take(0) == []  # nothing done yet: nothing acknowledged, nothing taken
    for job in jobs:
        worker.process(job)
    assert sorted(calls) == sorted(j.arguments()["order"] for j in jobs)
    assert worker.completed == 0  # done, acknowledged by the next take
    assert queue.stats()["in_flight"] == 2
    (last,) = worker.take(5)
    assert worker.completed == 2
    assert queue.stats() == {"pending": 0, "in_flight": 1, "dead": 0}
    worker.process(last)
    assert worker.take(0) == []
    assert worker.completed == 3
    assert sorted(calls) == [0, 1, 2]
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 0}


def test_a_failed_attempt_is_due_later_and_idle_delay_waits_for_it(
        queue: DeferredQueue, clock: FakeClock) -> None:
    def fail(order: int) -> None:
        raise RuntimeError("provider down")

    queue.defer("send_sms", {"order": 1})
    worker = queue.worker({"send_sms": fail}, backoff=Backoff(base=0.25, jitter=0.0),
                          poll_interval=1.0)
    (job,) = worker.take(1)
    worker.process(job)  # the handler's error never propagates
    assert worker.failures == 1
    assert worker.take(1) == []  # retried in 0.25 s, not now
    assert worker.idle_delay() == pytest.approx(0.25, abs=0.01)
    clock.advance(0.25)
    (again,) = worker.take(1)
    assert again.id == job.id
    assert again.attempts == 1
    worker.process(again)
    assert worker.take(0) == []
    assert worker.idle_delay() == pytest.approx(0.5, abs=0.01)  # the second backoff
    clock.advance(10.0)
    assert worker.idle_delay() == 1.0  # due already or nothing due: poll_interval


def test_an_open_breaker_pauses_the_steps(queue: DeferredQueue, clock: FakeClock) -> None:
    def rejected(order: int) -> None:
        raise CircuitOpen(remaining=12.0)

    queue.defer("send_sms", {"order": 1})
    worker = queue.worker({"send_sms": rejected})
    assert worker.paused_for() <= 0
    (job,) = worker.take(1)
    worker.process(job)
    assert worker.failures == 0  # not a failed attempt: the job is pending again
    assert queue.stats()["pending"] == 1
    assert worker.paused_for() == pytest.approx(12.0)
    assert worker.paused_for(clock.monotonic() + 2.0) == pytest.approx(10.0)
    clock.advance(12.0)
    assert worker.paused_for() <= 0


def test_renew_extends_only_the_leases_held_half_the_visibility_timeout(
        make_queue: Any, clock: FakeClock, backend: str) -> None:
    if backend == "redis":
        pytest.skip("lease expiry on the server's clock: covered in test_redis.py")
    queue: DeferredQueue = make_queue(clock)
    queue.defer("send_sms", {"order": 1})
    worker = queue.worker({"send_sms": lambda order: None}, visibility_timeout=10.0)
    (job,) = worker.take(1)
    t0 = clock.monotonic()
    lease = Lease(job, t0)
    clock.advance(4.0)
    worker.renew([lease], clock.monotonic())
    assert lease.leased_at == t0  # held 4 s of 10: not due
    for _ in range(5):  # held well past the visibility timeout, renewed every 5 s
        clock.advance(5.0)
        worker.renew([lease], clock.monotonic())
        assert lease.leased_at == clock.monotonic()
    other = queue.worker({"send_sms": lambda order: None})
    assert other.take(1) == []  # the lease never ended: nobody else takes the job
    worker.process(job)
    assert worker.take(0) == []
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 0}
