"""Retry: exponential backoff with jitter, an error classifier, a deadline and a budget.

Attempt ``n`` (1-based) failed: the nominal delay is
``min(max_delay, base x multiplier ** (n - 1))``, then jitter:

============== ==========================================================
``"full"``     uniform in ``[0, delay]`` (the default; AWS "full jitter")
``"equal"``    uniform in ``[delay / 2, delay]``
``"decorrelated"`` uniform in ``[base, 3 x previous]``, capped at ``max_delay``
``"none"``     exactly ``delay``
============== ==========================================================

An error with a numeric ``retry_after`` attribute (a 429/503 ``Retry-After``,
:class:`stormguard.TransientError`) sets the delay instead, capped at
``max_retry_after`` (``max_delay`` when omitted). Before sleeping, Retry
checks the deadline in force (:mod:`stormguard._core.deadline`): it never sleeps
past it and never starts an attempt with less than ``min_attempt_time`` left;
it gives up and raises the last error instead. When its
:class:`RetryBudget` is spent it raises :class:`RetryBudgetExhausted` whose
``__cause__`` is the original exception.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from stormguard._core import validate
from stormguard._core.clock import Clock
from stormguard._core.deadline import _current
from stormguard._core.errors import ConfigError, RetryBudgetExhausted, TransientError
from stormguard.observability.events import BudgetExhausted, Listener, RetryGaveUp, RetryScheduled
from stormguard.resilience._base import (
    Args,
    AsyncNext,
    ExceptionSpec,
    Kwargs,
    Next,
    Policy,
    matcher,
)
from stormguard.resilience.budget import RetryBudget

__all__ = ["JITTERS", "Retry", "is_transient", "restrict"]

JITTERS = ("full", "equal", "decorrelated", "none")

_TRANSIENT = (TimeoutError, ConnectionError, TransientError)


_restriction: ContextVar[Callable[[BaseException], bool] | None] = ContextVar(
    "stormguard_retry_restriction", default=None)


@contextmanager
def restrict(allowed: Callable[[BaseException], bool]) -> Iterator[None]:
    """Inside the block, every Retry also requires ``allowed(error)`` before retrying.

    For callers that know more than the policy: the httpx transport uses it so
    that a POST that may have reached the server is never sent twice, whatever
    error (a per-attempt ``DeadlineExceeded`` included) the pipeline saw.
    """
    outer = _restriction.get()
    if outer is not None:
        inner = allowed

        def allowed(exc: BaseException) -> bool:
            return outer(exc) and inner(exc)

    token = _restriction.set(allowed)
    try:
        yield
    finally:
        _restriction.reset(token)


def is_transient(exc: BaseException) -> bool:
    """The default ``retry_on``: timeouts, connection errors and TransientError subclasses."""
    return isinstance(exc, _TRANSIENT)


class Retry(Policy):
    """Retry transient failures with backoff, jitter, a deadline and an optional budget."""

    __slots__ = ("_mode", "_random", "_retry_on", "attempts", "base", "budget", "jitter",
                 "max_delay", "max_retry_after", "min_attempt_time", "multiplier")

    def __init__(self, attempts: int = 3, base: float = 0.1, multiplier: float = 2.0,
                 max_delay: float = 5.0, jitter: str = "full", *,
                 retry_on: ExceptionSpec | None = None, budget: RetryBudget | None = None,
                 max_retry_after: float | None = None, min_attempt_time: float = 0.0,
                 rng: random.Random | None = None, name: str = "retry",
                 clock: Clock | None = None, listeners: tuple[Listener, ...] = ()) -> None:
        self.attempts = validate.integer("attempts", attempts)
        self.base = validate.number("base", base, allow_zero=True)
        self.multiplier = validate.number("multiplier", multiplier, minimum=1.0,
                                          allow_zero=True)
        self.max_delay = validate.number("max_delay", max_delay, allow_zero=True)
        if self.base > self.max_delay:
            raise ConfigError("base", base, f"must be <= max_delay ({max_delay})")
        self.jitter = validate.one_of("jitter", jitter, JITTERS)
        self._mode = JITTERS.index(jitter)
        self._retry_on = is_transient if retry_on is None else matcher("retry_on", retry_on)
        if budget is not None and not isinstance(budget, RetryBudget):
            raise ConfigError("budget", budget, "must be a RetryBudget")
        self.budget = budget
        self.max_retry_after = (self.max_delay if max_retry_after is None
                                else validate.number("max_retry_after", max_retry_after,
                                                     allow_zero=True))
        self.min_attempt_time = validate.number("min_attempt_time", min_attempt_time,
                                                allow_zero=True)
        self._random = (rng if rng is not None else random.Random()).random  # noqa: S311 -- jitter, not crypto
        super().__init__(name=name, clock=clock, listeners=listeners)

    def __repr__(self) -> str:
        return (f"Retry(attempts={self.attempts}, base={self.base}, "
                f"multiplier={self.multiplier}, max_delay={self.max_delay}, "
                f"jitter={self.jitter!r})")

    # -- pure decisions (shared by both drivers) -------------------------------------------
    def backoff(self, attempt: int, previous: float) -> float:
        """The jittered delay after failed attempt ``attempt`` (``previous``: last delay)."""
        mode = self._mode
        if mode == 2:  # decorrelated
            upper = min(self.max_delay, max(previous, self.base) * 3.0)
            return self.base + self._random() * (upper - self.base)
        delay = min(self.max_delay, self.base * self.multiplier ** (attempt - 1))
        if mode == 0:
            return self._random() * delay
        if mode == 1:
            return delay / 2.0 + self._random() * (delay / 2.0)
        return delay

    def _plan(self, attempt: int, error: Exception, previous: float) -> float | None:
        """Delay before attempt ``attempt + 1``, or None to re-raise ``error``.

        Raises RetryBudgetExhausted (from ``error``) when the budget refuses.
        """
        clock = self._clock
        if attempt >= self.attempts:
            reason = "attempts"
        elif not self._retry_on(error) or not (
                (restriction := _restriction.get()) is None or restriction(error)):
            reason = "not_retryable"
        else:
            retry_after = getattr(error, "retry_after", None)
            if isinstance(retry_after, int | float) and not isinstance(retry_after, bool) \
                    and retry_after >= 0:
                delay = min(float(retry_after), self.max_retry_after)
            else:
                delay = self.backoff(attempt, previous)
            d = _current.get()
            if d is not None and delay + self.min_attempt_time >= d.remaining():
                reason = "deadline"
            else:
                budget = self.budget
                if budget is not None and not budget.try_spend():
                    if self._observed():
                        self._emit(BudgetExhausted(self.name, clock.monotonic(), attempt, error))
                    raise RetryBudgetExhausted(
                        f"retry budget spent after attempt {attempt}: {error!r}") from error
                if self._observed():
                    self._emit(RetryScheduled(self.name, clock.monotonic(), attempt, delay,
                                              error))
                return delay
        if self._observed():
            self._emit(RetryGaveUp(self.name, clock.monotonic(), attempt, reason, error))
        return None

    def _flow(self, error: Exception) -> Generator[float, Exception, None]:
        """The retry loop as a sans-I/O flow, entered after the first attempt failed.

        Yields the delay before the next attempt; the driver sleeps, runs the
        attempt and sends its error back in (or stops on success). Ends by
        raising the error to give up with.
        """
        attempt, delay = 1, 0.0
        while True:
            planned = self._plan(attempt, error, delay)
            if planned is None:
                raise error
            delay = planned
            error = yield delay
            attempt += 1

    # -- the flow, once: asyncio source, blocking twin generated (tools/unasync.py) --------
    # The first attempt costs one try/except; the retry flow only runs on failure.
    # unasync: source retry
    async def _async(
        self, nxt: AsyncNext, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        if self.budget is not None:
            self.budget.record_attempt()
        try:
            return await nxt(fn, args, kwargs)
        except Exception as exc:
            flow = self._flow(exc)
            delay = next(flow)
        while True:
            await self._clock.asleep(delay)
            try:
                return await nxt(fn, args, kwargs)
            except Exception as exc:
                delay = flow.send(exc)
    # unasync: end

    # unasync: generated retry (python tools/unasync.py; do not edit)
    def _sync(
        self, nxt: Next, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        if self.budget is not None:
            self.budget.record_attempt()
        try:
            return nxt(fn, args, kwargs)
        except Exception as exc:
            flow = self._flow(exc)
            delay = next(flow)
        while True:
            self._clock.sleep(delay)
            try:
                return nxt(fn, args, kwargs)
            except Exception as exc:
                delay = flow.send(exc)
    # unasync: end
