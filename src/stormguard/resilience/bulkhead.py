"""Bulkhead: at most ``max_concurrent`` calls in flight; the next waits up to ``max_wait``.

The free slots are tokens in a :class:`queue.SimpleQueue` (C code, atomic
without a Python-level lock): a call takes one with ``get_nowait()`` and puts
it back when it ends, so the limit can never be exceeded, whatever mix of
threads and asyncio tasks shares the bulkhead. Threads that must wait block in
``get(timeout)``; tasks wait on a future that a finishing call resolves (oldest
waiting task first). ``max_wait=0`` rejects at once with :class:`BulkheadFull`.
Waiting is real waiting (an OS or event-loop timer) measured on the policy's
clock and clipped to the deadline in force: on :class:`stormguard.testing.FakeClock`
a task waits in virtual time on the clock's loop (``FakeClock.run``) and a thread
until the clock is advanced past its wait or a slot frees. A freed slot goes to
whichever waiter gets to it first: there is no strict first-come order between a
waiting thread and a waiting task.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from stormguard._core import validate
from stormguard._core.clock import Clock, SystemClock
from stormguard._core.deadline import _current
from stormguard._core.errors import BulkheadFull
from stormguard.observability.events import BulkheadRejected, Listener
from stormguard.observability.metrics import track
from stormguard.resilience._base import (
    Args,
    AsyncNext,
    Kwargs,
    Next,
    Policy,
)

__all__ = ["Bulkhead"]

#: a thread waiting on a clock other than the system's looks at it this often (real seconds)
_POLL = 0.005

_Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Bulkhead(Policy):
    """Limit concurrent calls to one dependency, for threads and asyncio alike."""

    __slots__ = ("_awaiters", "_free", "_lock", "_threads_waiting", "max_concurrent",
                 "max_wait")

    def __init__(self, max_concurrent: int = 20, max_wait: float = 0.0, *,
                 name: str = "bulkhead", clock: Clock | None = None,
                 listeners: tuple[Listener, ...] = ()) -> None:
        self.max_concurrent = validate.integer("max_concurrent", max_concurrent)
        self.max_wait = validate.number("max_wait", max_wait, allow_zero=True)
        super().__init__(name=name, clock=clock, listeners=listeners)
        self._free: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(self.max_concurrent):
            self._free.put(None)
        self._lock = threading.Lock()  # guards the waiter bookkeeping only (slow path)
        self._awaiters: deque[_Waiter] = deque()
        self._threads_waiting = 0
        track(self, "bulkhead")

    def __repr__(self) -> str:
        return f"Bulkhead(max_concurrent={self.max_concurrent}, max_wait={self.max_wait})"

    @property
    def in_flight(self) -> int:
        """Calls running now."""
        return self.max_concurrent - self._free.qsize()

    @property
    def waiting(self) -> int:
        """Callers (threads and tasks) queued for a slot now."""
        return self._threads_waiting + len(self._awaiters)

    # -- slots ----------------------------------------------------------------------------
    def _wake_one(self) -> None:
        """Wake the oldest waiting task, if any (a free token is there for it)."""
        with self._lock:
            while self._awaiters:
                loop, future = self._awaiters.popleft()
                try:
                    loop.call_soon_threadsafe(_resolve, future)
                except RuntimeError:  # its loop is closed: try the next one
                    continue
                return

    def _forget(self, waiter: _Waiter) -> None:
        """A task stops waiting; if a wake-up was already meant for it, pass it on."""
        with self._lock:
            try:
                self._awaiters.remove(waiter)
                return
            except ValueError:
                pass  # popped by _wake_one: that wake-up must not be lost
        if self._free.qsize() and self._awaiters:
            self._wake_one()

    def _wait_budget(self) -> float:
        wait = self.max_wait
        d = _current.get()
        if d is not None:
            wait = min(wait, max(0.0, d.remaining()))
        return wait

    def _reject(self, waited: float) -> BulkheadFull:
        if self._observed():
            self._emit(BulkheadRejected(self.name, self._clock.monotonic(),
                                        self.max_concurrent, waited))
        return BulkheadFull(f"bulkhead {self.name!r}: {self.max_concurrent} calls in flight"
                            + (f", none finished within {waited:.3f}s" if waited else ""))

    def _acquire_blocking(self) -> None:
        wait = self._wait_budget()
        if wait <= 0:
            raise self._reject(0.0)
        clock = self._clock
        with self._lock:
            self._threads_waiting += 1
        try:
            if type(clock) is SystemClock:
                self._free.get(timeout=wait)
            else:  # another clock's time: wait in short real slices, watching it
                end = clock.monotonic() + wait
                while True:
                    left = end - clock.monotonic()
                    if left <= 0:
                        raise queue.Empty
                    try:
                        self._free.get(timeout=min(left, _POLL))
                        break
                    except queue.Empty:
                        continue
        except queue.Empty:
            raise self._reject(wait) from None
        finally:
            with self._lock:
                self._threads_waiting -= 1

    async def _acquire_async(self) -> None:
        wait = self._wait_budget()
        if wait <= 0:
            raise self._reject(0.0)
        clock = self._clock
        loop = asyncio.get_running_loop()
        end = clock.monotonic() + wait
        again = False
        while True:
            waiter: _Waiter = (loop, loop.create_future())
            with self._lock:
                if again:  # woken, but a thread took the slot: keep our place in line
                    self._awaiters.appendleft(waiter)
                else:
                    self._awaiters.append(waiter)
            try:  # a slot freed before we queued would wake nobody: look again
                self._free.get_nowait()
            except queue.Empty:
                pass
            else:
                self._forget(waiter)
                return
            try:  # a loop timer for what is left on our clock (virtual on FakeClock's loop)
                async with asyncio.timeout(end - clock.monotonic()):
                    await waiter[1]
            except TimeoutError:
                self._forget(waiter)
                raise self._reject(wait) from None
            except BaseException:
                self._forget(waiter)
                raise
            try:
                self._free.get_nowait()
            except queue.Empty:  # a thread took it first: wait again
                again = True
                continue
            return

    # -- the flow, once: asyncio source, blocking twin generated (tools/unasync.py) --------
    # unasync: source bulkhead
    async def _async(
        self, nxt: AsyncNext, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        try:
            self._free.get_nowait()
        except queue.Empty:
            await self._acquire_async()
        try:
            return await nxt(fn, args, kwargs)
        finally:
            self._free.put(None)
            if self._awaiters:
                self._wake_one()
    # unasync: end

    # unasync: generated bulkhead (python tools/unasync.py; do not edit)
    def _sync(
        self, nxt: Next, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        try:
            self._free.get_nowait()
        except queue.Empty:
            self._acquire_blocking()
        try:
            return nxt(fn, args, kwargs)
        finally:
            self._free.put(None)
            if self._awaiters:
                self._wake_one()
    # unasync: end
