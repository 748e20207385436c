"""Timeout: a deadline for everything the policy wraps.

``Timeout(1.0)`` bounds one attempt (put it inside ``Retry``); ``Timeout(total=3.0)``
bounds everything inside it, retries and their sleeps included. Both set the
deadline context variable of :mod:`stormguard._core.deadline`, clipped to any outer
deadline, so an inner timeout never outlives an outer one.

What is enforced:

* **asyncio**: the wrapped coroutine is cancelled for real when the deadline
  passes (:func:`asyncio.timeout`) and :class:`DeadlineExceeded` is raised.
* **blocking code** cannot be interrupted safely in Python. The policy:
  raises ``DeadlineExceeded`` *without calling* when the deadline has already
  passed on entry; publishes the deadline (``stormguard._core.deadline.remaining()``)
  so that I/O code clips its own timeouts (the httpx transport and the Redis
  store do; your own client can); and when the call comes back after the
  deadline, raises ``DeadlineExceeded`` (a late result is discarded, a late
  exception becomes its ``__cause__``). It does **not** stop a blocking call
  that ignores the deadline: that thread stays busy until the call returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from stormguard._core import validate
from stormguard._core.clock import Clock
from stormguard._core.deadline import Deadline, _current, clip
from stormguard._core.errors import ConfigError, DeadlineExceeded
from stormguard.observability.events import Listener, TimedOut
from stormguard.resilience._base import Args, AsyncNext, Kwargs, Next, Policy

__all__ = ["Timeout"]


class _Expiry:
    """The asyncio half of a deadline: a loop timer that cancels the task when it passes.

    Armed on the clock's time (``loop.time()`` plus what is left on the policy's
    clock, ``delay``): on :class:`stormguard.testing.FakeClock`'s loop it is a virtual timer.
    ``asyncio.timeout()`` semantics with a bare loop timer (cheaper, see bench/): a
    cancellation we caused (and only that) becomes DeadlineExceeded.
    """

    __slots__ = ("cancelling", "expired", "handle", "task")

    def __init__(self, delay: float) -> None:
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - acall always runs inside a task
            raise RuntimeError("Timeout.acall must run inside an asyncio task")
        self.task = task
        self.cancelling = task.cancelling()
        self.expired = False
        loop = task.get_loop()
        self.handle = loop.call_at(loop.time() + delay, self._expire)

    def _expire(self) -> None:
        self.expired = True
        self.task.cancel()

    def ours(self) -> bool:
        """After a CancelledError: was it our cancellation, and no one else's?"""
        return self.expired and self.task.uncancel() <= self.cancelling

    def settle(self) -> bool:
        """The call ended otherwise: withdraw our cancellation request; True if it fired."""
        if self.expired:
            self.task.uncancel()
        return self.expired


class Timeout(Policy):
    """Bound the wrapped call (``Timeout(seconds)``) or everything inside (``total=``)."""

    __slots__ = ("_monotonic", "seconds", "total")

    def __init__(self, seconds: float | None = None, *, total: float | None = None,
                 name: str | None = None, clock: Clock | None = None,
                 listeners: tuple[Listener, ...] = ()) -> None:
        if (seconds is None) == (total is None):
            raise ConfigError("seconds", seconds, "give exactly one of seconds or total=")
        is_total = total is not None
        value = total if total is not None else seconds
        self.seconds = validate.number("total" if is_total else "seconds", value)
        self.total = is_total
        super().__init__(name=name or ("total_timeout" if is_total else "timeout"),
                         clock=clock, listeners=listeners)
        self._monotonic = self._clock.monotonic

    def __repr__(self) -> str:
        arg = f"total={self.seconds}" if self.total else f"{self.seconds}"
        return f"Timeout({arg})"

    def _enter(self) -> tuple[Deadline, float]:
        """Under an outer deadline: this call's, clipped to it (:func:`deadline.clip`)."""
        d, now = clip(self.seconds, self._clock)
        if d.at <= now:
            self._timed_out(0.0)
            raise DeadlineExceeded("deadline already passed before the call")
        return d, now

    def _timed_out(self, budget: float) -> None:
        if self._observed():
            self._emit(TimedOut(self.name, self._clock.monotonic(), budget, self.total))

    def _late(self, d: Deadline, now: float) -> DeadlineExceeded:
        self._timed_out(d.at - now)
        kind = "total timeout" if self.total else "timeout"
        outer = d.cut_by
        if outer is None:
            return DeadlineExceeded(f"{kind} of {self.seconds:.3f}s exceeded")
        # an outer deadline (Timeout(total=...), deadline.scope) decided: name it
        length = f" of {outer.seconds:.3f}s" if outer.seconds is not None else ""
        return DeadlineExceeded(f"total deadline{length} exceeded (it left this {kind} of "
                                f"{self.seconds:.3f}s only {d.at - now:.3f}s)")

    # -- the flow, once: asyncio source, blocking twin generated (tools/unasync.py) --------
    # unasync: source timeout
    async def _async(
        self, nxt: AsyncNext, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        if _current.get() is None:  # the hot path: no outer deadline, nothing to clip
            now = self._monotonic()
            d = Deadline(now + self.seconds, self._clock, seconds=self.seconds)
            monotonic = self._monotonic
        else:
            d, now = self._enter()
            monotonic = d.clock.monotonic
        expiry = _Expiry(d.at - now)  # async only
        token = _current.set(d)
        try:
            result = await nxt(fn, args, kwargs)
        except asyncio.CancelledError as exc:  # async only
            if expiry.ours():  # async only
                raise self._late(d, now) from exc  # async only
            raise  # async only
        except Exception as exc:
            # sync: late = monotonic() >= d.at
            late = expiry.settle() or monotonic() >= d.at
            if late and not isinstance(exc, DeadlineExceeded):
                raise self._late(d, now) from exc
            raise
        finally:
            expiry.handle.cancel()  # async only
            _current.reset(token)
        # sync: if monotonic() >= d.at:
        if expiry.settle() or monotonic() >= d.at:
            raise self._late(d, now)
        return result
    # unasync: end

    # unasync: generated timeout (python tools/unasync.py; do not edit)
    def _sync(
        self, nxt: Next, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        if _current.get() is None:  # the hot path: no outer deadline, nothing to clip
            now = self._monotonic()
            d = Deadline(now + self.seconds, self._clock, seconds=self.seconds)
            monotonic = self._monotonic
        else:
            d, now = self._enter()
            monotonic = d.clock.monotonic
        token = _current.set(d)
        try:
            result = nxt(fn, args, kwargs)
        except Exception as exc:
            late = monotonic() >= d.at
            if late and not isinstance(exc, DeadlineExceeded):
                raise self._late(d, now) from exc
            raise
        finally:
            _current.reset(token)
        if monotonic() >= d.at:
            raise self._late(d, now)
        return result
    # unasync: end
