"""Properties of the worker on random failure patterns (Hypothesis, virtual time)."""

from __future__ import annotations

import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import CircuitOpen, DeferredQueue
from stormguard.queue import Backoff
from stormguard.testing import FakeClock

# per job: a list of outcomes of its successive calls ("fail", "open", then success)
PATTERNS = st.lists(st.lists(st.sampled_from(["fail", "open"]), max_size=6),
                    min_size=1, max_size=8)


def run(url: str, patterns: list[list[str]], max_attempts: int, concurrency: int,
        asyncio_: bool) -> None:
    clock = FakeClock()
    q = DeferredQueue(url, clock=clock)
    calls: dict[int, int] = {}
    for i in range(len(patterns)):
        q.defer("job", {"i": i}, key=f"job:{i}")

    def outcome(i: int) -> None:
        n = calls.get(i, 0)
        calls[i] = n + 1
        plan = patterns[i]
        if n < len(plan):
            if plan[n] == "open":
                raise CircuitOpen(remaining=5.0)
            raise RuntimeError(f"failure {n}")

    async def ahandler(i: int) -> None:
        outcome(i)

    worker = q.worker({"job": ahandler if asyncio_ else outcome},
                      max_attempts=max_attempts, concurrency=concurrency,
                      backoff=Backoff(base=0.5, jitter=0.5))
    if asyncio_:
        assert clock.run(worker.adrain(timeout=100_000))
    else:
        assert worker.drain(timeout=100_000)
    dead = {d.payload["i"]: d for d in q.dead()}
    for i, plan in enumerate(patterns):
        # the calls until success or death: a "fail" spends an attempt, an "open" does not
        failures = 0
        expected_calls = 0
        died = False
        for step in [*plan, "ok"]:
            expected_calls += 1
            if step == "fail":
                failures += 1
                if failures >= max_attempts:
                    died = True
                    break
            elif step == "ok":
                break
        assert calls[i] == expected_calls, (i, plan, calls[i])
        if died:
            assert dead[i].attempts == max_attempts
            assert dead[i].error == f"RuntimeError: failure {expected_calls - 1}"
        else:
            assert i not in dead
    assert q.stats() == {"pending": 0, "in_flight": 0, "dead": len(dead)}
    q.close()


@settings(max_examples=80, deadline=None)
@given(PATTERNS, st.integers(1, 4), st.integers(1, 4), st.booleans())
def test_memory_worker_spends_attempts_only_on_failures(
        patterns: list[list[str]], max_attempts: int, concurrency: int, asyncio_: bool) -> None:
    run("memory://", patterns, max_attempts, concurrency, asyncio_)


@settings(max_examples=10, deadline=None)
@given(PATTERNS, st.integers(1, 4), st.booleans())
def test_sqlite_worker_spends_attempts_only_on_failures(
        patterns: list[list[str]], max_attempts: int, asyncio_: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run(f"sqlite:///{tmp}/q.db", patterns, max_attempts, 1, asyncio_)


