"""The SQLite backend: durability settings, group commit with real threads, several
connections on one file, and the same answers as the memory backend (Hypothesis)."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stormguard import ConfigError, DeferredQueue
from stormguard.queue.backends.sqlite import SCHEMA, GroupCommit, SQLiteBackend
from tests.queue.histories import replay


def test_wal_and_synchronous_full(tmp_path: Path) -> None:
    q = DeferredQueue(f"sqlite:///{tmp_path / 'q.db'}")
    backend = q.backend
    assert isinstance(backend, SQLiteBackend)
    seen: list[tuple[str, int]] = []

    def spy_on(group: GroupCommit) -> None:
        commit = group._transaction

        def spy(conn: Any, batch: Any, *, isolated: bool) -> None:
            commit(conn, batch, isolated=isolated)
            seen.append((conn.execute("PRAGMA journal_mode").fetchone()[0],
                         conn.execute("PRAGMA synchronous").fetchone()[0]))

        group._transaction = spy  # type: ignore[method-assign]

    spy_on(backend._group)
    q.defer("t", {})
    assert seen[-1] == ("wal", 2)  # a defer commits with synchronous=FULL: fsynced
    [job] = backend.take(1, q.clock.wall(), 30.0, "w")
    assert seen[-1] == ("wal", 1)  # a lease: NORMAL (lost with the machine: delivered again)
    assert backend.retry_later(job, q.clock.wall(), 1, "boom")
    assert seen[-1] == ("wal", 2)  # a failed attempt is recorded durably
    [job] = backend.take(1, q.clock.wall() + 5, 30.0, "w")
    assert backend.ack(job)
    assert seen[-1] == ("wal", 1)
    q.close()
    strict = SQLiteBackend(f"sqlite:///{tmp_path / 'q.db'}", durable_acks=True)
    strict.put("t", "{}", None, 0.0)
    [job] = strict.take(1, 1.0, 30.0, "w")
    spy_on(strict._group)
    assert strict.ack(job)
    assert seen[-1] == ("wal", 2)
    strict.close()


def test_concurrent_defers_share_commits(tmp_path: Path) -> None:
    q = DeferredQueue(f"sqlite:///{tmp_path / 'q.db'}")
    backend = q.backend
    assert isinstance(backend, SQLiteBackend)
    threads, each = 16, 40
    ids: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def produce(t: int) -> None:
        start.wait()
        for i in range(each):
            job = q.defer("send_sms", {"t": t, "i": i}, key=f"{t}:{i}")
            with lock:
                ids.append(job)

    c0 = backend.commits
    workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    commits = backend.commits - c0
    assert len(ids) == len(set(ids)) == threads * each
    assert q.stats()["pending"] == threads * each
    # group commit: far fewer transactions (fsyncs) than defers
    assert commits < threads * each / 2, commits
    q.close()


def test_one_failing_operation_of_a_batch_fails_alone(tmp_path: Path) -> None:
    backend = SQLiteBackend(f"sqlite:///{tmp_path / 'q.db'}")
    group: GroupCommit = backend._group
    from stormguard.queue.backends.sqlite import _Pending

    def insert(key: str) -> Any:
        return lambda conn: conn.execute(
            "INSERT INTO stormguard_jobs (task, payload, key, ready, created) "
            "VALUES ('t', '{}', ?, 0, 0)", (key,)).lastrowid

    def broken(conn: Any) -> None:
        conn.execute("INSERT INTO stormguard_jobs (task, payload, key, ready, created) "
                     "VALUES ('t', '{}', 'b', 0, 0)")
        raise ValueError("half-done operation")

    batch = [_Pending(insert("a")), _Pending(broken), _Pending(insert("c"))]
    group._execute(batch)
    assert [op.done for op in batch] == [True, True, True]
    assert isinstance(batch[1].error, ValueError)
    assert batch[0].error is None
    assert batch[2].error is None
    keys = [r[0] for r in group._conn.execute(  # type: ignore[union-attr]
        "SELECT key FROM stormguard_jobs ORDER BY id")]
    assert keys == ["a", "c"]  # the failed operation left nothing behind
    backend.close()


def test_two_connections_share_one_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    a, b = DeferredQueue(url), DeferredQueue(url)
    assert a.defer("t", {"n": 1}, key="k") == b.defer("t", {"n": 1}, key="k")
    b.defer("t", {"n": 2})
    seen: list[int] = []

    def record(n: int) -> None:
        seen.append(n)

    assert a.worker({"t": record}).drain(timeout=10)
    assert sorted(seen) == [1, 2]
    assert b.stats() == {"pending": 0, "in_flight": 0, "dead": 0}
    a.close()
    b.close()


def test_bad_urls(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must name a database file"):
        DeferredQueue("sqlite://")
    with pytest.raises(ConfigError, match="must name a database file"):
        DeferredQueue("sqlite://:memory:")
    with pytest.raises(ConfigError, match="does not exist"):
        DeferredQueue(f"sqlite:///{tmp_path}/no/such/dir/q.db")
    with pytest.raises(ConfigError, match="unknown scheme 'postgres'"):
        DeferredQueue("postgres://db/q")
    with pytest.raises(ConfigError, match="stream: applies to Redis queues only"):
        DeferredQueue(f"sqlite:///{tmp_path}/q.db", stream="sms")
    with pytest.raises(ConfigError, match="is not an option of memory://"):
        DeferredQueue("memory://", busy_timeout=3)
    with pytest.raises(ConfigError, match=r"bogus: is not an option of sqlite://"):
        DeferredQueue(f"sqlite:///{tmp_path}/q.db", bogus=1)
    with pytest.raises(ConfigError, match="busy_timeout: must be"):
        DeferredQueue(f"sqlite:///{tmp_path}/q.db", busy_timeout=-1)
    with pytest.raises(ConfigError, match="durable_acks: must be true or false"):
        DeferredQueue(f"sqlite:///{tmp_path}/q.db", durable_acks="yes")
    with pytest.raises(TypeError, match="clock: must be a stormguard Clock"):
        DeferredQueue("memory://", clock=42)  # type: ignore[arg-type]


def test_memory_queue_says_it_is_not_durable(caplog: pytest.LogCaptureFixture) -> None:
    q = DeferredQueue("memory://")
    assert q.durable is False
    assert "not durable" in repr(q)
    assert "is not durable" in caplog.text


# -- the same answers as the memory backend, on random histories --------------------------
OPS = st.lists(st.one_of(
    st.tuples(st.just("defer"), st.sampled_from([None, "a", "b", "c"])),
    st.tuples(st.just("take"), st.integers(1, 3)),
    st.tuples(st.sampled_from(["ack", "fail", "release", "bury"]), st.integers(0, 5)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 3.0, 11.0])),
    st.tuples(st.just("retry_dead"), st.none()),
), max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_sqlite_answers_as_the_memory_backend(ops: list[tuple[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        assert replay(f"sqlite:///{tmp}/q.db", ops) == replay("memory://", ops)


def test_a_forked_child_opens_its_own_connection(tmp_path: Path) -> None:
    import os

    q = DeferredQueue(f"sqlite:///{tmp_path / 'q.db'}")
    q.defer("t", {"n": 0})
    parent_conn = q.backend._group._conn  # type: ignore[attr-defined]
    pid = os.fork()
    if pid == 0:  # the child: defers through a connection of its own, then exits
        try:
            q.defer("t", {"n": 1})
            ok = q.backend._group._conn is not parent_conn  # type: ignore[attr-defined]
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    q.defer("t", {"n": 2})  # the parent's connection still works
    assert q.backend._group._conn is parent_conn  # type: ignore[attr-defined]
    assert q.stats()["pending"] == 3
    q.close()


def test_a_file_made_before_lost_leases_were_counted_is_upgraded(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    old = SCHEMA.replace("    lost INTEGER NOT NULL DEFAULT 0,\n", "")
    assert "lost" not in old
    conn = sqlite3.connect(path)
    conn.executescript(old)
    conn.execute("INSERT INTO stormguard_jobs (task, payload, ready, created) "
                 "VALUES ('t', '{\"n\": 1}', 0, 0)")
    conn.commit()
    conn.close()
    q = DeferredQueue(f"sqlite:///{path}")
    [job] = q.backend.take(1, q.clock.wall(), 30.0, "w")
    assert (job.arguments(), job.lost) == ({"n": 1}, 0)
    q.close()
