"""Queue backends by URL scheme: ``memory://``, ``sqlite://``, ``redis://`` (and
``rediss://``, ``unix://``), ``redis+cluster://`` (and ``rediss+cluster://``)."""

from __future__ import annotations

from typing import Any

from stormguard._core.errors import ConfigError
from stormguard.queue.backends.base import Backend

__all__ = ["SCHEMES", "Backend", "open_backend"]

SCHEMES = ("memory", "sqlite", "redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


def open_backend(url: object, *, stream: str | None = None, group: str | None = None,
                 consumer: str | None = None, **options: Any) -> Backend:
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError("url", url, "must be a queue URL: sqlite:///path/to/file.db, "
                          "redis://host:6379/0, redis+cluster://h1:p1,h2:p2 or memory://")
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ConfigError("url", url, f"unknown scheme {scheme!r} (one of "
                          f"{', '.join(s + '://' for s in SCHEMES)})")
    redis_only = {"stream": stream, "group": group, "consumer": consumer}
    if not scheme.startswith(("redis", "rediss", "unix")):
        for name, value in redis_only.items():
            if value is not None:
                raise ConfigError(name, value, f"applies to Redis queues only, not {scheme}://")
    if scheme == "memory":
        if url.split("://", 1)[1].strip("/"):
            raise ConfigError("url", url, "memory:// takes nothing after the scheme")
        if options:
            raise ConfigError(next(iter(options)), options[next(iter(options))],
                              "is not an option of memory://")
        from stormguard.queue.backends.memory import MemoryBackend

        return MemoryBackend()
    if scheme == "sqlite":
        from stormguard.queue.backends.sqlite import SQLiteBackend

        for name, value in options.items():
            if name not in ("busy_timeout", "durable_acks"):
                raise ConfigError(name, value, "is not an option of sqlite:// "
                                  "(busy_timeout, durable_acks)")
        return SQLiteBackend(url, **options)
    from stormguard.queue.backends.redis import RedisBackend

    return RedisBackend(url, stream=stream, group=group, consumer=consumer, **options)
