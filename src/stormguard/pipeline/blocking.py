"""The blocking driver: chain the ``_sync`` layers of several policies, once."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from stormguard.policies._base import Next, Policy, invoke

__all__ = ["chain"]


def chain(policies: Sequence[Policy], innermost: Next = invoke) -> Next:
    """One callable ``(fn, args, kwargs)`` running ``policies`` outermost-first around ``fn``."""
    nxt: Next = innermost
    for policy in reversed(policies):
        nxt = partial(policy._sync, nxt)
    return nxt
