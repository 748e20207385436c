"""DeferredQueue: defers/s and drains/s against the physical limit, in one run.

* SQLite (WAL, ``synchronous=FULL``, a file in a fresh temporary directory): the physical
  limit is a raw ``BEGIN; INSERT; COMMIT`` loop writing the same row to the queue's own
  table (the same indexes) at the same durability: one fsync per job. Then ``defer`` from one
  thread, from 16 threads (group commit: concurrent defers share one fsync), and a
  worker draining the queue (no-op handler), concurrency 1 and 8; beside them the peer
  persist-queue (``SQLiteAckQueue``: put from 1 and 16 threads, get + ack), when
  installed (the ``bench`` extra).
* Redis Streams (a private redis-server on a free port, stopped at the end): the physical
  limit is a raw redis-py ``XADD`` loop (one client, one round trip per job); then
  ``defer`` (one script: idempotency key, id, ``XADD``) from one and 16 threads, and a
  worker draining.

Slices of the rows are interleaved (``--rounds``) so that load from other processes hits
them alike. Run from the repository root::

    PYTHONPATH=src:. python bench/deferred_queue.py [--n 2000] [--rounds 4]

(Not ``bench/queue.py``: a file of that name in bench/ would hide the standard
library's ``queue`` from every script run from bench/.)
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# keep bench/ off the path: bench/redis.py would be what `import redis` finds
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
for p in (ROOT, os.path.join(ROOT, "src")):
    if p not in sys.path:
        sys.path.insert(0, p)

import argparse  # noqa: E402
import shutil  # noqa: E402
import sqlite3  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable  # noqa: E402

import redis  # noqa: E402
from tests.redis_servers import start_redis  # noqa: E402

from stormguard.queue import DeferredQueue  # noqa: E402
from stormguard.queue.backends.sqlite import SCHEMA  # noqa: E402

PAYLOAD = '{"order":4711,"to":"+8801700000000"}'


def payload(i: int) -> dict[str, object]:
    return {"order": i, "to": "+8801700000000"}


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def in_threads(threads: int, n: int, one: Callable[[int], None]) -> Callable[[], None]:
    def run() -> None:
        def part(t: int) -> None:
            for i in range(t, n, threads):
                one(i)

        ts = [threading.Thread(target=part, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    return run


class Rows:
    """ops and seconds per row, accumulated over interleaved rounds."""

    def __init__(self) -> None:
        self.ops: dict[str, int] = {}
        self.secs: dict[str, float] = {}

    def add(self, name: str, ops: int, secs: float) -> None:
        self.ops[name] = self.ops.get(name, 0) + ops
        self.secs[name] = self.secs.get(name, 0.0) + secs

    def rate(self, name: str) -> float:
        return self.ops[name] / self.secs[name]

    def table(self, title: str, limit: str, notes: dict[str, str]) -> None:
        print(f"\n### {title}\n")
        print("| what | jobs/s | vs the physical limit | note |")
        print("|---|---:|---:|---|")
        base = self.rate(limit)
        for name in self.ops:
            print(f"| {name} | {self.rate(name):,.0f} | {self.rate(name) / base:.2f}x | "
                  f"{notes.get(name, '')} |")


def drain_rows(q: DeferredQueue, rows: Rows, todo: int) -> None:
    """Drain ``todo`` of the jobs deferred before, with concurrency 1 and then 8 (a worker
    with a no-op handler, in a thread, stopped once it has done ``todo``)."""
    for conc in (1, 8):
        left = q.stats()["pending"]
        if left < todo:
            break
        w = q.worker({"send_sms": lambda order, to: None}, concurrency=conc,
                     poll_interval=0.01)

        def drain_some(w: object = w) -> None:
            t = threading.Thread(target=w.run)  # type: ignore[attr-defined]
            t.start()
            while w.completed < todo:  # type: ignore[attr-defined]
                time.sleep(0.005)  # real time: polling a worker in another thread
            w.stop()  # type: ignore[attr-defined]
            t.join()

        secs = timed(drain_some)
        rows.add(f"drain (take, handler, ack), concurrency {conc}",
                 w.completed, secs)


def persist_queue(tmp: str) -> object | None:
    """The peer: persist-queue's SQLiteAckQueue (WAL, SQLite's default synchronous=FULL,
    a commit per put), JSON instead of its default pickle; None when not installed."""
    try:
        from persistqueue import SQLiteAckQueue
        from persistqueue.serializers import json as as_json
    except ImportError:
        print("(persist-queue not installed: its rows are left out)")
        return None
    return SQLiteAckQueue(os.path.join(tmp, "persist-queue"), multithreading=True,
                          serializer=as_json, auto_commit=True)


def bench_sqlite(n: int, rounds: int) -> None:
    tmp = tempfile.mkdtemp(prefix="sg-bench-queue-")
    try:
        raw = sqlite3.connect(os.path.join(tmp, "raw.db"), isolation_level=None)
        raw.execute("PRAGMA journal_mode=WAL")
        raw.execute("PRAGMA synchronous=FULL")
        raw.executescript(SCHEMA)  # the queue's own table and indexes: the same row
        q = DeferredQueue(f"sqlite:///{os.path.join(tmp, 'queue.db')}")
        rows = Rows()
        per = max(n // rounds, 16)
        seq = iter(range(10**9))
        commits = {"sixteen": 0, "sixteen_ops": 0}

        def raw_one(i: int) -> None:
            now = time.time()
            raw.execute("BEGIN")
            raw.execute("INSERT INTO stormguard_jobs (task, payload, key, ready, created) "
                        "VALUES (?, ?, ?, ?, ?)", ("send_sms", PAYLOAD, f"raw:{i}", now, now))
            raw.execute("COMMIT")

        def defer_one(i: int) -> None:
            q.defer("send_sms", payload(i), key=f"sms:{i}")

        peer = persist_queue(tmp)

        def peer_one(i: int) -> None:
            peer.put({"task": "send_sms", "payload": payload(i)})  # type: ignore[union-attr]

        for i in range(min(per, 100)):  # warm up the files
            raw_one(-1 - i)
            defer_one(-1 - i)
        for _ in range(rounds):
            base = next(seq) * per * 40
            rows.add("raw INSERT + COMMIT loop, 1 thread (physical limit)", per,
                     timed(lambda b=base: [raw_one(b + i) for i in range(per)] and None))
            rows.add("defer, 1 thread", per,
                     timed(lambda b=base: [defer_one(b + i) for i in range(per)] and None))
            c0 = q.backend.commits  # type: ignore[attr-defined]
            rows.add("defer, 16 threads", per * 4, timed(in_threads(
                16, per * 4, lambda i, b=base: defer_one(b + per + i))))
            commits["sixteen"] += q.backend.commits - c0  # type: ignore[attr-defined]
            commits["sixteen_ops"] += per * 4
            if peer is not None:
                rows.add("persist-queue SQLiteAckQueue.put, 1 thread", per,
                         timed(lambda: [peer_one(i) for i in range(per)] and None))
                rows.add("persist-queue SQLiteAckQueue.put, 16 threads", per * 4,
                         timed(in_threads(16, per * 4, peer_one)))
        drain_rows(q, rows, per * rounds)
        if peer is not None:
            todo = per * rounds
            rows.add("persist-queue get + ack, 1 thread", todo,
                     timed(lambda: [peer.ack(peer.get(block=False))  # type: ignore[union-attr]
                                    for _ in range(todo)] and None))
        group = commits["sixteen_ops"] / max(commits["sixteen"], 1)
        scale = rows.rate("defer, 16 threads") / rows.rate("defer, 1 thread")
        rows.table("SQLite, WAL + synchronous=FULL",
                   "raw INSERT + COMMIT loop, 1 thread (physical limit)",
                   {"defer, 16 threads": f"{scale:.1f}x one thread; "
                    f"{group:.1f} defers per commit (fsync)",
                    "defer, 1 thread": "one fsync per defer, as the raw loop"})
        q.close()
        raw.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_redis(n: int, rounds: int) -> None:
    server = start_redis()
    try:
        r = redis.Redis(host="127.0.0.1", port=server.port)
        stream = f"bench-{uuid.uuid4().hex[:8]}"
        q = DeferredQueue(server.url, stream=stream)
        rows = Rows()
        per = max(n // rounds, 16)
        counter = iter(range(10**9))

        def raw_loop() -> None:
            for _ in range(per):
                r.xadd("raw-stream", {"task": "send_sms", "payload": PAYLOAD})

        def defer_one(i: int) -> None:
            q.defer("send_sms", payload(i), key=f"sms:{i}")

        for _ in range(rounds):
            b = next(counter) * per * 40
            rows.add("raw redis-py XADD loop, 1 client (physical limit)", per, timed(raw_loop))
            rows.add("defer, 1 thread", per,
                     timed(lambda b=b: [defer_one(b + i) for i in range(per)] and None))
            rows.add("defer, 16 threads", per * 4, timed(in_threads(
                16, per * 4, lambda i, b=b: defer_one(b + per + i))))
        drain_rows(q, rows, per * rounds)
        rows.table("Redis Streams (one local redis-server)",
                   "raw redis-py XADD loop, 1 client (physical limit)",
                   {"defer, 1 thread": "one script per defer: key check, id, XADD",
                    "drain (take, handler, ack), concurrency 1":
                        "one script per round: acknowledge the jobs done, take more"})
        q.close()
        r.close()
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="jobs per row (default 2000)")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved slices (default 4)")
    ap.add_argument("--only", choices=("sqlite", "redis"), default=None)
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, n={args.n}, "
          f"rounds={args.rounds}")
    if args.only in (None, "sqlite"):
        bench_sqlite(args.n, args.rounds)
    if args.only in (None, "redis"):
        bench_redis(args.n, args.rounds)


if __name__ == "__main__":
    main()
