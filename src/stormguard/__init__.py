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
from stormguard.pipeline import Pipeline
from stormguard.policies import (
    Bulkhead,
    CircuitBreaker,
    Fallback,
    Retry,
    RetryBudget,
    Timeout,
)
from stormguard.rules import Rule
from stormguard.stores import MemoryStore, Store

__all__ = [
    "AsyncRateLimiter",
    "Bulkhead",
    "BulkheadFull",
    "CircuitBreaker",
    "CircuitOpen",
    "Clock",
    "ConfigError",
    "DeadlineExceeded",
    "Decision",
    "Fallback",
    "MemoryStore",
    "Pipeline",
    "RateLimiter",
    "Retry",
    "RetryBudget",
    "RetryBudgetExhausted",
    "Rule",
    "StorageError",
    "Store",
    "StormguardError",
    "SystemClock",
    "Timeout",
    "TransientError",
]

__version__ = "0.1.0"
