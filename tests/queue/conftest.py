"""Every behaviour test runs on each backend: memory://, sqlite:// and Redis Streams."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stormguard.queue import DeferredQueue
from stormguard.testing import FakeClock
from tests.redis_servers import RedisServer

BACKENDS = ["memory", "sqlite", "redis"]

MakeQueue = Callable[..., DeferredQueue]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def queue_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'deferred.db'}"
    server: RedisServer = request.getfixturevalue("redis_server")
    if server.proc.poll() is not None:
        server.restart()
    return server.url


@pytest.fixture
def make_queue(queue_url: str, backend: str) -> Iterator[MakeQueue]:
    """Queues on the test's backend (one fresh stream per test on Redis); closed after."""
    made: list[DeferredQueue] = []
    stream = f"t-{uuid.uuid4().hex[:12]}"

    def make(clock: FakeClock | None = None, **options: object) -> DeferredQueue:
        if backend == "redis":
            options.setdefault("stream", stream)
        if backend == "memory" and made:
            raise AssertionError("a memory queue cannot be opened twice")
        q = DeferredQueue(queue_url, clock=clock, **options)  # type: ignore[arg-type]
        made.append(q)
        return q

    yield make
    for q in made:
        q.close()


@pytest.fixture
def queue(make_queue: MakeQueue, clock: FakeClock) -> DeferredQueue:
    return make_queue(clock)
