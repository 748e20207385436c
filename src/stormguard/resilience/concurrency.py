"""ConcurrencyLimit: an adaptive bulkhead per dependency, rejecting with :class:`Shed`.

``ConcurrencyLimit(limit=AdaptiveLimit())`` lets at most ``limit`` calls be in flight to
one dependency, where the limit follows the dependency's latency (it shrinks as soon as
queueing shows in the calls' latency, grows back while latency stays near its no-load
minimum: see :class:`stormguard.AdaptiveLimit`); ``limit=20`` is a fixed limit. A call
that finds no slot waits at most ``max_wait`` (clipped to the deadline in force) and is
then rejected with :class:`stormguard.Shed`; ``max_wait=0`` (the default) rejects at once.
Only calls that return feed the adaptive limit: a failure's latency (a refused
connection answers fast) says nothing about queueing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stormguard._core import validate
from stormguard._core.clock import Clock
from stormguard._core.deadline import _current
from stormguard._core.errors import Shed
from stormguard.observability.events import Listener
from stormguard.overload.limit import AdaptiveLimit
from stormguard.overload.shedder import CRITICAL, Shedder, Ticket
from stormguard.resilience._base import Args, AsyncNext, Kwargs, Next, Policy

__all__ = ["ConcurrencyLimit"]


class ConcurrencyLimit(Policy):
    """Limit concurrent calls to one dependency with an adaptive (or fixed) limit."""

    __slots__ = ("max_wait", "shedder")

    def __init__(self, limit: AdaptiveLimit | int | None = None, max_wait: float = 0.0, *,
                 retry_after: float = 1.0, name: str = "concurrency",
                 clock: Clock | None = None, listeners: tuple[Listener, ...] = ()) -> None:
        self.max_wait = validate.number("max_wait", max_wait, allow_zero=True)
        super().__init__(name=name, clock=clock, listeners=listeners)
        self.shedder = Shedder(limit, queue_timeout=self.max_wait, retry_after=retry_after,
                               name=name, clock=self._clock, listeners=self._listeners)
        # one list: listeners added to the policy reach the shedder's events too
        self.shedder._listeners = self._listeners

    def __repr__(self) -> str:
        return f"ConcurrencyLimit(limit={self.shedder.limit!r}, max_wait={self.max_wait})"

    @property
    def limit(self) -> int:
        """The current limit."""
        return self.shedder.limit.limit

    @property
    def in_flight(self) -> int:
        return self.shedder.in_flight

    def stats(self) -> dict[str, Any]:
        """Gauges and counters: limit, in flight, waiting, admitted and shed."""
        return self.shedder.stats()

    def _wait_budget(self) -> float:
        wait = self.max_wait
        d = _current.get()
        if d is not None:
            wait = min(wait, max(0.0, d.remaining()))
        return wait

    async def _acquire_async(self) -> Ticket:
        got = await self.shedder.acquire_async(CRITICAL, "", self._wait_budget())
        if isinstance(got, Shed):
            raise got
        return got

    def _acquire_blocking(self) -> Ticket:
        got = self.shedder.acquire_blocking(CRITICAL, "", self._wait_budget())
        if isinstance(got, Shed):
            raise got
        return got

    # -- the flow, once: asyncio source, blocking twin generated (tools/unasync.py) --------
    # unasync: source concurrency
    async def _async(
        self, nxt: AsyncNext, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        ticket = await self._acquire_async()
        ok = False
        try:
            result = await nxt(fn, args, kwargs)
            ok = True
            return result
        finally:
            self.shedder.release(ticket, ok)
    # unasync: end

    # unasync: generated concurrency (python tools/unasync.py; do not edit)
    def _sync(
        self, nxt: Next, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        ticket = self._acquire_blocking()
        ok = False
        try:
            result = nxt(fn, args, kwargs)
            ok = True
            return result
        finally:
            self.shedder.release(ticket, ok)
    # unasync: end
