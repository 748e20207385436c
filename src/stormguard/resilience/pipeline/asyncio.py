"""The asyncio driver: chain the ``_async`` layers of several policies, once."""

from __future__ import annotations

from collections.abc import Sequence

from stormguard.resilience._base import AsyncNext, Policy, ainvoke
from stormguard.resilience.pipeline.blocking import compose

__all__ = ["achain"]


def achain(policies: Sequence[Policy], innermost: AsyncNext = ainvoke) -> AsyncNext:
    """One coroutine function ``(fn, args, kwargs)`` running ``policies`` outermost-first."""
    result: AsyncNext = compose(policies, "_async", innermost)
    return result
