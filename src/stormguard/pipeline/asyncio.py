"""The asyncio driver: chain the ``_async`` layers of several policies, once."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from stormguard.policies._base import AsyncNext, Policy, ainvoke

__all__ = ["achain"]


def achain(policies: Sequence[Policy], innermost: AsyncNext = ainvoke) -> AsyncNext:
    """One coroutine function ``(fn, args, kwargs)`` running ``policies`` outermost-first."""
    nxt: AsyncNext = innermost
    for policy in reversed(policies):
        nxt = partial(policy._async, nxt)
    return nxt
