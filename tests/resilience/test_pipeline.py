"""Fallback, Pipeline composition, decorators, listeners; the SMS-provider story end to end."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

import stormguard
from stormguard import (
    Bulkhead,
    BulkheadFull,
    CircuitBreaker,
    CircuitOpen,
    ConfigError,
    DeadlineExceeded,
    Fallback,
    Pipeline,
    Retry,
    RetryBudget,
    RetryBudgetExhausted,
    Timeout,
    TransientError,
)
from stormguard.observability.events import Event, FallbackUsed, StateChanged
from stormguard.resilience import LoggingListener, Policy, add_listener, remove_listener
from stormguard.resilience._base import Args, AsyncNext, Kwargs, Next
from stormguard.testing import FakeClock
from tests.resilience.conftest import Boom, Mode, failing, ok


def test_public_api() -> None:
    for name in ("CircuitBreaker", "Retry", "RetryBudget", "Bulkhead", "Timeout", "Fallback",
                 "Pipeline", "CircuitOpen", "BulkheadFull", "DeadlineExceeded",
                 "RetryBudgetExhausted", "TransientError"):
        assert name in stormguard.__all__
    assert stormguard.__all__ == sorted(stormguard.__all__)


# -- Fallback -----------------------------------------------------------------------------------

async def test_fallback_on_listed_exceptions_only(mode: Mode) -> None:
    fb = Fallback(lambda e: f"queued after {type(e).__name__}", on=(CircuitOpen, BulkheadFull))
    assert await mode.call(fb, failing(CircuitOpen())) == "queued after CircuitOpen"
    assert await mode.call(fb, failing(BulkheadFull())) == "queued after BulkheadFull"
    assert isinstance(await mode.outcome(fb, failing()), Boom)
    assert await mode.call(fb, ok()) == "ok"


async def test_fallback_predicate_and_result_predicate(mode: Mode) -> None:
    events: list[Event] = []
    fb = Fallback(lambda cause: ("fallback", cause), on=lambda e: "retry" in str(e),
                  result=lambda value: value is None, listeners=(events.append,))
    boom = Boom("please retry")
    assert await mode.call(fb, failing(boom)) == ("fallback", boom)
    assert isinstance(await mode.outcome(fb, failing(Boom("fatal"))), Boom)
    assert await mode.call(fb, ok(None)) == ("fallback", None)
    assert await mode.call(fb, ok(0)) == 0
    assert [e.cause for e in events if isinstance(e, FallbackUsed)] == [boom, None]


async def test_failing_fallback_propagates_its_own_error(mode: Mode) -> None:
    def handler(exc: BaseException) -> str:
        raise KeyError("fallback broke")

    err = await mode.outcome(Fallback(handler), failing())
    assert isinstance(err, KeyError)
    assert isinstance(err.__context__, Boom)


async def test_async_fallback_handler_is_awaited() -> None:
    async def handler(exc: BaseException) -> str:
        return "async fallback"

    async def boom() -> None:
        raise Boom

    assert await Fallback(handler).acall(boom) == "async fallback"


def test_fallback_config_errors() -> None:
    with pytest.raises(ConfigError) as info:
        Fallback("not callable")  # type: ignore[arg-type]
    assert info.value.field == "handler"
    with pytest.raises(ConfigError) as info:
        Fallback(str, on=(1,))  # type: ignore[arg-type]
    assert info.value.field == "on"


# -- Pipeline -----------------------------------------------------------------------------------

class Tag(Policy):
    """Records enter/exit around the call, to see the order of layers."""

    def __init__(self, label: str, log: list[str]) -> None:
        super().__init__(name=label, clock=None)
        self.log = log

    def _sync(self, nxt: Next, fn: Callable[..., Any], args: Args, kwargs: Kwargs) -> Any:
        self.log.append(f"{self.name}>")
        try:
            return nxt(fn, args, kwargs)
        finally:
            self.log.append(f"<{self.name}")

    async def _async(self, nxt: AsyncNext, fn: Callable[..., Any], args: Args,
                     kwargs: Kwargs) -> Any:
        self.log.append(f"{self.name}>")
        try:
            return await nxt(fn, args, kwargs)
        finally:
            self.log.append(f"<{self.name}")


async def test_first_listed_is_outermost(mode: Mode) -> None:
    log: list[str] = []
    p = Pipeline(Tag("a", log), Pipeline(Tag("b", log), Tag("c", log)))
    assert len(p.policies) == 3
    assert await mode.call(p, lambda x, y=0: x + y, 1, y=2) == 3
    assert log == ["a>", "b>", "c>", "<c", "<b", "<a"]


def test_pipeline_rejects_non_policies() -> None:
    with pytest.raises(ConfigError) as info:
        Pipeline(Retry(), "breaker")  # type: ignore[arg-type]
    assert info.value.field == "policies[1]"


@pytest.mark.parametrize("make", [
    lambda c: CircuitBreaker(clock=c), lambda c: Retry(clock=c), lambda c: Bulkhead(),
    lambda c: Timeout(1.0, clock=c), lambda c: Fallback(str), lambda c: Pipeline(Retry(clock=c)),
])
def test_every_policy_decorates_sync_and_async(make: Callable[[FakeClock], Policy],
                                               clock: FakeClock) -> None:
    policy = make(clock)

    @policy
    def add(x: int, y: int) -> int:
        """Adds."""
        return x + y

    @policy
    async def aadd(x: int, y: int) -> int:
        return x + y

    assert add(1, y=2) == 3
    assert add.__doc__ == "Adds."
    assert asyncio.run(aadd(2, y=3)) == 5
    assert asyncio.iscoroutinefunction(aadd)


async def test_breaker_inside_retry_counts_every_attempt(mode: Mode, clock: FakeClock) -> None:
    breaker = CircuitBreaker(window=10, min_calls=10, clock=clock)
    p = Pipeline(Retry(attempts=4, base=0.0, clock=clock), breaker)
    await mode.outcome(p, failing(TransientError()))
    assert breaker.snapshot() == (4, 4, 0)


async def test_breaker_outside_retry_counts_one_per_call(mode: Mode, clock: FakeClock) -> None:
    breaker = CircuitBreaker(window=10, min_calls=10, clock=clock)
    p = Pipeline(breaker, Retry(attempts=4, base=0.0, clock=clock))
    await mode.outcome(p, failing(TransientError()))
    assert breaker.snapshot() == (1, 1, 0)


async def test_open_breaker_inside_retry_is_not_retried(mode: Mode, clock: FakeClock) -> None:
    breaker = CircuitBreaker(window=2, min_calls=2, clock=clock)
    calls: list[int] = []

    def dep() -> None:
        calls.append(1)
        raise TransientError

    p = Pipeline(Retry(attempts=5, base=0.0, clock=clock), breaker)
    err = await mode.outcome(p, dep)
    assert isinstance(err, CircuitOpen)
    assert len(calls) == 2  # the breaker opened after two, the rest were not even tried


async def test_sms_provider_story(mode: Mode, clock: FakeClock) -> None:
    """Section 01-06 of the seed: a 30 s provider, 1 s timeout, breaker, bulkhead, fallback."""
    events: list[Event] = []
    breaker = CircuitBreaker(window=20, failure_rate=0.5, min_calls=20, open_for=30.0,
                             half_open_calls=3, clock=clock)
    sms = Pipeline(
        Fallback(lambda e: "queued", on=(CircuitOpen, BulkheadFull, DeadlineExceeded,
                                         RetryBudgetExhausted)),
        Timeout(total=3.0, clock=clock),
        Retry(attempts=3, base=0.1, clock=clock,
              budget=RetryBudget(ratio=0.1, min_per_second=1.0, window=10.0, clock=clock)),
        breaker,
        Bulkhead(max_concurrent=20),
        Timeout(1.0, clock=clock),
    )
    sms.add_listener(events.append)
    provider_calls = 0

    def send() -> str:
        nonlocal provider_calls
        provider_calls += 1
        clock.advance(30.0 if provider_down else 0.2)
        return "sent"

    provider_down = False
    assert await mode.call(sms, send) == "sent"
    provider_down = True
    answers = [await mode.call(sms, send) for _ in range(100)]
    assert set(answers) == {"queued"}
    assert breaker.state == "open"
    assert provider_calls <= 1 + 20 + 3  # it stopped calling the sick provider
    calls_when_open = provider_calls
    for _ in range(50):
        assert await mode.call(sms, send) == "queued"
    assert provider_calls == calls_when_open  # open: not called at all
    provider_down = False
    clock.advance(30.0)
    assert [await mode.call(sms, send) for _ in range(3)] == ["sent"] * 3
    assert breaker.state == "closed"
    assert ("open", "half_open") in [(e.old, e.new) for e in events
                                     if isinstance(e, StateChanged)]


def test_logging_listener_and_global_listeners(caplog: pytest.LogCaptureFixture,
                                               clock: FakeClock) -> None:
    breaker = CircuitBreaker(window=1, min_calls=1, clock=clock, name="sms")
    seen: list[Event] = []
    add_listener(seen.append)
    breaker.add_listener(LoggingListener())
    try:
        with caplog.at_level(logging.INFO, logger="stormguard"), pytest.raises(Boom):
            breaker.call(failing())
    finally:
        remove_listener(seen.append)
    assert [type(e) for e in seen] == [StateChanged]
    assert caplog.records[0].levelno == logging.WARNING
    assert "sms" in caplog.records[0].getMessage()
    assert "closed" in caplog.records[0].getMessage()


def test_a_broken_listener_never_breaks_the_call(caplog: pytest.LogCaptureFixture,
                                                 clock: FakeClock) -> None:
    def broken(event: Event) -> None:
        raise RuntimeError("listener bug")

    r = Retry(attempts=2, base=0.0, clock=clock, listeners=(broken,))
    calls = iter([TransientError(), None])

    def fn() -> str:
        exc = next(calls)
        if exc:
            raise exc
        return "ok"

    with caplog.at_level(logging.ERROR, logger="stormguard"):
        assert r.call(fn) == "ok"
    assert "listener" in caplog.text


async def test_a_pipeline_is_itself_a_layer(mode: Mode, clock: FakeClock) -> None:
    """Chained as one layer (not flattened), it still runs its policies around the rest."""
    from stormguard.resilience.pipeline.asyncio import achain
    from stormguard.resilience.pipeline.blocking import chain

    log: list[str] = []
    inner = Pipeline(Tag("b", log), Tag("c", log))
    layers = [Tag("a", log), inner, Tag("d", log)]
    if mode.is_async:
        async def add(x: int) -> int:
            return x + 1

        assert await achain(layers)(add, (1,), {}) == 2
    else:
        assert chain(layers)(lambda x: x + 1, (1,), {}) == 2
    assert log == ["a>", "b>", "c>", "d>", "<d", "<c", "<b", "<a"]
    assert repr(inner).startswith("Pipeline(")
    assert "Retry(attempts=3" in repr(Pipeline(Retry(clock=clock), Timeout(total=1.0)))
