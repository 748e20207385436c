"""stormguard: keep one slow dependency or one abusive client from taking your site down."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# first: decides whether the compiled hot path may be imported (see stormguard._speedups)
from stormguard import (
    _speedups,  # noqa: F401
    observability,
)
from stormguard._core.clock import Clock, SystemClock
from stormguard._core.errors import (
    BulkheadFull,
    CircuitOpen,
    ConfigError,
    DeadlineExceeded,
    RateLimited,
    RetryBudgetExhausted,
    ShaperFull,
    Shed,
    StorageError,
    StormguardError,
    Throttled,
    TransientError,
)
from stormguard.overload import AdaptiveLimit
from stormguard.queue import Deferred, DeferredQueue
from stormguard.ratelimit.decision import Decision
from stormguard.ratelimit.limiter import AsyncRateLimiter, RateLimiter
from stormguard.ratelimit.rule import Rule
from stormguard.resilience import (
    AdaptiveThrottle,
    Bulkhead,
    CircuitBreaker,
    ConcurrencyLimit,
    Fallback,
    Retry,
    RetryBudget,
    Shaper,
    Timeout,
)
from stormguard.resilience.pipeline import Pipeline
from stormguard.stores import MemoryStore, Store
from stormguard.stores.hybrid import HybridStore
from stormguard.stores.regional import RegionalStore

if TYPE_CHECKING:
    from stormguard.gateways import EnvoyChecker, load_envoy_config
    from stormguard.stores.redis import RedisClusterStore, RedisStore

__all__ = [
    "AdaptiveLimit",
    "AdaptiveThrottle",
    "AsyncRateLimiter",
    "Bulkhead",
    "BulkheadFull",
    "CircuitBreaker",
    "CircuitOpen",
    "Clock",
    "ConcurrencyLimit",
    "ConfigError",
    "DeadlineExceeded",
    "Decision",
    "Deferred",
    "DeferredQueue",
    "EnvoyChecker",
    "Fallback",
    "HybridStore",
    "MemoryStore",
    "Pipeline",
    "RateLimited",
    "RateLimiter",
    "RedisClusterStore",
    "RedisStore",
    "RegionalStore",
    "Retry",
    "RetryBudget",
    "RetryBudgetExhausted",
    "Rule",
    "Shaper",
    "ShaperFull",
    "Shed",
    "StorageError",
    "Store",
    "StormguardError",
    "SystemClock",
    "Throttled",
    "Timeout",
    "TransientError",
    "load_envoy_config",
    "observability",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # the Redis stores import redis-py: only when asked for, so the core works without it
    if name in ("RedisClusterStore", "RedisStore"):
        from stormguard.stores import redis as _redis

        return getattr(_redis, name)
    if name in ("EnvoyChecker", "load_envoy_config"):  # the gateways: on first use
        from stormguard import gateways as _gateways

        return getattr(_gateways, name)
    raise AttributeError(f"module 'stormguard' has no attribute {name!r}")
