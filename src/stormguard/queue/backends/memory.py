"""``memory://``: the queue in a dict, for tests and examples. Not durable: every job is
lost with the process."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from stormguard.queue.backends.base import Backend
from stormguard.queue.job import DeadLetter, Job, decode_payload, encode_payload

__all__ = ["MemoryBackend"]


@dataclass(slots=True)
class _Entry:
    id: int
    task: str
    payload: str
    key: str | None
    attempts: int = 0
    ready: float = 0.0  # may be taken from then on (a lease ends then too)
    token: str | None = None  # the lease, while in flight
    error: str | None = None
    lost: int = 0  # leases that ended unanswered


class MemoryBackend(Backend):
    """Jobs in a dict, due times in a heap (stale heap entries are skipped)."""

    durable = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[int, _Entry] = {}
        self._keys: dict[str, int] = {}
        self._dead: dict[int, DeadLetter] = {}
        self._heap: list[tuple[float, int]] = []
        self._ids = itertools.count(1)
        self._tokens = itertools.count(1)

    def __repr__(self) -> str:
        return "MemoryBackend(not durable)"

    def _schedule(self, entry: _Entry) -> None:
        heapq.heappush(self._heap, (entry.ready, entry.id))

    def put(self, task: str, payload: str, key: str | None, now: float) -> str:
        with self._lock:
            if key is not None:
                held = self._keys.get(key)
                if held is not None:
                    return str(held)
            entry = _Entry(next(self._ids), task, payload, key, ready=now)
            self._jobs[entry.id] = entry
            if key is not None:
                self._keys[key] = entry.id
            self._schedule(entry)
            return str(entry.id)

    def take(self, n: int, now: float, lease: float, owner: str) -> list[Job]:
        out: list[Job] = []
        with self._lock:
            heap = self._heap
            while heap and len(out) < n and heap[0][0] <= now:
                ready, jid = heapq.heappop(heap)
                entry = self._jobs.get(jid)
                if entry is None or entry.ready != ready:
                    continue  # stale: done, or rescheduled
                if entry.token is not None:
                    entry.lost += 1  # its lease ended unanswered
                entry.token = f"{owner}:{next(self._tokens)}"
                entry.ready = now + lease
                self._schedule(entry)  # taken again when the lease ends
                out.append(Job(str(jid), entry.task, entry.payload, entry.attempts,
                               entry.key, entry.token, entry.error, entry.lost))
        out.sort(key=lambda j: int(j.id))  # as SQLite: one batch in id order
        return out

    def _held(self, job: Job) -> _Entry | None:
        entry = self._jobs.get(int(job.id))
        return entry if entry is not None and entry.token == job.token else None

    def _remove(self, entry: _Entry) -> None:
        del self._jobs[entry.id]
        if entry.key is not None and self._keys.get(entry.key) == entry.id:
            del self._keys[entry.key]

    def ack(self, job: Job) -> bool:
        with self._lock:
            entry = self._held(job)
            if entry is None:
                return False
            self._remove(entry)
            return True

    def retry_later(self, job: Job, at: float, attempts: int, error: str) -> bool:
        with self._lock:
            entry = self._held(job)
            if entry is None:
                return False
            entry.token, entry.ready, entry.attempts, entry.error = None, at, attempts, error
            self._schedule(entry)
            return True

    def release(self, job: Job, now: float) -> bool:
        with self._lock:
            entry = self._held(job)
            if entry is None:
                return False
            entry.token, entry.ready = None, now
            self._schedule(entry)
            return True

    def bury(self, job: Job, attempts: int, error: str, now: float) -> bool:
        with self._lock:
            entry = self._held(job)
            if entry is None:
                return False
            self._remove(entry)
            self._dead[entry.id] = DeadLetter(str(entry.id), entry.task,
                                              decode_payload(entry.payload), attempts, error,
                                              entry.key, now)
            return True

    def extend(self, jobs: Sequence[Job], now: float, lease: float) -> None:
        with self._lock:
            for job in jobs:
                entry = self._held(job)
                if entry is not None:
                    entry.ready = now + lease
                    self._schedule(entry)

    def stats(self, now: float) -> dict[str, int]:
        with self._lock:
            flying = sum(1 for e in self._jobs.values() if e.token is not None and e.ready > now)
            return {"pending": len(self._jobs) - flying, "in_flight": flying,
                    "dead": len(self._dead)}

    def next_due(self, now: float) -> float | None:
        with self._lock:
            heap = self._heap
            while heap:
                ready, jid = heap[0]
                entry = self._jobs.get(jid)
                if entry is not None and entry.ready == ready:
                    return ready
                heapq.heappop(heap)
            return None

    def dead(self, limit: int) -> list[DeadLetter]:
        with self._lock:
            return [self._dead[i] for i in sorted(self._dead)[:limit]]

    def retry_dead(self, now: float) -> int:
        with self._lock:
            n = 0
            for jid in sorted(self._dead):
                d = self._dead.pop(jid)
                if d.key is not None and d.key in self._keys:
                    continue
                entry = _Entry(jid, d.task, encode_payload(d.payload), d.key, ready=now)
                self._jobs[jid] = entry
                if d.key is not None:
                    self._keys[d.key] = jid
                self._schedule(entry)
                n += 1
            return n
