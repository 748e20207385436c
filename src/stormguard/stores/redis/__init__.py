"""Redis and Redis Cluster: a transport that knows nothing about rate limiting, and the
rate-limit stores built on it.

* :mod:`.protocol` — :class:`Command` (RESP bytes + routing key + script name),
  ``Endpoint`` (URL + redis-py options), the errors;
* :mod:`.transport` — :class:`RedisTransport` (one server: a blocking pool and a
  pipelined connection per event loop), the breaker protocol; :func:`transport_for`;
* :mod:`.pool` — the blocking path: a bounded, first-come-first-served connection pool;
* :mod:`.mux` — the asyncio pipelined multiplexer (hiredis on asyncio streams);
* :mod:`.cluster` — :class:`ClusterTransport`: slot map, routing by each command's key,
  MOVED/ASK, background refresh; :mod:`.router` — its asyncio side;
* :mod:`.scripts` — Lua scripts registered by name; ``NOSCRIPT`` answered by the
  transport for any registered script;
* :mod:`.store` — :class:`RedisStore` and :class:`RedisClusterStore`: keys, script
  arguments and decisions (the only rate-limit code here).

Any other component (a hybrid store's sync, shaper reservations, a Streams queue, the
service's rules source) reuses the transport with its own scripts and commands::

    from stormguard.stores.redis import Command, register, transport_for

    t = transport_for("redis+cluster://10.0.0.1:7000", timeout=0.2)
    t.call(Command.of("XADD", "{q}:jobs", "*", "n", "1", key="{q}:jobs"))
"""

from __future__ import annotations

from typing import Any

from stormguard.stores.redis.cluster import ClusterTransport
from stormguard.stores.redis.mux import EAGER_BATCH
from stormguard.stores.redis.protocol import Command
from stormguard.stores.redis.scripts import Script, register
from stormguard.stores.redis.store import (
    SCRIPT,
    SCRIPT_NAME,
    RedisClusterStore,
    RedisStore,
    load_script,
)
from stormguard.stores.redis.transport import RedisTransport, Transport

__all__ = [
    "EAGER_BATCH",
    "SCRIPT",
    "SCRIPT_NAME",
    "ClusterTransport",
    "Command",
    "RedisClusterStore",
    "RedisStore",
    "RedisTransport",
    "Script",
    "Transport",
    "load_script",
    "register",
    "transport_for",
]


def transport_for(url: str, **options: Any) -> RedisTransport | ClusterTransport:
    """The transport for a store URL: ``redis://``, ``rediss://``, ``unix://`` (one server)
    or ``redis+cluster://``, ``rediss+cluster://`` (a cluster). ``options``: ``timeout``,
    ``connect_timeout``, ``max_connections``, ``clock``, ``breakers`` and redis-py
    connection options, as for the stores."""
    if url.split("://", 1)[0].endswith("+cluster"):
        return ClusterTransport.from_url(url, **options)
    return RedisTransport.from_url(url, **options)
