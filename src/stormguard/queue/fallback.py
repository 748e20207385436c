"""``queue.fallback(task)``: a :class:`~stormguard.Fallback` that defers the failed call.

The failed call's positional and keyword arguments are bound to the protected function's
parameter names (its signature) and deferred under ``task`` as a dict of keyword
arguments; the call answers :class:`~stormguard.Deferred` instead of raising. An argument
JSON cannot hold is a :class:`TypeError` naming it, raised to the caller (nothing is
written). A queue that cannot take the job raises its :class:`~stormguard.StorageError`
(the original error is its ``__cause__``): the work was neither done nor deferred.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stormguard._core import errors as _errors
from stormguard._core.clock import Clock
from stormguard._core.errors import (
    BulkheadFull,
    CircuitOpen,
    ConfigError,
    DeadlineExceeded,
    RetryBudgetExhausted,
    StorageError,
    StormguardError,
    TransientError,
)
from stormguard.observability.events import Listener
from stormguard.queue.events import JobDeferred
from stormguard.queue.job import Deferred
from stormguard.resilience._base import Args, AsyncNext, ExceptionSpec, Kwargs, Next
from stormguard.resilience.fallback import Fallback

if TYPE_CHECKING:
    from stormguard.queue.core import DeferredQueue

__all__ = ["DEFAULT_ON", "DeferFallback", "bind_payload", "deferrable"]

_SHAPER_FULL: type[BaseException] | None = getattr(_errors, "ShaperFull", None)

#: The failures a deferral answers by default: the dependency is refusing or too slow, so
#: the work can wait. (``ShaperFull`` too: any StormguardError carrying a numeric
#: ``retry_after``, the shaper's.)
DEFAULT_ON: tuple[type[BaseException], ...] = (
    CircuitOpen, BulkheadFull, DeadlineExceeded, RetryBudgetExhausted, TransientError,
    *((_SHAPER_FULL,) if _SHAPER_FULL is not None else ()))


def _numeric(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def deferrable(exc: BaseException) -> bool:
    """The default ``on=``: :data:`DEFAULT_ON`, or a StormguardError with a numeric
    ``retry_after`` (the shaper's ``ShaperFull``)."""
    return isinstance(exc, DEFAULT_ON) or (
        isinstance(exc, StormguardError) and _numeric(getattr(exc, "retry_after", None)))


def bind_payload(fn: Callable[..., Any], args: Args, kwargs: Kwargs) -> dict[str, Any]:
    """``fn(*args, **kwargs)``'s arguments by parameter name (defaults left out, so the
    handler's own defaults apply; ``**kwargs`` parameters flattened)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot defer a call of {fn!r}: its parameter names are "
                        f"unknown ({exc})") from None
    bound = sig.bind(*args, **kwargs)
    payload: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = sig.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                raise TypeError(f"cannot defer a call of {getattr(fn, '__qualname__', fn)}: "
                                f"its *{name} arguments have no names")
        elif kind is inspect.Parameter.VAR_KEYWORD:
            payload.update(value)
        else:
            payload[name] = value
    return payload


class DeferFallback(Fallback):
    """On a planned failure, defer the call's arguments under ``task``; answer
    :class:`Deferred`."""

    __slots__ = ("key", "queue", "task")

    def __init__(self, queue: DeferredQueue, task: str, on: ExceptionSpec | None = None, *,
                 key: Callable[[dict[str, Any]], str | None] | None = None,
                 name: str | None = None, clock: Clock | None = None,
                 listeners: tuple[Listener, ...] = ()) -> None:
        if key is not None and not callable(key):
            raise ConfigError("key", key, "must be a function of the payload giving the "
                              "idempotency key (or None)")
        self.queue = queue
        self.task = queue._task(task)
        self.key = key
        super().__init__(self._unused, deferrable if on is None else on,
                         name=name or f"defer:{task}",
                         clock=clock if clock is not None else queue.clock,
                         listeners=listeners)

    def __repr__(self) -> str:
        return f"DeferFallback({self.task!r}, {self.queue!r})"

    @staticmethod
    def _unused(cause: object) -> Any:  # pragma: no cover - the flows below replace it
        raise AssertionError("DeferFallback defers; it has no handler")

    def _job(self, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
             ) -> tuple[str, str | None]:
        payload = bind_payload(fn, args, kwargs)
        what = f"{getattr(fn, '__qualname__', 'the call')}() argument"
        text = self.queue._encode(payload, what)
        key = self.key(payload) if self.key is not None else None
        if key is not None and (not isinstance(key, str) or not key):
            raise TypeError(f"{self.name}: the key function must give a non-empty string "
                            f"or None (got {key!r})")
        return text, key

    def _deferred(self, job_id: str, exc: BaseException) -> Deferred:
        if self._observed():
            self._emit(JobDeferred(self.name, self._clock.monotonic(), self.task, job_id, exc))
        return Deferred(job_id, self.task)

    async def _async(self, nxt: AsyncNext, fn: Callable[..., Any], args: Args,
                     kwargs: Kwargs) -> Any:
        try:
            return await nxt(fn, args, kwargs)
        except Exception as exc:
            if not self._matches(exc):
                raise
            try:
                text, key = self._job(fn, args, kwargs)
            except TypeError as err:
                raise err from exc
            self._used(exc)
            try:
                job_id = await self.queue._aput(self.task, text, key)
            except StorageError as err:
                raise err from exc
            return self._deferred(job_id, exc)

    def _sync(self, nxt: Next, fn: Callable[..., Any], args: Args, kwargs: Kwargs) -> Any:
        try:
            return nxt(fn, args, kwargs)
        except Exception as exc:
            if not self._matches(exc):
                raise
            try:
                text, key = self._job(fn, args, kwargs)
            except TypeError as err:
                raise err from exc
            self._used(exc)
            try:
                job_id = self.queue._put(self.task, text, key)
            except StorageError as err:
                raise err from exc
            return self._deferred(job_id, exc)
