"""Outbound resilience policies: what to do about a call to a dependency."""

from __future__ import annotations

from stormguard.policies._base import Policy
from stormguard.policies.breaker import CircuitBreaker
from stormguard.policies.budget import RetryBudget
from stormguard.policies.bulkhead import Bulkhead
from stormguard.policies.events import LoggingListener, add_listener, remove_listener
from stormguard.policies.fallback import Fallback
from stormguard.policies.retry import Retry, is_transient
from stormguard.policies.timeout import Timeout

__all__ = [
    "Bulkhead",
    "CircuitBreaker",
    "Fallback",
    "LoggingListener",
    "Policy",
    "Retry",
    "RetryBudget",
    "Timeout",
    "add_listener",
    "is_transient",
    "remove_listener",
]
