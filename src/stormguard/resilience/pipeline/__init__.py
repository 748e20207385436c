"""Pipeline: several policies around one call; the first listed is the outermost.

Recommended order for an outbound call::

    Pipeline(Fallback(...), Timeout(total=3.0), Retry(...), CircuitBreaker(...),
             Bulkhead(...), Timeout(1.0))

The layers are chained once, at construction (see :mod:`stormguard.resilience.pipeline.blocking`
and :mod:`stormguard.resilience.pipeline.asyncio`), so a call costs the policies' own work
and nothing per layer beyond a function call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from stormguard._core.errors import ConfigError
from stormguard.observability.events import Listener
from stormguard.resilience._base import (
    Args,
    AsyncNext,
    Kwargs,
    Next,
    Policy,
    ainvoke,
    invoke,
)
from stormguard.resilience.pipeline.asyncio import achain
from stormguard.resilience.pipeline.blocking import chain

__all__ = ["Pipeline"]

P = ParamSpec("P")
T = TypeVar("T")


class Pipeline(Policy):
    """Compose policies; ``Pipeline(a, b, c).call(fn)`` runs ``a(b(c(fn)))``."""

    __slots__ = ("_achain", "_chain", "policies")

    def __init__(self, *policies: Policy, name: str = "pipeline") -> None:
        flat: list[Policy] = []
        for i, policy in enumerate(policies):
            if isinstance(policy, Pipeline):
                flat.extend(policy.policies)
            elif isinstance(policy, Policy):
                flat.append(policy)
            else:
                raise ConfigError(f"policies[{i}]", policy, "must be a stormguard policy")
        self.policies: tuple[Policy, ...] = tuple(flat)
        super().__init__(name=name, clock=None)
        self._chain = chain(self.policies)
        self._achain = achain(self.policies)

    def __repr__(self) -> str:
        return f"Pipeline({', '.join(map(repr, self.policies))})"

    # -- the flow, once: asyncio source, blocking twin generated (tools/unasync.py) --------
    # unasync: source pipeline
    async def acall(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs,
    ) -> T:
        result: T = await self._achain(fn, args, kwargs)
        return result

    async def _async(
        self, nxt: AsyncNext, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        if nxt is ainvoke:
            return await self._achain(fn, args, kwargs)
        return await achain(self.policies, nxt)(fn, args, kwargs)
    # unasync: end

    # unasync: generated pipeline (python tools/unasync.py; do not edit)
    def call(
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs,
    ) -> T:
        result: T = self._chain(fn, args, kwargs)
        return result

    def _sync(
        self, nxt: Next, fn: Callable[..., Any], args: Args, kwargs: Kwargs,
    ) -> Any:
        if nxt is invoke:
            return self._chain(fn, args, kwargs)
        return chain(self.policies, nxt)(fn, args, kwargs)
    # unasync: end

    def add_listener(self, listener: Listener) -> None:
        """Receive the events of every policy in the pipeline."""
        for policy in self.policies:
            policy.add_listener(listener)

    def remove_listener(self, listener: Listener) -> None:
        for policy in self.policies:
            policy.remove_listener(listener)
