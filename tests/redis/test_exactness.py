"""4 processes x 8 threads on one key with 1000/minute admit exactly 1000, every algorithm,
on one node and on the cluster (the Lua script is the unit of atomicity)."""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

import pytest

from stormguard import RedisClusterStore, RedisStore, Rule
from stormguard.ratelimit.algorithms import ALGORITHMS
from stormguard.stores.base import Store
from stormguard.testing import FakeClock

PROCESSES = 4
THREADS = 8
HITS = 40  # per thread: 4 * 8 * 40 = 1280 attempts for 1000 slots


def _child(url: str, cluster: bool, algos: list[str], out: Any) -> None:
    clock = FakeClock()  # frozen: every process sees the same instant
    cls: type[RedisStore | RedisClusterStore] = RedisClusterStore if cluster else RedisStore
    store: Store = cls.from_url(url, clock=clock, time_source="client", timeout=5.0)
    counts = {}
    for algo in algos:
        rule = Rule(1000, 60, algorithm=algo)
        allowed = [0] * THREADS

        def work(i: int, rule: Rule = rule, allowed: list[int] = allowed) -> None:
            for _ in range(HITS):
                if store.hit("the-one-key", rule).allowed:
                    allowed[i] += 1

        threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        counts[algo] = sum(allowed)
    store.close()
    out.put(counts)


@pytest.mark.parametrize("backend", ["redis", "cluster"])
def test_exactly_the_limit_across_processes(backend: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("redis_url" if backend == "redis" else "cluster_url")
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    algos = sorted(ALGORITHMS)
    procs = [ctx.Process(target=_child, args=(url, backend == "cluster", algos, out))
             for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    for algo in algos:
        assert sum(r[algo] for r in results) == 1000, algo
