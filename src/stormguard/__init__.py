"""stormguard: keep one slow dependency or one abusive client from taking your site down."""

from __future__ import annotations

from stormguard._clock import Clock, SystemClock
from stormguard.decision import Decision
from stormguard.errors import (
    BulkheadFull,
    CircuitOpen,
    ConfigError,
    DeadlineExceeded,
    RetryBudgetExhausted,
    StorageError,
    StormguardError,
    TransientError,
)
from stormguard.limiter import AsyncRateLimiter, RateLimiter
from stormguard.rules import Rule
from stormguard.stores import MemoryStore, Store

__all__ = [
    "AsyncRateLimiter",
    "BulkheadFull",
    "CircuitOpen",
    "Clock",
    "ConfigError",
    "DeadlineExceeded",
    "Decision",
    "MemoryStore",
    "RateLimiter",
    "RetryBudgetExhausted",
    "Rule",
    "StorageError",
    "Store",
    "StormguardError",
    "SystemClock",
    "TransientError",
]

__version__ = "0.1.0"
