"""Retry and RetryBudget scenarios (FakeClock), sync and async alike."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import (
    ConfigError,
    DeadlineExceeded,
    Pipeline,
    Retry,
    RetryBudget,
    RetryBudgetExhausted,
    Timeout,
    TransientError,
)
from stormguard.observability.events import BudgetExhausted, Event, RetryGaveUp, RetryScheduled
from stormguard.resilience.retry import restrict
from stormguard.testing import FakeClock
from tests.resilience.conftest import Boom, Mode, run_threads


class Flaky:
    """Fails ``failures`` times with ``exc`` (a factory), then returns "ok"."""

    def __init__(self, failures: int, exc: Any = lambda: TransientError("flaky")) -> None:
        self.failures = failures
        self.exc = exc
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc()
        return "ok"


async def test_attempts_counts_the_first_and_reraises_the_original(mode: Mode,
                                                                   clock: FakeClock) -> None:
    fn = Flaky(10)
    r = Retry(attempts=4, base=0.1, jitter="none", clock=clock)
    err = await mode.outcome(r, fn)
    assert isinstance(err, TransientError)
    assert str(err) == "flaky"
    assert fn.calls == 4
    assert clock.sleeps == pytest.approx([0.1, 0.2, 0.4])


async def test_succeeds_after_transient_failures(mode: Mode, clock: FakeClock) -> None:
    fn = Flaky(2)
    assert await mode.call(Retry(attempts=3, clock=clock), fn) == "ok"
    assert fn.calls == 3


async def test_backoff_is_capped_at_max_delay(mode: Mode, clock: FakeClock) -> None:
    r = Retry(attempts=6, base=1.0, multiplier=3.0, max_delay=5.0, jitter="none", clock=clock)
    await mode.outcome(r, Flaky(10))
    assert clock.sleeps == [1.0, 3.0, 5.0, 5.0, 5.0]


@pytest.mark.parametrize("exc", [TimeoutError, ConnectionResetError, DeadlineExceeded,
                                 TransientError])
async def test_default_retries_timeouts_connection_and_transient_errors(
        mode: Mode, clock: FakeClock, exc: type[Exception]) -> None:
    fn = Flaky(1, exc)
    assert await mode.call(Retry(attempts=2, clock=clock), fn) == "ok"


@pytest.mark.parametrize("exc", [ValueError, Boom, PermissionError, KeyError])
async def test_default_never_retries_other_errors(mode: Mode, clock: FakeClock,
                                                  exc: type[Exception]) -> None:
    fn = Flaky(1, exc)
    events: list[Event] = []
    err = await mode.outcome(Retry(attempts=5, clock=clock, listeners=(events.append,)), fn)
    assert isinstance(err, exc)
    assert fn.calls == 1
    assert clock.sleeps == []
    assert [(e.reason, e.attempt) for e in events if isinstance(e, RetryGaveUp)] == [
        ("not_retryable", 1)]


async def test_retry_on_classes_and_predicates(mode: Mode, clock: FakeClock) -> None:
    class HTTPError(Exception):
        def __init__(self, status: int) -> None:
            super().__init__(status)
            self.status = status

    by_status = Retry(attempts=3, clock=clock,
                      retry_on=lambda e: isinstance(e, HTTPError) and e.status >= 500)
    fn503 = Flaky(1, lambda: HTTPError(503))
    assert await mode.call(by_status, fn503) == "ok"
    fn400 = Flaky(1, lambda: HTTPError(400))
    assert isinstance(await mode.outcome(by_status, fn400), HTTPError)
    assert fn400.calls == 1
    by_class = Retry(attempts=3, retry_on=KeyError, clock=clock)
    assert await mode.call(by_class, Flaky(2, KeyError)) == "ok"


async def test_retry_after_sets_the_delay_and_is_capped(mode: Mode, clock: FakeClock) -> None:
    r = Retry(attempts=3, base=0.1, max_delay=1.0, max_retry_after=10.0, clock=clock)
    fn = Flaky(2, iter([TransientError(retry_after=2.5), TransientError(retry_after=60)]).__next__)
    assert await mode.call(r, fn) == "ok"
    assert clock.sleeps == [2.5, 10.0]


async def test_retry_after_cap_defaults_to_max_delay(mode: Mode, clock: FakeClock) -> None:
    r = Retry(attempts=2, max_delay=3.0, clock=clock)
    await mode.call(r, Flaky(1, lambda: TransientError(retry_after=30)))
    assert clock.sleeps == [3.0]


async def test_never_sleeps_past_the_deadline(mode: Mode, clock: FakeClock) -> None:
    """Timeout(total=1): delays 0.4 + 0.8 would cross it, so Retry gives up after one."""
    events: list[Event] = []
    r = Retry(attempts=10, base=0.4, jitter="none", clock=clock, listeners=(events.append,))
    fn = Flaky(10)
    err = await mode.outcome(Pipeline(Timeout(total=1.0, clock=clock), r), fn)
    assert isinstance(err, TransientError)  # the last real error, not a made-up timeout
    assert clock.sleeps == [0.4]
    assert fn.calls == 2
    gave_up = [e for e in events if isinstance(e, RetryGaveUp)]
    assert [(e.reason, e.attempt) for e in gave_up] == [("deadline", 2)]


async def test_min_attempt_time_must_fit_after_the_delay(mode: Mode, clock: FakeClock) -> None:
    r = Retry(attempts=10, base=0.5, jitter="none", min_attempt_time=0.4, clock=clock)
    fn = Flaky(10)
    await mode.outcome(Pipeline(Timeout(total=1.0, clock=clock), r), fn)
    assert fn.calls == 2  # 0.5 delay + 0.4 fits in 1.0; the next 1.0 does not
    assert clock.sleeps == [0.5]


async def test_attempt_that_eats_the_deadline_is_not_retried(mode: Mode, clock: FakeClock) -> None:
    def slow_fail() -> None:
        clock.advance(2.0)
        raise TransientError("late")

    err = await mode.outcome(
        Pipeline(Timeout(total=1.0, clock=clock), Retry(attempts=5, clock=clock)), slow_fail)
    assert isinstance(err, DeadlineExceeded)
    assert isinstance(err.__cause__, TransientError)
    assert clock.sleeps == []


async def test_events(mode: Mode, clock: FakeClock) -> None:
    events: list[Event] = []
    r = Retry(attempts=3, base=0.1, jitter="none", clock=clock, name="sms")
    r.add_listener(events.append)
    await mode.outcome(r, Flaky(5))
    assert [(type(e).__name__, e.policy) for e in events] == [
        ("RetryScheduled", "sms"), ("RetryScheduled", "sms"), ("RetryGaveUp", "sms")]
    first = events[0]
    assert isinstance(first, RetryScheduled)
    assert (first.attempt, first.delay) == (1, 0.1)
    assert isinstance(first.error, TransientError)


# -- jitter -------------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(base=st.floats(0.0, 2.0), mult=st.floats(1.0, 4.0), cap=st.floats(2.0, 60.0),
       attempt=st.integers(1, 30), seed=st.integers(0, 2**32),
       previous=st.floats(0.0, 60.0))
def test_jitter_stays_in_its_documented_range(base: float, mult: float, cap: float,
                                              attempt: int, seed: int, previous: float) -> None:
    nominal = min(cap, base * mult ** (attempt - 1))
    modes = {name: Retry(attempts=2, base=base, multiplier=mult, max_delay=cap, jitter=name,
                         rng=random.Random(seed)) for name in ("full", "equal", "decorrelated",
                                                              "none")}
    full = modes["full"].backoff(attempt, previous)
    assert 0.0 <= full <= nominal
    equal = modes["equal"].backoff(attempt, previous)
    assert nominal / 2 <= equal <= nominal
    dec = modes["decorrelated"].backoff(attempt, previous)
    assert base <= dec <= min(cap, max(previous, base) * 3) + 1e-12
    assert modes["none"].backoff(attempt, previous) == nominal


def test_full_jitter_spreads_clients() -> None:
    r = Retry(base=1.0, jitter="full", rng=random.Random(7))
    delays = [r.backoff(1, 0.0) for _ in range(1000)]
    assert 0.45 < sum(delays) / len(delays) < 0.55
    assert min(delays) < 0.05
    assert max(delays) > 0.95


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"attempts": 0}, "attempts"), ({"base": -1}, "base"), ({"multiplier": 0.5}, "multiplier"),
    ({"jitter": "random"}, "jitter"), ({"base": 10, "max_delay": 1}, "base"),
    ({"retry_on": "TimeoutError"}, "retry_on"), ({"budget": 0.1}, "budget"),
    ({"max_delay": float("nan")}, "max_delay"),
])
def test_config_errors(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        Retry(**kwargs)
    assert info.value.field == field


# -- budget -------------------------------------------------------------------------------------

async def test_budget_exhausted_raises_wrapping_the_original(mode: Mode, clock: FakeClock) -> None:
    budget = RetryBudget(ratio=0.0, min_per_second=0.2, window=10.0, clock=clock)  # 2 retries
    events: list[Event] = []
    r = Retry(attempts=10, base=0.0, clock=clock, budget=budget, listeners=(events.append,))
    fn = Flaky(100)
    err = await mode.outcome(r, fn)
    assert isinstance(err, RetryBudgetExhausted)
    assert isinstance(err.__cause__, TransientError)
    assert fn.calls == 3
    assert [type(e) for e in events][-1] is BudgetExhausted
    fn2 = Flaky(100)
    assert isinstance(await mode.outcome(r, fn2), RetryBudgetExhausted)
    assert fn2.calls == 1  # spent: no retry at all now
    clock.advance(10.0)
    assert budget.available() == pytest.approx(2.0)


async def test_budget_grows_with_first_attempts(mode: Mode, clock: FakeClock) -> None:
    budget = RetryBudget(ratio=0.1, min_per_second=0.0, window=10.0, clock=clock)
    r = Retry(attempts=2, base=0.0, clock=clock, budget=budget)
    for _ in range(30):
        await mode.call(r, lambda: "ok")
    assert budget.available() == pytest.approx(3.0)
    fns = [Flaky(1) for _ in range(5)]
    outcomes = [await mode.outcome(r, fn) for fn in fns]
    # 30 + 5 first attempts -> 3.5 retries allowed: three retried, then exhausted
    assert outcomes[:3] == ["ok"] * 3
    assert all(isinstance(o, RetryBudgetExhausted) for o in outcomes[3:])


async def test_budget_is_shared_between_retries(clock: FakeClock) -> None:
    budget = RetryBudget(ratio=0.0, min_per_second=0.1, window=10.0, clock=clock)  # 1 retry
    a = Retry(attempts=3, base=0.0, clock=clock, budget=budget)
    b = Retry(attempts=3, base=0.0, clock=clock, budget=budget)
    assert a.call(Flaky(1)) == "ok"
    with pytest.raises(RetryBudgetExhausted):
        b.call(Flaky(1))


def run_load(clock: FakeClock, retry: Retry, seconds: int, rate: int) -> list[int]:
    """``rate`` requests/s for ``seconds`` s against a dead dependency: calls it saw per second."""
    per_second = [0] * seconds
    t0 = clock.monotonic()

    def dependency() -> None:
        per_second[int(clock.monotonic() - t0 + 1e-9)] += 1
        raise TransientError("SMS provider down")

    step = 1.0 / rate
    for _ in range(seconds * rate):
        with contextlib.suppress(TransientError, RetryBudgetExhausted):
            retry.call(dependency)
        clock.advance(step)
    return per_second


def test_worked_example_1000_rps_all_failing(clock: FakeClock) -> None:
    """Seed doc section 04: attempts=4 -> ~1,100 calls/s with a 10 % budget, 4,000 without."""
    budget = RetryBudget(ratio=0.1, min_per_second=1.0, window=10.0, clock=clock)
    with_budget = run_load(clock, Retry(attempts=4, base=0.0, budget=budget, clock=clock),
                           seconds=20, rate=1000)
    steady = with_budget[10:]
    assert all(1_050 <= n <= 1_150 for n in steady), steady
    assert sum(steady) / len(steady) == pytest.approx(1_101, abs=5)

    without = run_load(clock, Retry(attempts=4, base=0.0, clock=clock), seconds=2, rate=1000)
    assert without == [4_000, 4_000]


def test_budget_never_overspent_by_threads() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.0, min_per_second=10.0, window=10.0, clock=clock)  # 100
    granted = []

    def worker() -> None:
        granted.append(sum(budget.try_spend() for _ in range(100)))

    run_threads(worker, 4)
    assert sum(granted) == 100


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"ratio": -0.1}, "ratio"), ({"window": 0}, "window"), ({"min_per_second": "1"},
                                                            "min_per_second")])
def test_budget_config_errors(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        RetryBudget(**kwargs)
    assert info.value.field == field


async def test_restrict_vetoes_retries_inside_the_block(mode: Mode, clock: FakeClock) -> None:
    r = Retry(attempts=3, base=0.0, clock=clock)
    with restrict(lambda e: "connect" in str(e)):
        fn = Flaky(1, lambda: TransientError("read timeout"))
        assert isinstance(await mode.outcome(r, fn), TransientError)
        assert fn.calls == 1
        with restrict(lambda e: "refused" in str(e)):  # nested: both must agree
            assert isinstance(await mode.outcome(r, Flaky(1, lambda: TransientError(
                "connect timeout"))), TransientError)
            assert await mode.call(r, Flaky(1, lambda: TransientError(
                "connect refused"))) == "ok"
    assert await mode.call(r, Flaky(1)) == "ok"  # restriction gone


def test_lock_free_first_attempt_counting_under_threads() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=1.0, min_per_second=0.0, window=10.0, clock=clock)

    def worker() -> None:
        for _ in range(5000):
            budget.record_attempt()

    run_threads(worker, 4)
    # documented: a racing increment may be lost, by at most a handful
    assert 19_900 <= budget.available() <= 20_000
