"""What every policy shares: ``call`` / ``acall``, the decorator, listeners, the clock.

A policy implements two thin drivers over one piece of logic:

``_sync(nxt, fn, args, kwargs)``
    runs the layer around ``nxt(fn, args, kwargs)`` (the next layer, or the
    call itself) in a blocking way;
``_async(nxt, fn, args, kwargs)``
    the same around ``await nxt(fn, args, kwargs)``.

The decisions (may this call go in? what happened? how long to wait? give up?)
live in plain methods of the policy that never block, sleep or await, so both
drivers share them; the drivers only do ``try``/``except``, ``sleep`` or
``await``. :class:`stormguard.Pipeline` chains the drivers of several
policies once, at construction, with :func:`functools.partial`, so a call
through a pipeline allocates nothing per layer.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, overload

from stormguard._core.clock import Clock, system_clock
from stormguard._core.errors import ConfigError
from stormguard.observability.events import Event, Listener, emit, observed

__all__ = ["Args", "AsyncNext", "ExceptionSpec", "Kwargs", "Next", "Policy", "ainvoke", "invoke",
           "matcher"]

P = ParamSpec("P")
T = TypeVar("T")

Args = tuple[Any, ...]
Kwargs = dict[str, Any]
Next = Callable[[Callable[..., Any], Args, Kwargs], Any]
AsyncNext = Callable[[Callable[..., Any], Args, Kwargs], Awaitable[Any]]


def invoke(fn: Callable[..., Any], args: Args, kwargs: Kwargs) -> Any:
    """The innermost blocking layer: the protected call itself."""
    return fn(*args, **kwargs)


async def ainvoke(fn: Callable[..., Any], args: Args, kwargs: Kwargs) -> Any:
    """The innermost asyncio layer: the protected call itself."""
    return await fn(*args, **kwargs)


ExceptionSpec = (tuple[type[BaseException], ...] | type[BaseException]
                 | Callable[[BaseException], bool])


def matcher(field: str, spec: ExceptionSpec) -> Callable[[BaseException], bool]:
    """A predicate from an exception class, a tuple of them, or a predicate."""
    if isinstance(spec, type):
        if not issubclass(spec, BaseException):
            raise ConfigError(field, spec, "must be an exception class")
        spec = (spec,)
    if isinstance(spec, tuple):
        types = spec
        for t in types:
            if not (isinstance(t, type) and issubclass(t, BaseException)):
                raise ConfigError(field, spec, "must hold exception classes")
        return lambda exc: isinstance(exc, types)
    if callable(spec):
        return spec
    raise ConfigError(field, spec, "must be an exception class, a tuple of them or a predicate")


def check_positive(field: str, value: float, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(field, value, "must be a number")
    if math.isnan(value) or math.isinf(value):
        raise ConfigError(field, value, "must be finite")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(field, value, "must be >= 0" if allow_zero else "must be > 0")
    return float(value)


def check_int(field: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, value, "must be an integer")
    if value < minimum:
        raise ConfigError(field, value, f"must be >= {minimum}")
    return value


class Policy:
    """Base class: one resilience behaviour around a call, sync or async."""

    __slots__ = ("_clock", "_listeners", "name")

    def __init__(self, *, name: str, clock: Clock | None,
                 listeners: tuple[Listener, ...] | list[Listener] = ()) -> None:
        self.name = name
        self._clock: Clock = system_clock if clock is None else clock
        self._listeners: list[Listener] = list(listeners)

    # -- calling styles -------------------------------------------------------------------
    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` under this policy (blocking)."""
        result: T = self._sync(invoke, fn, args, kwargs)
        return result

    async def acall(self, fn: Callable[P, Awaitable[T]], /,
                    *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``await fn(*args, **kwargs)`` under this policy."""
        result: T = await self._async(ainvoke, fn, args, kwargs)
        return result

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, T]]
                 ) -> Callable[P, Coroutine[Any, Any, T]]: ...
    @overload
    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]: ...
    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]:
        """Decorate a sync or an async function."""
        if inspect.iscoroutinefunction(fn):
            adriver = self._async

            @functools.wraps(fn)
            async def awrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                return await adriver(ainvoke, fn, args, kwargs)

            return awrapper
        driver = self._sync

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            return driver(invoke, fn, args, kwargs)

        return wrapper

    # -- the two drivers (implemented by each policy) ---------------------------------------
    def _sync(self, nxt: Next, fn: Callable[..., Any], args: Args, kwargs: Kwargs) -> Any:
        raise NotImplementedError  # pragma: no cover

    async def _async(self, nxt: AsyncNext, fn: Callable[..., Any], args: Args,
                     kwargs: Kwargs) -> Any:
        raise NotImplementedError  # pragma: no cover

    # -- events ---------------------------------------------------------------------------
    def add_listener(self, listener: Listener) -> None:
        """Receive this policy's events."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def _observed(self) -> bool:
        return observed(self._listeners)

    def _emit(self, event: Event) -> None:
        emit(self._listeners, event)
