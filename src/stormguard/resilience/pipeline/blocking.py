"""The blocking driver: chain the ``_sync`` layers of several policies, once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from stormguard.resilience._base import Next, Policy, invoke

__all__ = ["chain", "compose"]


def compose(policies: Sequence[Policy], driver: str, innermost: Callable[..., Any]) -> Any:
    """``partial(p1.<driver>, partial(p2.<driver>, ... innermost))``, built once."""
    nxt = innermost
    for policy in reversed(policies):
        nxt = partial(getattr(policy, driver), nxt)
    return nxt


def chain(policies: Sequence[Policy], innermost: Next = invoke) -> Next:
    """One callable ``(fn, args, kwargs)`` running ``policies`` outermost-first around ``fn``."""
    result: Next = compose(policies, "_sync", innermost)
    return result
