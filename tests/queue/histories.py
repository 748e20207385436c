"""Replay a history of queue operations on a backend (the differential tests)."""

from __future__ import annotations

from typing import Any

from stormguard import DeferredQueue
from stormguard.testing import FakeClock

__all__ = ["replay"]


def replay(url: str, ops: list[tuple[str, Any]], lease: float = 10.0,
           **options: Any) -> list[Any]:
    clock = FakeClock()
    q = DeferredQueue(url, clock=clock, **options)
    b = q.backend
    held: list[Any] = []
    names: dict[str, int] = {}  # job id -> the order it was first seen (ids differ)
    out: list[Any] = []
    n = 0

    def name(job_id: str) -> int:
        return names.setdefault(job_id, len(names))

    for op, arg in ops:
        now = clock.wall()
        if op == "defer":
            n += 1
            out.append(("defer", name(q.defer("t", {"n": n}, key=arg))))
        elif op == "take":
            jobs = b.take(arg, now, lease, "w")
            held.extend(jobs)
            out.append(("take", [(name(j.id), j.attempts, j.lost, j.arguments())
                                 for j in jobs]))
        elif op == "advance":
            clock.advance(arg)
        elif op == "retry_dead":
            out.append(("retry_dead", q.retry_dead()))
        elif held:
            job = held.pop(arg % len(held))
            if op == "ack":
                ok = b.ack(job)
            elif op == "fail":
                ok = b.retry_later(job, now + 2.0, job.attempts + 1, "boom")
            elif op == "release":
                ok = b.release(job, now)
            else:
                ok = b.bury(job, job.attempts + 1, "dead", now)
            out.append((op, ok))
        out.append(q.stats())
    out.append([(name(d.id), d.attempts, d.error, d.payload) for d in q.dead()])
    q.close()
    return out
