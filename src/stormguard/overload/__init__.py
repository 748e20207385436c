"""Overload protection, the pure core: concurrency limits and priority admission.

:class:`AdaptiveLimit` (a concurrency limit that follows latency), :class:`FixedLimit`,
and :class:`Shedder` (tiers as caps on the slots, a bounded wait, CoDel and adaptive
LIFO). The ASGI/WSGI middleware (:mod:`stormguard.middleware`) and
:class:`stormguard.resilience.ConcurrencyLimit` are built on them.
"""

from __future__ import annotations

from stormguard.overload.limit import AdaptiveLimit, FixedLimit, Limit
from stormguard.overload.shedder import DEFAULT_SHARES, TIERS, Shedder, Ticket

__all__ = ["DEFAULT_SHARES", "TIERS", "AdaptiveLimit", "FixedLimit", "Limit", "Shedder",
           "Ticket"]
