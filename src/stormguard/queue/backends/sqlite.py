"""``sqlite:///path/to/file.db``: the embedded, durable default.

WAL journal with ``synchronous=FULL``: a job is on disk (the WAL is fsynced) before
``put`` returns; so are retries, dead letters and ``retry_dead``. A worker's leases,
hand-backs and (unless ``durable_acks=True``) acknowledgements are committed with
``synchronous=NORMAL``: written to the WAL before the call returns, so a crash of any
process loses none of them, but not fsynced, so a crash of the *machine* may undo the
last of them; the job is then delivered again (at least once), never lost.

**Group commit**: every operation goes through one connection per queue object; the
thread that finds no commit under way leads: it runs every operation queued so far in one
transaction and commits once, so concurrent defers share one fsync (an operation that
fails makes the batch run again with a savepoint per operation, so it fails alone).
Several processes may share the file: SQLite's own locking serialises their
transactions (``BEGIN IMMEDIATE``, a busy timeout).

One row per live job; its ``ready`` column is when it may be taken: when deferred, the
time it was deferred; when leased, the end of its lease (a job whose worker died is
taken again then); after a failure, the time of its retry.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from stormguard._core import validate
from stormguard._core.errors import ConfigError, StorageError
from stormguard.queue.backends.base import Backend
from stormguard.queue.job import DeadLetter, Job, decode_payload

__all__ = ["GroupCommit", "SQLiteBackend"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS stormguard_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task TEXT NOT NULL,
    payload TEXT NOT NULL,
    key TEXT UNIQUE,
    attempts INTEGER NOT NULL DEFAULT 0,
    ready REAL NOT NULL,
    token TEXT,
    error TEXT,
    lost INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS stormguard_jobs_ready ON stormguard_jobs (ready, id);
CREATE TABLE IF NOT EXISTS stormguard_dead (
    id INTEGER PRIMARY KEY,
    task TEXT NOT NULL,
    payload TEXT NOT NULL,
    key TEXT,
    attempts INTEGER NOT NULL,
    error TEXT NOT NULL,
    created REAL NOT NULL,
    died REAL NOT NULL
);
"""

Op = Callable[[sqlite3.Connection], Any]


class _OpFailed(Exception):
    """An operation of a batch run without savepoints failed: run it again with them."""


class _Pending:
    __slots__ = ("done", "durable", "error", "fn", "result", "wake")

    def __init__(self, fn: Op, durable: bool = True) -> None:
        self.fn = fn
        self.durable = durable
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.wake = threading.Lock()
        self.wake.acquire()  # released once: the operation is done, or its thread leads


class GroupCommit:
    """Run operations on one SQLite connection, many per transaction (one fsync).

    The caller that finds no transaction under way leads: it runs every operation queued
    so far in one transaction, wakes their callers, and hands the lead to the first
    caller that queued meanwhile (each waiter sleeps on a lock of its own: a commit
    wakes only the callers it served, and the next leader).
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._queue: list[_Pending] = []
        self._busy = False
        self._full = True  # the connection's synchronous setting: FULL (True) or NORMAL
        self.commits = 0
        """Transactions committed (for tests and the benchmark: operations / commits is the
        group size)."""

    def run(self, fn: Op, *, durable: bool = True) -> Any:
        """Run ``fn(conn)`` in a transaction shared with the operations queued meanwhile.
        ``durable``: its commit is fsynced (``synchronous=FULL``) before this returns;
        a transaction of only non-durable operations is committed with
        ``synchronous=NORMAL`` (written to the WAL, so a crash of the process loses
        nothing; a crash of the machine may lose it)."""
        op = _Pending(fn, durable)
        with self._lock:
            self._queue.append(op)
            lead = not self._busy
            self._busy = True
        if not lead:
            op.wake.acquire()  # done, or handed the lead
        if not op.done:
            self._lead()
        if op.error is not None:
            raise op.error
        return op.result

    def _lead(self) -> None:
        with self._lock:
            batch, self._queue = self._queue, []
        try:
            self._execute(batch)
        finally:
            with self._lock:
                nxt = self._queue[0] if self._queue else None
                if nxt is None:
                    self._busy = False
            for op in batch:
                if op.wake.locked():
                    op.wake.release()
            if nxt is not None:
                nxt.wake.release()  # not done: its thread leads the next transaction

    def _execute(self, batch: list[_Pending]) -> None:
        try:
            if self._conn is None or self._pid != os.getpid():
                # a connection must not cross a fork (gunicorn --preload): the child
                # opens its own and leaves the parent's alone
                self._conn = self._connect()
                self._pid = os.getpid()
                self._full = True
            try:
                self._transaction(self._conn, batch, isolated=False)
            except _OpFailed:
                # one operation failed: run the batch again, each operation in a savepoint
                # of its own, so it fails alone (a rare path: a constraint, a bad value)
                self._transaction(self._conn, batch, isolated=True)
        except sqlite3.Error as exc:
            err = StorageError(f"sqlite: {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            for op in batch:
                op.error = err
                op.result = None
        except BaseException as exc:
            for op in batch:
                op.error = exc
            raise
        finally:
            for op in batch:
                op.done = True

    def _transaction(self, conn: sqlite3.Connection, batch: list[_Pending], *,
                     isolated: bool) -> None:
        full = any(op.durable for op in batch)
        if full != self._full:  # outside a transaction: SQLite ignores it inside one
            conn.execute("PRAGMA synchronous=FULL" if full else "PRAGMA synchronous=NORMAL")
            self._full = full
        conn.execute("BEGIN IMMEDIATE")
        try:
            for op in batch:
                if not isolated:
                    try:
                        op.result = op.fn(conn)
                    except Exception as exc:
                        if len(batch) == 1:
                            raise
                        raise _OpFailed from exc
                    continue
                conn.execute("SAVEPOINT op")
                try:
                    op.result = op.fn(conn)
                except Exception as exc:
                    conn.execute("ROLLBACK TO op")
                    op.error = exc
                conn.execute("RELEASE op")
            conn.execute("COMMIT")
            self.commits += 1
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        """Close the connection once no transaction is under way (a later operation
        opens it again)."""
        while True:
            with self._lock:
                if not self._busy:
                    conn, self._conn = self._conn, None
                    break
            time.sleep(0.001)  # real time: a transaction of another thread is finishing
        if conn is not None:
            conn.close()

def path_of(url: str) -> str:
    """The file of ``sqlite:///abs/path.db`` (absolute) or ``sqlite://rel.db``."""
    path = url.split("://", 1)[1]
    if not path or path in (":memory:", "/:memory:"):
        raise ConfigError("url", url, "must name a database file, e.g. "
                          "sqlite:///var/lib/app/deferred.db (memory:// for a queue in memory)")
    return path


class SQLiteBackend(Backend):
    """Jobs in a SQLite file (WAL, synchronous=FULL, group commit)."""

    durable = True

    def __init__(self, url: str, *, busy_timeout: float = 30.0,
                 durable_acks: bool = False) -> None:
        self.path = path_of(url)
        self.busy_timeout = validate.duration("busy_timeout", busy_timeout)
        self.durable_acks = validate.boolean("durable_acks", durable_acks)
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise ConfigError("url", url, f"the directory {directory} does not exist")
        self._group = GroupCommit(self._connect)
        self._tokens = itertools.count(1)
        self._group.run(lambda conn: None)  # open and create the schema now: errors here

    def __repr__(self) -> str:
        return f"SQLiteBackend({self.path!r})"

    @property
    def commits(self) -> int:
        return self._group.commits

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None,
                               check_same_thread=False)
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StorageError(f"sqlite: {self.path}: cannot use the WAL journal "
                                   f"(journal_mode is {mode})")
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(SCHEMA)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(stormguard_jobs)")}
            if "lost" not in columns:  # a file made before leases were counted
                conn.execute("ALTER TABLE stormguard_jobs ADD COLUMN lost INTEGER NOT NULL "
                             "DEFAULT 0")
        except BaseException:
            conn.close()
            raise
        return conn

    def _run(self, fn: Op, *, durable: bool = True) -> Any:
        return self._group.run(fn, durable=durable)

    # -- operations -----------------------------------------------------------------------
    def put(self, task: str, payload: str, key: str | None, now: float) -> str:
        def op(conn: sqlite3.Connection) -> str:
            row = conn.execute(
                "INSERT INTO stormguard_jobs (task, payload, key, ready, created) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING RETURNING id",
                (task, payload, key, now, now)).fetchone()
            if row is None:
                row = conn.execute("SELECT id FROM stormguard_jobs WHERE key = ?",
                                   (key,)).fetchone()
            return str(row[0])

        result: str = self._run(op)
        return result

    def finish(self, done: Sequence[Job], n: int, now: float, lease: float,
               owner: str) -> tuple[list[bool], list[Job]]:
        take = self._take_op(n, now, lease, owner) if n > 0 else None
        params = [(int(job.id), job.token) for job in done]

        def op(conn: sqlite3.Connection) -> tuple[list[bool], list[Job]]:
            acked = [conn.execute("DELETE FROM stormguard_jobs WHERE id = ? AND token = ?",
                                  p).rowcount > 0 for p in params]
            return acked, (take(conn) if take is not None else [])

        result: tuple[list[bool], list[Job]] = self._run(
            op, durable=bool(done) and self.durable_acks)
        return result

    def take(self, n: int, now: float, lease: float, owner: str) -> list[Job]:
        # a lease lost with the machine leaves its job pending: nothing to fsync for
        result: list[Job] = self._run(self._take_op(n, now, lease, owner), durable=False)
        return result

    def _take_op(self, n: int, now: float, lease: float,
                 owner: str) -> Callable[[sqlite3.Connection], list[Job]]:
        token = f"{owner}:{next(self._tokens)}"

        def op(conn: sqlite3.Connection) -> list[Job]:
            rows = conn.execute(
                "UPDATE stormguard_jobs SET ready = ?, token = ?, lost = lost + "
                "(token IS NOT NULL) WHERE id IN (SELECT id FROM stormguard_jobs "
                "WHERE ready <= ? ORDER BY ready, id LIMIT ?) "
                "RETURNING id, task, payload, attempts, key, error, lost",
                (now + lease, token, now, n)).fetchall()
            rows.sort()
            return [Job(str(r[0]), r[1], r[2], r[3], r[4], token, r[5], r[6]) for r in rows]

        return op

    def _change(self, sql: str, params: tuple[Any, ...], *, durable: bool = True) -> bool:
        count: int = self._run(lambda conn: conn.execute(sql, params).rowcount,
                               durable=durable)
        return count > 0

    def ack(self, job: Job) -> bool:
        # an acknowledgement lost with the machine means one more delivery (at least once)
        return self._change("DELETE FROM stormguard_jobs WHERE id = ? AND token = ?",
                            (int(job.id), job.token), durable=self.durable_acks)

    def retry_later(self, job: Job, at: float, attempts: int, error: str) -> bool:
        return self._change(
            "UPDATE stormguard_jobs SET ready = ?, token = NULL, attempts = ?, error = ? "
            "WHERE id = ? AND token = ?", (at, attempts, error, int(job.id), job.token))

    def release(self, job: Job, now: float) -> bool:
        return self._change("UPDATE stormguard_jobs SET ready = ?, token = NULL "
                            "WHERE id = ? AND token = ?", (now, int(job.id), job.token),
                            durable=False)

    def bury(self, job: Job, attempts: int, error: str, now: float) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "INSERT INTO stormguard_dead (id, task, payload, key, attempts, error, "
                "created, died) SELECT id, task, payload, key, ?, ?, created, ? "
                "FROM stormguard_jobs WHERE id = ? AND token = ?",
                (attempts, error, now, int(job.id), job.token))
            if cur.rowcount == 0:
                return False
            conn.execute("DELETE FROM stormguard_jobs WHERE id = ?", (int(job.id),))
            return True

        done: bool = self._run(op)
        return done

    def extend(self, jobs: Sequence[Job], now: float, lease: float) -> None:
        if not jobs:
            return
        params = [(now + lease, int(j.id), j.token) for j in jobs]
        self._run(lambda conn: conn.executemany(
            "UPDATE stormguard_jobs SET ready = ? WHERE id = ? AND token = ?", params),
            durable=False)

    def stats(self, now: float) -> dict[str, int]:
        def op(conn: sqlite3.Connection) -> dict[str, int]:
            total, flying = conn.execute(
                "SELECT count(*), coalesce(sum(token IS NOT NULL AND ready > ?), 0) "
                "FROM stormguard_jobs", (now,)).fetchone()
            dead = conn.execute("SELECT count(*) FROM stormguard_dead").fetchone()[0]
            return {"pending": total - flying, "in_flight": flying, "dead": dead}

        result: dict[str, int] = self._run(op, durable=False)
        return result

    def next_due(self, now: float) -> float | None:
        due: float | None = self._run(lambda conn: conn.execute(
            "SELECT min(ready) FROM stormguard_jobs").fetchone()[0], durable=False)
        return due

    def dead(self, limit: int) -> list[DeadLetter]:
        rows = self._run(lambda conn: conn.execute(
            "SELECT id, task, payload, attempts, error, key, died FROM stormguard_dead "
            "ORDER BY id LIMIT ?", (limit,)).fetchall(), durable=False)
        return [DeadLetter(str(r[0]), r[1], decode_payload(r[2]), r[3], r[4], r[5], r[6])
                for r in rows]

    def retry_dead(self, now: float) -> int:
        def op(conn: sqlite3.Connection) -> int:
            n = conn.execute(
                "INSERT OR IGNORE INTO stormguard_jobs "
                "(id, task, payload, key, attempts, ready, created) "
                "SELECT id, task, payload, key, 0, ?, created FROM stormguard_dead ORDER BY id",
                (now,)).rowcount
            conn.execute("DELETE FROM stormguard_dead")
            return int(n)

        result: int = self._run(op)
        return result

    def close(self) -> None:
        self._group.close()
