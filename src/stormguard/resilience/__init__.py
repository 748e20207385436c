"""Outbound resilience policies: what to do about a call to a dependency."""

from __future__ import annotations

from stormguard.observability.events import LoggingListener, add_listener, remove_listener
from stormguard.resilience._base import Policy
from stormguard.resilience.breaker import CircuitBreaker
from stormguard.resilience.budget import RetryBudget
from stormguard.resilience.bulkhead import Bulkhead
from stormguard.resilience.concurrency import ConcurrencyLimit
from stormguard.resilience.fallback import Fallback
from stormguard.resilience.retry import Retry, is_transient
from stormguard.resilience.shaper import Shaper
from stormguard.resilience.throttle import AdaptiveThrottle
from stormguard.resilience.timeout import Timeout

__all__ = [
    "AdaptiveThrottle",
    "Bulkhead",
    "CircuitBreaker",
    "ConcurrencyLimit",
    "Fallback",
    "LoggingListener",
    "Policy",
    "Retry",
    "RetryBudget",
    "Shaper",
    "Timeout",
    "add_listener",
    "is_transient",
    "remove_listener",
]
