"""SIGKILL durability with real processes: a worker killed mid-drain, a producer killed
mid-defer. Real time throughout: real processes doing real I/O, killed by a real signal.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stormguard.queue import DeferredQueue
from tests.redis_servers import RedisCluster, RedisServer

ROOT = Path(__file__).resolve().parents[2]
PROCS = Path(__file__).with_name("procs.py")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "redis"])
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(url, stream) of a durable queue: a SQLite file, or a fresh stream on Redis."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'deferred.db'}", ""
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    if server.proc.poll() is not None:
        server.restart()
    yield server.url, f"dur-{uuid.uuid4().hex[:10]}"


def _queue(url: str, stream: str) -> DeferredQueue:
    return DeferredQueue(url, stream=stream) if stream else DeferredQueue(url)


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(PROCS), *args], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _wait_for(proc: subprocess.Popen[bytes], path: Path, predicate: object,
              limit: float = 15.0) -> None:
    give_up = time.monotonic() + limit
    while not predicate(_lines(path)):  # type: ignore[operator]
        if proc.poll() is not None:
            raise AssertionError(f"child died: {proc.stderr.read().decode()[-2000:]}"
                                 if proc.stderr else "child died")
        assert time.monotonic() < give_up, "the child never got there"
        time.sleep(0.01)  # real time: waiting for a real child process


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    if proc.stderr:
        proc.stderr.close()


@pytest.fixture(params=["sqlite", "redis", "redis-cluster", "sqlite-async"])
def killed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(url, stream, mode) of a worker-kill run: SQLite, Redis, a Redis Cluster, and the
    asyncio worker on SQLite."""
    if request.param.startswith("sqlite"):
        mode = "async" if request.param.endswith("async") else "sync"
        yield f"sqlite:///{tmp_path / 'deferred.db'}", "", mode
        return
    stream = f"dur-{uuid.uuid4().hex[:10]}"
    if request.param == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        yield cluster.url, stream, "sync"
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    if server.proc.poll() is not None:
        server.restart()
    yield server.url, stream, "sync"


def test_a_worker_killed_mid_drain_loses_nothing(killed: tuple[str, str, str],
                                                 tmp_path: Path) -> None:
    url, stream, mode = killed
    n, concurrency = 400, 8
    q = _queue(url, stream)
    for i in range(n):
        q.defer("job", {"i": i}, key=f"j:{i}")
    log = tmp_path / "worker1.log"
    child = _spawn("worker", url, stream, str(log), str(concurrency), "1.0", mode)
    try:
        _wait_for(child, log, lambda lines: sum(x.startswith("done") for x in lines) >= 100)
    finally:
        _kill(child)  # SIGKILL mid-drain: some jobs started, some done but not acknowledged
    first = _lines(log)
    started_1 = {int(x.split()[1]) for x in first if x.startswith("start")}
    done_1 = [int(x.split()[1]) for x in first if x.startswith("done")]
    assert 100 <= len(done_1) < n, "the kill must land mid-drain"
    left = q.stats()
    assert left["pending"] + left["in_flight"] <= n - len(done_1) + concurrency

    # a second worker (in this process) takes over, the dead one's leases ending after 1 s
    done_2: list[int] = []

    def record(i: int) -> None:
        done_2.append(i)

    worker = q.worker({"job": record}, concurrency=concurrency,
                      visibility_timeout=1.0, poll_interval=0.02)
    assert worker.drain(timeout=20.0)
    assert q.stats() == {"pending": 0, "in_flight": 0, "dead": 0}
    delivered = collections.Counter(done_1 + done_2)
    assert set(delivered) == set(range(n)), "every job delivered, none lost"
    duplicates = {i for i, c in delivered.items() if c > 1}
    # duplicates only for jobs in flight at the kill: started by the killed worker, at most
    # one lease batch of them
    assert duplicates <= started_1
    assert len(duplicates) <= concurrency
    assert all(c <= 2 for c in delivered.values())
    q.close()


def test_a_producer_killed_mid_defer_loses_no_returned_defer(
        durable: tuple[str, str], tmp_path: Path) -> None:
    url, stream = durable
    threads = 4  # concurrent defers: on SQLite they share commits (group commit)
    log = tmp_path / "producer.log"
    _queue(url, stream).close()  # the schema or the group exists before the child starts
    child = _spawn("producer", url, stream, str(log), str(threads))
    try:
        _wait_for(child, log, lambda lines: len(lines) >= 300)
    finally:
        _kill(child)
    returned = {int(x) for x in _lines(log)}
    q = _queue(url, stream)
    queued: list[int] = []
    while True:
        jobs = q.backend.take(500, q.clock.wall(), 60.0, "checker")
        if not jobs:
            break
        queued.extend(j.arguments()["i"] for j in jobs)
    assert returned <= set(queued), f"lost: {sorted(returned - set(queued))[:10]}"
    assert len(queued) == len(set(queued)), "each defer stored once"
    # what was not yet logged when the kill came is at most one defer per thread
    assert len(set(queued) - returned) <= threads
    q.close()


def test_worker_processes_sharing_a_queue_never_take_a_job_twice(
        durable: tuple[str, str], tmp_path: Path) -> None:
    """Three worker processes drain one queue at once: taking is atomic, so with no
    crash every job runs exactly once."""
    url, stream = durable
    n = 200
    q = _queue(url, stream)
    logs = [tmp_path / f"w{k}.log" for k in range(3)]
    children = [_spawn("worker", url, stream, str(log), "4", "30.0") for log in logs]

    def done() -> list[int]:
        return [int(x.split()[1]) for log in logs for x in _lines(log)
                if x.startswith("done")]

    try:
        for child, log in zip(children, logs, strict=True):
            _wait_for(child, log, lambda lines: "ready" in lines)
        for i in range(n):  # all three are polling: they compete for every job
            q.defer("job", {"i": i})
        give_up = time.monotonic() + 30
        while q.stats() != {"pending": 0, "in_flight": 0, "dead": 0}:
            assert time.monotonic() < give_up, "the workers never finished"
            assert all(c.poll() is None for c in children), "a worker died"
            time.sleep(0.02)  # real time: waiting for real child processes
    finally:
        for c in children:
            _kill(c)
    counts = collections.Counter(done())
    assert set(counts) == set(range(n))
    assert max(counts.values()) == 1, [i for i, c in counts.items() if c > 1][:10]
    assert sum(1 for log in logs if any(x.startswith("done") for x in _lines(log))) >= 2
    q.close()
