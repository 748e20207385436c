"""DeferredQueue and its worker on every backend, in virtual time."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import threading
from typing import Any

import pytest

from stormguard import (
    CircuitBreaker,
    CircuitOpen,
    ConfigError,
    DeferredQueue,
    Pipeline,
    StormguardError,
    TransientError,
)
from stormguard.queue import Backoff, JobDead, JobRetryScheduled, WorkerPaused
from stormguard.testing import FakeClock
from tests.queue.conftest import MakeQueue

EXACT = Backoff(jitter=0.0)  # 1, 2, 4, 8 ... s


class Recorder:
    """A handler recording (virtual time, arguments) of every call."""

    def __init__(self, clock: FakeClock, fail: int = 0, exc: BaseException | None = None) -> None:
        self.clock = clock
        self.calls: list[tuple[float, dict[str, Any]]] = []
        self.fail = fail
        self.exc = exc
        self.lock = threading.Lock()

    def __call__(self, **kwargs: Any) -> None:
        with self.lock:
            self.calls.append((self.clock.monotonic(), kwargs))
            n = len(self.calls)
        if n <= self.fail:
            raise self.exc if self.exc is not None else RuntimeError(f"provider down ({n})")


def test_defer_then_drain_calls_the_handler_with_the_payload(
        queue: DeferredQueue, clock: FakeClock) -> None:
    rec = Recorder(clock)
    ids = [queue.defer("send_sms", {"order": i, "to": f"+88017{i:08d}"}) for i in range(5)]
    assert len(set(ids)) == 5
    assert queue.stats() == {"pending": 5, "in_flight": 0, "dead": 0}
    assert queue.worker({"send_sms": rec}, concurrency=1).drain(timeout=10) is True
    assert [kw for _, kw in rec.calls] == [{"order": i, "to": f"+88017{i:08d}"}
                                           for i in range(5)]
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 0}


def test_an_idempotency_key_enqueues_once_while_pending_or_in_flight(
        queue: DeferredQueue, clock: FakeClock) -> None:
    first = queue.defer("send_sms", {"order": 1}, key="sms:1")
    assert queue.defer("send_sms", {"order": 1}, key="sms:1") == first
    other = queue.defer("send_sms", {"order": 2}, key="sms:2")
    assert other != first
    jobs = queue.backend.take(10, clock.wall(), 30.0, "test")  # in flight now
    assert sorted(j.id for j in jobs) == sorted([first, other])
    assert queue.defer("send_sms", {"order": 1}, key="sms:1") == first
    assert queue.stats() == {"pending": 0, "in_flight": 2, "dead": 0}
    for job in jobs:
        assert queue.backend.ack(job)
    # done: the key is free again, the same key is new work
    again = queue.defer("send_sms", {"order": 1}, key="sms:1")
    assert again not in (first, other)
    assert queue.stats()["pending"] == 1


@pytest.mark.parametrize(("value", "problem"), [
    (object(), "object value cannot be stored as JSON"),
    (math.nan, "float value cannot be stored as JSON"),
    ({1, 2}, "set value cannot be stored as JSON"),
    (b"bytes", "bytes value cannot be stored as JSON"),
])
def test_a_payload_json_cannot_hold_is_a_type_error_naming_it(
        queue: DeferredQueue, value: object, problem: str) -> None:
    with pytest.raises(TypeError) as err:
        queue.defer("send_sms", {"order": 1, "to": value})
    assert str(err.value).startswith(f"payload['to']: {problem}")
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 0}


def test_bad_arguments_of_defer(queue: DeferredQueue) -> None:
    with pytest.raises(TypeError, match="payload: must be a dict"):
        queue.defer("send_sms", [1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a Python identifier"):
        queue.defer("send_sms", {"not a name": 1})
    with pytest.raises(ConfigError, match="task: must not be empty"):
        queue.defer("", {})
    with pytest.raises(ConfigError, match="key: must not be empty"):
        queue.defer("send_sms", {}, key="")
    with pytest.raises(ConfigError, match="key: must be a string"):
        queue.defer("send_sms", {}, key=4711)  # type: ignore[arg-type]
    assert queue.stats()["pending"] == 0


def test_failed_attempts_are_retried_with_backoff_then_dead(
        queue: DeferredQueue, clock: FakeClock) -> None:
    rec = Recorder(clock, fail=100)
    events: list[object] = []
    job = queue.defer("send_sms", {"order": 7})
    worker = queue.worker({"send_sms": rec}, max_attempts=4, backoff=EXACT, concurrency=1,
                          listeners=(events.append,))
    t0 = clock.monotonic()
    assert worker.drain(timeout=60) is True
    times = [t - t0 for t, _ in rec.calls]
    assert len(times) == 4
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # each retry waits its backoff (1, 2, 4 s), give or take the worker's poll interval
    for gap, nominal in zip(gaps, (1.0, 2.0, 4.0), strict=True):
        assert nominal - 1e-6 <= gap <= nominal + worker.poll_interval + 1e-6
    [dead] = queue.dead()
    assert (dead.id, dead.task, dead.payload, dead.attempts) == (job, "send_sms",
                                                                 {"order": 7}, 4)
    assert dead.error == "RuntimeError: provider down (4)"
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 1}
    retries = [e for e in events if isinstance(e, JobRetryScheduled)]
    assert [(e.attempt, e.delay) for e in retries] == [(1, 1.0), (2, 2.0), (3, 4.0)]
    assert [(e.job_id, e.attempts) for e in events if isinstance(e, JobDead)] == [(job, 4)]


def test_the_default_backoff_is_short_and_capped() -> None:
    b = Backoff()
    first = [b(1) for _ in range(200)]
    assert all(0.5 <= d <= 1.0 for d in first)
    assert max(b(n) for n in range(1, 200) for _ in range(5)) <= 60.0
    assert min(b(n) for n in range(20, 30)) >= 30.0
    with pytest.raises(ConfigError, match=r"backoff\.max_delay"):
        Backoff(base=10, max_delay=5)


def test_unknown_task_goes_to_the_dead_letters(queue: DeferredQueue, clock: FakeClock) -> None:
    queue.defer("send_fax", {"to": "1"})
    queue.defer("send_sms", {"to": "2"})
    rec = Recorder(clock)
    assert queue.worker({"send_sms": rec}).drain(timeout=10)
    [dead] = queue.dead()
    assert (dead.task, dead.payload, dead.attempts) == ("send_fax", {"to": "1"}, 0)
    assert "unknown task 'send_fax'" in dead.error
    assert [kw for _, kw in rec.calls] == [{"to": "2"}]


def test_retry_dead_puts_dead_letters_back_with_no_attempts(
        queue: DeferredQueue, clock: FakeClock) -> None:
    queue.defer("send_sms", {"order": 1}, key="sms:1")
    queue.defer("send_sms", {"order": 2})
    failing = Recorder(clock, fail=100)
    assert queue.worker({"send_sms": failing}, max_attempts=2, backoff=EXACT).drain(timeout=60)
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 2}
    dead = {d.payload["order"]: d for d in queue.dead()}
    assert {d.attempts for d in dead.values()} == {2}
    assert queue.retry_dead() == 2
    assert queue.stats() == {"pending": 2, "in_flight": 0, "dead": 0}
    # the revived job keeps its id, and its key is held again while it is pending
    assert queue.defer("send_sms", {"order": 1}, key="sms:1") == dead[1].id
    assert queue.stats()["pending"] == 2
    flaky = Recorder(clock, fail=1)  # attempts were reset: one failure is not the last
    assert queue.worker({"send_sms": flaky}, max_attempts=2, backoff=EXACT).drain(timeout=60)
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 0}
    # whichever job called first failed once and ran again (the worker's 8 threads run
    # the two at once: either may call first)
    orders = [kw["order"] for _, kw in flaky.calls]
    assert sorted(orders) in ([1, 1, 2], [1, 2, 2])
    assert orders.count(orders[0]) == 2


def test_circuit_open_is_not_a_failed_attempt_and_the_worker_waits(
        queue: DeferredQueue, clock: FakeClock) -> None:
    breaker = CircuitBreaker(window=2, failure_rate=1.0, min_calls=2, open_for=30.0,
                             half_open_calls=1, clock=clock)
    rec = Recorder(clock, fail=2)  # two failures open the breaker
    for i in range(6):
        queue.defer("send_sms", {"order": i})
    events: list[object] = []
    # max_attempts=1: any failed attempt is final, so a rejection counted as one would
    # bury its job
    worker = queue.worker({"send_sms": rec}, pipeline=Pipeline(breaker), max_attempts=1,
                          concurrency=1, listeners=(events.append,))
    t0 = clock.monotonic()
    assert worker.drain(timeout=120) is True
    assert [d.payload["order"] for d in queue.dead()] == [0, 1]
    assert sorted(kw["order"] for _, kw in rec.calls[2:]) == [2, 3, 4, 5]
    # no call reached the provider while the breaker was open
    assert all(t - t0 >= 30.0 - 1e-6 for t, _ in rec.calls[2:])
    paused = [e for e in events if isinstance(e, WorkerPaused)]
    assert len(paused) == 1  # the worker waited the whole open time after one rejection
    assert paused[0].reason == "CircuitOpen"
    assert paused[0].seconds == pytest.approx(30.0)
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 2}


class SlotLater(StormguardError):
    """What a shaper raises when its slot is too far (ShaperFull): ``retry_after``."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"next slot in {retry_after} s")
        self.retry_after = retry_after


def test_an_error_with_retry_after_pauses_the_worker_without_an_attempt(
        queue: DeferredQueue, clock: FakeClock) -> None:
    rec = Recorder(clock, fail=1, exc=SlotLater(7.5))
    queue.defer("send_sms", {"order": 1})
    worker = queue.worker({"send_sms": rec}, max_attempts=1, concurrency=1)
    assert worker.drain(timeout=60)
    assert len(rec.calls) == 2
    assert rec.calls[1][0] - rec.calls[0][0] >= 7.5 - 1e-6
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 0}


def test_a_transient_error_retry_after_sets_the_retry_delay(
        queue: DeferredQueue, clock: FakeClock) -> None:
    rec = Recorder(clock, fail=1, exc=TransientError("429", retry_after=20.0))
    queue.defer("send_sms", {"order": 1})
    assert queue.worker({"send_sms": rec}, backoff=EXACT).drain(timeout=60)
    assert len(rec.calls) == 2
    assert rec.calls[1][0] - rec.calls[0][0] >= 20.0 - 1e-6


def test_a_job_whose_worker_died_is_delivered_again_after_the_visibility_timeout(
        make_queue: MakeQueue, clock: FakeClock, backend: str) -> None:
    if backend == "redis":
        pytest.skip("Redis measures lease idleness on the server's clock: "
                    "test_redis.py covers it in real time")
    queue = make_queue(clock)
    job = queue.defer("send_sms", {"order": 1})
    [held] = queue.backend.take(1, clock.wall(), 30.0, "dead-worker")  # and never answers
    rec = Recorder(clock)
    t0 = clock.monotonic()
    assert queue.worker({"send_sms": rec}, visibility_timeout=30.0).drain(timeout=100)
    assert len(rec.calls) == 1
    assert rec.calls[0][0] - t0 == pytest.approx(30.0, abs=0.11)
    assert not queue.backend.ack(held)  # the dead worker's lease is gone
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 0}
    assert held.id == job


def test_a_stale_worker_answer_changes_nothing(
        make_queue: MakeQueue, clock: FakeClock, backend: str) -> None:
    if backend == "redis":
        pytest.skip("lease expiry on the server's clock: covered in test_redis.py")
    queue = make_queue(clock)
    queue.defer("send_sms", {"order": 1})
    [a] = queue.backend.take(1, clock.wall(), 10.0, "a")
    clock.advance(11)
    [b] = queue.backend.take(1, clock.wall(), 10.0, "b")
    assert (a.id, a.attempts) == (b.id, b.attempts)
    assert not queue.backend.retry_later(a, clock.wall(), 1, "late")
    assert not queue.backend.release(a, clock.wall())
    assert not queue.backend.bury(a, 1, "late", clock.wall())
    assert not queue.backend.ack(a)
    assert queue.stats() == {"pending": 0, "in_flight": 1, "dead": 0}
    assert queue.backend.ack(b)
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 0}


def test_adrain_timeout_hands_back_the_jobs_it_holds(
        queue: DeferredQueue, clock: FakeClock) -> None:
    started: list[int] = []

    async def stuck(order: int) -> None:
        started.append(order)
        await asyncio.Event().wait()  # never returns

    for i in range(5):
        queue.defer("send_sms", {"order": i})

    async def main() -> bool:
        worker = queue.worker({"send_sms": stuck}, concurrency=3)
        return await worker.adrain(timeout=5.0)

    t0 = clock.monotonic()
    assert clock.run(main()) is False
    assert clock.monotonic() - t0 == pytest.approx(5.0, abs=0.11)
    assert sorted(started) == [0, 1, 2]
    # pending again at once, attempts unchanged
    assert queue.stats() == {"pending": 5, "in_flight": 0, "dead": 0}
    jobs = queue.backend.take(10, clock.wall(), 1.0, "after")
    assert len(jobs) == 5
    assert {j.attempts for j in jobs} == {0}


def test_drain_timeout_hands_back_the_jobs_it_holds_threads(make_queue: MakeQueue) -> None:
    # real time: the handler threads are really blocked, and a thread pool waits on them
    # in real time (virtual time would never move)
    queue = make_queue()
    gate = threading.Event()

    def stuck(order: int) -> None:
        gate.wait(10)  # real time: a blocked thread; released at the end of the test

    for i in range(4):
        queue.defer("send_sms", {"order": i})
    try:
        worker = queue.worker({"send_sms": stuck}, concurrency=2, poll_interval=0.02)
        assert worker.drain(timeout=0.3) is False
        assert queue.stats() == {"pending": 4, "in_flight": 0, "dead": 0}
    finally:
        gate.set()


def test_arun_works_until_stop_and_bounds_concurrency(
        queue: DeferredQueue, clock: FakeClock) -> None:
    active = peak = 0
    done: list[int] = []
    all_done = asyncio.Event()

    async def send(order: int) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(1.0)  # virtual time: a 1 s provider call
        active -= 1
        done.append(order)
        if len(done) == 40:
            all_done.set()

    for i in range(40):
        queue.defer("send_sms", {"order": i})

    async def main() -> float:
        worker = queue.worker({"send_sms": send}, concurrency=8)
        task = asyncio.ensure_future(worker.arun())
        t0 = clock.monotonic()
        await all_done.wait()
        elapsed = clock.monotonic() - t0
        worker.stop()
        await task
        return elapsed

    elapsed = clock.run(main())
    assert peak == 8
    assert sorted(done) == list(range(40))
    assert 5.0 - 1e-6 <= elapsed <= 5.0 + 5 * 0.2  # 40 jobs / 8 at a time x 1 s, plus polling
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 0}


def test_threads_bound_concurrency(queue: DeferredQueue, clock: FakeClock) -> None:
    lock = threading.Lock()
    active = peak = 0
    calls = 0
    release = threading.Barrier(4, timeout=10)

    def send(order: int) -> None:
        nonlocal active, peak, calls
        with lock:
            active += 1
            calls += 1
            peak = max(peak, active)
            first_round = calls <= 4
        if first_round:
            release.wait()  # real threads: all four slots are busy at once
        with lock:
            active -= 1

    for i in range(20):
        queue.defer("send_sms", {"order": i})
    assert queue.worker({"send_sms": send}, concurrency=4).drain(timeout=30)
    assert peak == 4
    assert calls == 20


def test_a_long_handler_keeps_its_lease(make_queue: MakeQueue, clock: FakeClock,
                                        backend: str) -> None:
    if backend == "redis":
        pytest.skip("lease expiry on the server's clock: covered in test_redis.py")
    queue = make_queue(clock)
    calls: list[float] = []

    async def slow(order: int) -> None:
        calls.append(clock.monotonic())
        await asyncio.sleep(100.0)  # virtual: far longer than the visibility timeout

    queue.defer("send_sms", {"order": 1})

    async def main() -> bool:
        worker = queue.worker({"send_sms": slow}, visibility_timeout=10.0, concurrency=4)
        return await worker.adrain(timeout=300)

    assert clock.run(main()) is True
    assert len(calls) == 1  # never delivered a second time while running


def test_worker_arguments_are_checked(queue: DeferredQueue) -> None:
    with pytest.raises(ConfigError, match="handlers"):
        queue.worker(["send_sms"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"handlers\['send_sms'\]: must be callable"):
        queue.worker({"send_sms": 42})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="concurrency: must be >= 1"):
        queue.worker({}, concurrency=0)
    with pytest.raises(ConfigError, match="max_attempts"):
        queue.worker({}, max_attempts=0)
    with pytest.raises(ConfigError, match="visibility_timeout"):
        queue.worker({}, visibility_timeout=-1)
    with pytest.raises(ConfigError, match="pipeline"):
        queue.worker({}, pipeline="breaker")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must not hold a queue's fallback"):
        queue.worker({}, pipeline=Pipeline(queue.fallback("t"), CircuitBreaker()))


def test_circuit_open_from_the_handler_itself_counts_the_same(
        queue: DeferredQueue, clock: FakeClock) -> None:
    rec = Recorder(clock, fail=1, exc=CircuitOpen(remaining=12.0))
    queue.defer("send_sms", {"order": 1})
    assert queue.worker({"send_sms": rec}, max_attempts=1).drain(timeout=60)
    assert rec.calls[1][0] - rec.calls[0][0] >= 12.0 - 1e-6
    assert queue.dead() == []


def test_a_breaker_pause_holds_every_slot_of_the_worker(
        queue: DeferredQueue, clock: FakeClock) -> None:
    """A handler whose breaker is open pauses the whole worker before its job is given
    back: a dispatcher round for another free slot, run in the gap between the two, must
    not take the job and call the handler inside the breaker's wait. The gap is widened
    on purpose: the pause waits (real time, at most 2 s) until the dispatcher has made
    one more round; with the job given back first, that round takes it at once (seen
    under load in a whole-suite run: the second call 7.7 virtual seconds into a 12 s
    wait)."""
    rec = Recorder(clock, fail=1, exc=CircuitOpen(remaining=12.0))
    queue.defer("send_sms", {"order": 1})
    worker = queue.worker({"send_sms": rec}, concurrency=2, max_attempts=1)
    rounds = threading.Event()
    real_round, real_pause = worker._round, worker._pause

    def counting_round(n: int) -> list[Any]:
        jobs = real_round(n)
        rounds.set()
        return jobs

    def slow_pause(seconds: float) -> None:
        rounds.clear()
        rounds.wait(2.0)  # real time: the dispatcher's next round (its own thread)
        real_pause(seconds)

    worker._round = counting_round  # type: ignore[method-assign]
    worker._pause = slow_pause  # type: ignore[method-assign]
    assert worker.drain(timeout=60)
    assert len(rec.calls) == 2
    assert rec.calls[1][0] - rec.calls[0][0] >= 12.0 - 1e-6


def test_jobs_a_round_took_while_a_pause_began_are_given_back(
        queue: DeferredQueue, clock: FakeClock) -> None:
    """A round already on its way when another slot's handler pauses the worker: what it
    took goes back untouched and is run when the pause ends."""
    rec = Recorder(clock)
    queue.defer("send_sms", {"order": 1})
    worker = queue.worker({"send_sms": rec}, concurrency=2)
    real_round = worker._round
    paused = []

    def round_meeting_a_pause(n: int) -> list[Any]:
        jobs = real_round(n)
        if jobs and not paused:  # the breaker opened on another slot meanwhile
            paused.append(clock.monotonic())
            worker._pause(5.0)
        return jobs

    worker._round = round_meeting_a_pause  # type: ignore[method-assign]
    assert worker.drain(timeout=60)
    assert len(rec.calls) == 1
    assert rec.calls[0][0] - paused[0] >= 5.0 - 1e-6
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 0}


def test_asyncio_worker_with_a_breaker_and_a_timeout(queue: DeferredQueue,
                                                     clock: FakeClock) -> None:
    """The whole flow on FakeClock.run: a slow provider times out, the breaker opens, the
    worker waits it out without spending attempts, then every job is delivered."""
    from stormguard import Timeout

    breaker = CircuitBreaker(window=4, failure_rate=0.5, min_calls=4, open_for=30.0,
                             half_open_calls=1, clock=clock)
    pipeline = Pipeline(breaker, Timeout(1.0, clock=clock))
    slow_until = clock.monotonic() + 20.0
    delivered: list[int] = []
    events: list[object] = []

    async def send(order: int) -> None:
        if clock.monotonic() < slow_until:
            await asyncio.sleep(5.0)  # virtual: the provider takes 5 s, the timeout 1 s
        delivered.append(order)

    for i in range(30):
        queue.defer("send_sms", {"order": i}, key=f"sms:{i}")

    async def main() -> bool:
        worker = queue.worker({"send_sms": send}, pipeline=pipeline, concurrency=4,
                              max_attempts=3, backoff=EXACT, listeners=(events.append,))
        return await worker.adrain(timeout=600)

    t0 = clock.monotonic()
    assert clock.run(main()) is True
    assert sorted(delivered) == list(range(30))  # each exactly once
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 0}
    paused = [e for e in events if isinstance(e, WorkerPaused)]
    assert paused
    assert all(e.reason == "CircuitOpen" for e in paused)
    # the timed-out attempts were failed attempts, but none reached max_attempts
    retried = [e for e in events if isinstance(e, JobRetryScheduled)]
    assert retried
    assert all(e.error.startswith("DeadlineExceeded") for e in retried)
    assert clock.monotonic() - t0 >= 30.0


def test_a_job_that_keeps_killing_its_worker_goes_to_the_dead_letters(
        make_queue: MakeQueue, clock: FakeClock, backend: str) -> None:
    if backend == "redis":
        pytest.skip("lease expiry on the server's clock: covered in test_redis.py")
    queue = make_queue(clock)
    job = queue.defer("send_sms", {"order": 1})
    for lost in range(3):  # three workers take it and die with it (their leases end)
        [held] = queue.backend.take(1, clock.wall(), 10.0, f"doomed-{lost}")
        assert held.lost == lost
        clock.advance(10.5)
    rec = Recorder(clock)
    assert queue.worker({"send_sms": rec}, max_attempts=3).drain(timeout=10)
    assert rec.calls == []  # not run a fourth time
    [dead] = queue.dead()
    assert (dead.id, dead.attempts) == (job, 0)
    assert dead.error.startswith("lost 3 times: its worker crashed")


def test_a_handed_back_job_is_not_counted_as_lost(queue: DeferredQueue,
                                                  clock: FakeClock) -> None:
    queue.defer("send_sms", {"order": 1})
    for _ in range(5):
        [held] = queue.backend.take(1, clock.wall(), 10.0, "w")
        assert held.lost == 0
        assert queue.backend.release(held, clock.wall())
    [held] = queue.backend.take(1, clock.wall(), 10.0, "w")
    assert queue.backend.retry_later(held, clock.wall(), 1, "boom")
    [held] = queue.backend.take(1, clock.wall() + 1, 10.0, "w")
    assert (held.lost, held.attempts) == (0, 1)


def test_async_handlers_need_the_asyncio_worker(queue: DeferredQueue, clock: FakeClock) -> None:
    async def send(order: int) -> None: ...

    queue.defer("send_sms", {"order": 1})
    with pytest.raises(ConfigError, match=r"handlers\['send_sms'\]: is async"):
        queue.worker({"send_sms": send}).drain(timeout=1)
    assert queue.stats() == {"pending": 1, "in_flight": 0, "dead": 0}  # nothing taken

    def sneaky(order: int) -> object:
        return send(order)  # a sync function returning a coroutine

    assert queue.worker({"send_sms": sneaky}, max_attempts=1).drain(timeout=10)
    [dead] = queue.dead()  # never acknowledged as done
    assert "returned an awaitable" in dead.error


def test_finish_acknowledges_then_takes(make_queue: MakeQueue, clock: FakeClock,
                                        backend: str) -> None:
    queue = make_queue(clock)
    ids = [queue.defer("t", {"n": i}, key=f"k{i}") for i in range(4)]
    b = queue.backend
    first = b.take(2, clock.wall(), 30.0, "w")
    assert [j.id for j in first] == ids[:2]
    stale = dataclasses.replace(first[1], token="0-1" if backend == "redis" else "nobody:1")
    acked, more = b.finish([first[0], stale], 5, clock.wall(), 30.0, "w")
    assert acked == [True, False]  # a lease this worker does not hold changes nothing
    assert [j.id for j in more] == ids[2:]
    assert queue.stats() == {"pending": 0, "in_flight": 3, "dead": 0}
    acked, none = b.finish([first[1], *more], 0, clock.wall(), 30.0, "w")
    assert (acked, none) == ([True, True, True], [])
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 0}
    # the keys were freed with the jobs
    assert queue.defer("t", {"n": 0}, key="k0") not in ids
