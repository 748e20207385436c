"""Stores, chosen by URL through a plain registry.

``memory://`` is built in; ``redis://``, ``rediss://``, ``unix://`` and
``redis+cluster://`` register themselves when the ``redis`` extra is installed;
``stormguard+http://`` and ``stormguard+https://`` (a central ``stormguard serve``:
:class:`stormguard.client.ServiceStore`) need the ``httpx`` extra.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from stormguard._core.errors import ConfigError
from stormguard.stores.base import Store
from stormguard.stores.memory import MemoryStore

__all__ = ["MemoryStore", "Store", "from_url", "register"]

# mypyc builds the compiled MemoryStore without running ABCMeta.__new__, so the class would
# inherit Store's ABC caches (`_abc_impl`): isinstance(x, MemoryStore) then answered what
# isinstance(x, Store) had cached, True for any store already checked against Store.
# Give the class its own caches (a no-op for the pure-Python class, which has them).
if "_abc_impl" not in MemoryStore.__dict__:
    abc._abc_init(MemoryStore)  # type: ignore[attr-defined]

StoreFactory = Callable[..., Store]

# scheme -> "module:attribute" (imported lazily) or a factory
_REGISTRY: dict[str, str | StoreFactory] = {
    "memory": MemoryStore.from_url,
    "redis": "stormguard.stores.redis:RedisStore.from_url",
    "rediss": "stormguard.stores.redis:RedisStore.from_url",
    "unix": "stormguard.stores.redis:RedisStore.from_url",
    "redis+cluster": "stormguard.stores.redis:RedisClusterStore.from_url",
    "rediss+cluster": "stormguard.stores.redis:RedisClusterStore.from_url",
    "hybrid+memory": "stormguard.stores.hybrid:HybridStore.from_url",
    "hybrid+redis": "stormguard.stores.hybrid:HybridStore.from_url",
    "hybrid+rediss": "stormguard.stores.hybrid:HybridStore.from_url",
    "hybrid+unix": "stormguard.stores.hybrid:HybridStore.from_url",
    "hybrid+redis+cluster": "stormguard.stores.hybrid:HybridStore.from_url",
    "hybrid+rediss+cluster": "stormguard.stores.hybrid:HybridStore.from_url",
    "stormguard+http": "stormguard.client:ServiceStore.from_url",
    "stormguard+https": "stormguard.client:ServiceStore.from_url",
}


_EXTRA = {"stormguard.client": "httpx"}


def register(scheme: str, factory: StoreFactory) -> None:
    """Make ``scheme://...`` URLs build stores with ``factory(url, **options)``."""
    _REGISTRY[scheme] = factory


def _resolve(target: str) -> StoreFactory:
    module, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError("store", target, f"backend not installed ({exc}); "
                          f"install stormguard[{_EXTRA.get(module, 'redis')}]") from exc
    for part in attr.split("."):
        obj = getattr(obj, part)
    factory: StoreFactory = obj
    return factory


def from_url(url: str, **options: Any) -> Store:
    """Build a store from ``memory://``, ``redis://host:6379/0``, ``redis+cluster://h1:p1,h2:p2``."""
    if not isinstance(url, str):
        raise ConfigError("store", url, "must be a URL string such as 'memory://'")
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    target = _REGISTRY.get(scheme)
    if target is None:
        raise ConfigError("store", url,
                          f"unknown scheme {scheme!r}; expected one of {sorted(_REGISTRY)}")
    factory = _resolve(target) if isinstance(target, str) else target
    return factory(url, **options)
