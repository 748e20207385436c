"""AdaptiveThrottle: Google SRE client-side throttling.

Over the last ``window`` seconds the throttle counts ``requests`` (every call it saw,
the ones it rejected locally included) and ``accepts`` (calls the dependency answered:
they returned, or raised an exception that is not one of ``on=``). A new call is
rejected locally, with :class:`stormguard.Throttled` and without being sent, with
probability ``max(0, (requests - k * accepts) / (requests + 1))``. While the dependency
accepts everything the probability is 0; when it rejects most calls, the client stops
sending most of them, so an overloaded backend is not also spending its CPU on turning
away requests. ``k`` (2.0) is how many requests per accept the client may send before
it starts throttling: lower is more aggressive. The counts live in 60 buckets of
``window / 60`` seconds each, on the policy's clock; ``rng`` (a ``random.Random``) draws
the rejections, as in :class:`stormguard.Retry`.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from typing import Any

from stormguard._core import validate
from stormguard._core.clock import Clock
from stormguard._core.errors import Throttled
from stormguard.observability.events import CallThrottled, Listener
from stormguard.observability.metrics import track
from stormguard.resilience._base import (
    Args,
    AsyncNext,
    ExceptionSpec,
    Kwargs,
    Next,
    Policy,
    matcher,
)

__all__ = ["AdaptiveThrottle"]

BUCKETS = 60


class AdaptiveThrottle(Policy):
    """Reject calls locally, with a probability that grows as the dependency rejects."""

    __slots__ = ("_accepts", "_at", "_lock", "_on", "_random", "_requests", "_width", "k",
                 "window")

    def __init__(self, k: float = 2.0, window: float = 120.0, *, on: ExceptionSpec = Exception,
                 rng: random.Random | None = None, name: str = "throttle",
                 clock: Clock | None = None, listeners: tuple[Listener, ...] = ()) -> None:
        self.k = validate.number("k", k, minimum=1.0, allow_zero=True)
        self.window = validate.duration("window", window)
        self._on = matcher("on", on)
        self._random = (rng if rng is not None else random.Random()).random  # noqa: S311 -- not crypto
        super().__init__(name=name, clock=clock, listeners=listeners)
        self._width = self.window / BUCKETS
        self._requests = [0] * BUCKETS
        self._accepts = [0] * BUCKETS
        self._at = math.floor(self._clock.monotonic() / self._width)  # newest bucket's number
        self._lock = threading.Lock()
        track(self, "throttle")  # metrics: its rejection probability now

    def __repr__(self) -> str:
        return f"AdaptiveThrottle(k={self.k}, window={self.window})"

    # -- the counts (under the lock) ----------------------------------------------------------
    def _roll(self) -> int:
        """The index of the current bucket, emptying the buckets that fell out."""
        now = math.floor(self._clock.monotonic() / self._width)
        at = self._at
        if now > at:
            for n in range(at + 1, min(now, at + BUCKETS) + 1):
                self._requests[n % BUCKETS] = 0
                self._accepts[n % BUCKETS] = 0
            self._at = now
        return self._at % BUCKETS

    def counts(self) -> tuple[int, int]:
        """``(requests, accepts)`` over the window now."""
        with self._lock:
            self._roll()
            return sum(self._requests), sum(self._accepts)

    def probability(self) -> float:
        """The probability that a call made now is rejected locally."""
        requests, accepts = self.counts()
        return max(0.0, (requests - self.k * accepts) / (requests + 1))

    def stats(self) -> dict[str, Any]:
        requests, accepts = self.counts()
        return {"requests": requests, "accepts": accepts,
                "probability": max(0.0, (requests - self.k * accepts) / (requests + 1))}

    def _admit(self) -> None:
        """Count the call as a request; raise Throttled if it is rejected locally."""
        with self._lock:
            i = self._roll()
            requests, accepts = sum(self._requests), sum(self._accepts)
            p = (requests - self.k * accepts) / (requests + 1)
            self._requests[i] += 1
        if p > 0 and self._random() < p:
            if self._observed():
                self._emit(CallThrottled(self.name, self._clock.monotonic(), p, requests + 1,
                                         accepts))
            raise Throttled(f"throttle {self.name!r}: rejected locally with probability "
                            f"{p:.2f} ({requests + 1} requests, {accepts} accepted in "
                            f"{self.window:g}s)", probability=p, name=self.name)

    def _accept(self) -> None:
        with self._lock:
            self._accepts[self._roll()] += 1

    def _answered(self, exc: BaseException) -> None:
        """The call raised: an accept unless it is one of ``on=`` (or a cancellation)."""
        if isinstance(exc, Exception) and not self._on(exc):
            self._accept()

    # -- the flow, once: asyncio source, blocking twin generated (tools/unasync.py) --------
    # unasync: source throttle
    async def _async(
        self, nxt: AsyncNext, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        self._admit()
        try:
            result = await nxt(fn, args, kwargs)
        except BaseException as exc:
            self._answered(exc)
            raise
        self._accept()
        return result
    # unasync: end

    # unasync: generated throttle (python tools/unasync.py; do not edit)
    def _sync(
        self, nxt: Next, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        self._admit()
        try:
            result = nxt(fn, args, kwargs)
        except BaseException as exc:
            self._answered(exc)
            raise
        self._accept()
        return result
    # unasync: end
