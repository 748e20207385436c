"""Fallback: answer with ``handler(cause)`` when the call fails in a way you planned for.

``on`` picks the exceptions (classes, or a predicate; default: every
``Exception``); ``result`` optionally picks bad results (a predicate on the
value). The handler receives the exception or the rejected result. In
``acall`` the handler may be sync or async. A handler that raises propagates
its own error (chained to the original by Python's implicit context).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from stormguard._core.clock import Clock
from stormguard._core.errors import ConfigError
from stormguard.observability.events import FallbackUsed, Listener
from stormguard.resilience._base import (
    Args,
    AsyncNext,
    ExceptionSpec,
    Kwargs,
    Next,
    Policy,
    matcher,
)

__all__ = ["Fallback"]


class Fallback(Policy):
    """Replace planned failures (or bad results) with ``handler(cause)``."""

    __slots__ = ("_matches", "handler", "result")

    def __init__(self, handler: Callable[[Any], Any], on: ExceptionSpec = Exception, *,
                 result: Callable[[Any], bool] | None = None, name: str = "fallback",
                 clock: Clock | None = None, listeners: tuple[Listener, ...] = ()) -> None:
        if not callable(handler):
            raise ConfigError("handler", handler, "must be callable")
        self.handler = handler
        self._matches = matcher("on", on)
        if result is not None and not callable(result):
            raise ConfigError("result", result, "must be a predicate on the result")
        self.result = result
        super().__init__(name=name, clock=clock, listeners=listeners)

    def __repr__(self) -> str:
        return f"Fallback({self.handler!r})"

    def _used(self, cause: object) -> None:
        if self._observed():
            self._emit(FallbackUsed(self.name, self._clock.monotonic(), cause))

    # -- the flow, once: asyncio source, blocking twin generated (tools/unasync.py) --------
    # unasync: source fallback
    async def _async(
        self, nxt: AsyncNext, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        try:
            value = await nxt(fn, args, kwargs)
        except Exception as exc:
            if not self._matches(exc):
                raise
            self._used(exc)
            answer = self.handler(exc)
        else:
            if self.result is None or not self.result(value):
                return value
            self._used(value)
            answer = self.handler(value)
        if inspect.isawaitable(answer):  # async only
            answer = await answer  # async only
        return answer
    # unasync: end

    # unasync: generated fallback (python tools/unasync.py; do not edit)
    def _sync(
        self, nxt: Next, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        try:
            value = nxt(fn, args, kwargs)
        except Exception as exc:
            if not self._matches(exc):
                raise
            self._used(exc)
            answer = self.handler(exc)
        else:
            if self.result is None or not self.result(value):
                return value
            self._used(value)
            answer = self.handler(value)
        return answer
    # unasync: end
