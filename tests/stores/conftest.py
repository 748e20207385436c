"""One store per backend (memory, Redis, Redis Cluster), driven sync or async.

``backend`` is a :class:`Backend`: the store, its FakeClock, and the five contract steps
(``hit``, ``peek``, ``hit_all``, ``reset``, ``ping``) run through either the blocking
methods or the coroutines (``ahit``, ...) on an event loop the fixture owns, so the
tests read the same in both modes. Redis stores take the client's (fake) time, so every
test is deterministic and none sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import pytest
import redis

from stormguard import Decision, MemoryStore, RedisClusterStore, RedisStore, Rule, Store
from stormguard.testing import FakeClock
from tests.redis_servers import RedisCluster, RedisServer

BACKENDS = ("memory", "redis", "cluster")
MODES = ("sync", "async")

_T = TypeVar("_T")


class Backend:
    """A store under test and the contract steps, sync or async alike."""

    def __init__(self, kind: str, mode: str, url: str, clock: FakeClock) -> None:
        self.kind = kind
        self.mode = mode
        self.url = url
        self.clock = clock
        self.loop = asyncio.new_event_loop() if mode == "async" else None
        self._made: list[Store] = []
        self.store = self.make()
        self.clients: list[redis.Redis] = []
        """Direct connections to the Redis servers behind the store (none for memory)."""

    def held(self) -> int:
        """How many counters the backend holds (every store made here counts)."""
        if self.kind == "memory":
            return sum(len(s._data) for s in self._made if isinstance(s, MemoryStore))
        return sum(int(c.dbsize()) for c in self.clients)

    def make(self, **options: Any) -> Store:
        """Another store on the same backend (Redis: the same server, so shared counters)."""
        store: Store
        if self.kind == "memory":
            store = MemoryStore(clock=self.clock, **options)
        elif self.kind == "redis":
            store = RedisStore.from_url(self.url, clock=self.clock, time_source="client",
                                        **{"timeout": 1.0, **options})
        else:
            store = RedisClusterStore.from_url(self.url, clock=self.clock, time_source="client",
                                               **{"timeout": 1.0, **options})
        self._made.append(store)
        return store

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run a coroutine on this backend's loop (async mode only)."""
        assert self.loop is not None, "run() is for the async mode"
        return self.loop.run_until_complete(coro)

    # -- the contract steps ------------------------------------------------------
    def hit(self, key: Any, rule: Rule, cost: Any = 1) -> Decision:
        if self.loop is None:
            return self.store.hit(key, rule, cost)
        return self.run(self.store.ahit(key, rule, cost))

    def peek(self, key: Any, rule: Rule, cost: Any = 1) -> Decision:
        if self.loop is None:
            return self.store.peek(key, rule, cost)
        return self.run(self.store.apeek(key, rule, cost))

    def hit_all(self, key: Any, rules: Sequence[Any] | Rule, cost: Any = 1) -> Decision:
        # a lone Rule is accepted too (the stores treat it as a list of one)
        if self.loop is None:
            return self.store.hit_all(key, rules, cost)  # type: ignore[arg-type]
        return self.run(self.store.ahit_all(key, rules, cost))  # type: ignore[arg-type]

    def reset(self, key: Any, rule: Rule | Sequence[Rule]) -> None:
        if self.loop is None:
            self.store.reset(key, rule)
        else:
            self.run(self.store.areset(key, rule))

    def ping(self) -> bool:
        if self.loop is None:
            return self.store.ping()
        return self.run(self.store.aping())

    def close(self) -> None:
        for store in self._made:
            if self.loop is None:
                store.close()
            else:
                self.run(store.aclose())
        if self.loop is not None:
            self.loop.close()

    def __repr__(self) -> str:
        return f"Backend({self.kind}, {self.mode})"


class KeptClients:
    """One kept connection per server for the session (a new one per test costs 5 ms)."""

    def __init__(self) -> None:
        self.clients: dict[int, redis.Redis] = {}

    def __call__(self, server: RedisServer) -> redis.Redis:
        client = self.clients.get(server.port)
        if client is None:
            client = self.clients[server.port] = server.client()
        return client

    def flush(self, cluster: RedisCluster) -> None:
        """Empty every master of ``cluster``."""
        for node in cluster.nodes:
            self(node).flushall()

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()


@pytest.fixture(scope="session")
def kept() -> Iterator[KeptClients]:
    clients = KeptClients()
    yield clients
    clients.close()


@pytest.fixture(params=BACKENDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(kind: str, kept: KeptClients, request: pytest.FixtureRequest) -> str:
    """The backend's URL, its servers emptied ("" for memory)."""
    if kind == "redis":
        return str(request.getfixturevalue("redis_url"))  # flushed
    if kind == "cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        kept.flush(cluster)
        return cluster.url
    return ""


@pytest.fixture
def backend(kind: str, mode: str, url: str, clock: FakeClock, kept: KeptClients,
            request: pytest.FixtureRequest) -> Iterator[Backend]:
    """A fresh store (empty servers) of each backend, driven sync and async."""
    b = Backend(kind, mode, url, clock)
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        b.clients = [kept(server)]
    elif kind == "cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        b.clients = [kept(n) for n in cluster.nodes]
    yield b
    b.close()
