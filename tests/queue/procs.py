"""Child processes of the durability tests (run as a script: ``python procs.py ...``).

``worker URL STREAM LOG CONCURRENCY VT [async]``: writes ``ready`` to LOG, then drains the queue
forever; the handler appends
``start <i>`` and, just before returning, ``done <i>`` to LOG (one ``os.write`` each on an
``O_APPEND`` file: whole lines, and in the page cache once written, so a SIGKILL of this
process loses none).

``producer URL STREAM LOG THREADS``: THREADS threads defer ``{"i": n}`` jobs (key
``j:<n>``) forever, and append ``<n>`` to LOG after each ``defer`` returned.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import threading
import time


def _open(url: str, stream: str):  # type: ignore[no-untyped-def]
    from stormguard.queue import DeferredQueue

    if url.startswith("redis"):
        return DeferredQueue(url, stream=stream)
    return DeferredQueue(url)


def worker(url: str, stream: str, log: str, concurrency: int, vt: float,
           mode: str = "sync") -> None:
    q = _open(url, stream)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def handle(i: int) -> None:
        os.write(fd, f"start {i}\n".encode())
        time.sleep(0.004)  # real time: a real provider call, so the kill lands mid-drain
        os.write(fd, f"done {i}\n".encode())

    async def ahandle(i: int) -> None:
        os.write(fd, f"start {i}\n".encode())
        await asyncio.sleep(0.004)  # real time, as above
        os.write(fd, f"done {i}\n".encode())

    worker = q.worker({"job": ahandle if mode == "async" else handle},
                      concurrency=concurrency, visibility_timeout=vt, poll_interval=0.02)
    os.write(fd, b"ready\n")
    if mode == "async":
        asyncio.run(worker.arun())
    else:
        worker.run()


def producer(url: str, stream: str, log: str, threads: int) -> None:
    q = _open(url, stream)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    numbers = itertools.count()
    lock = threading.Lock()

    def loop() -> None:
        while True:
            with lock:
                n = next(numbers)
            q.defer("job", {"i": n}, key=f"j:{n}")
            os.write(fd, f"{n}\n".encode())

    for _ in range(threads):
        threading.Thread(target=loop, daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    role, *rest = sys.argv[1:]
    if role == "worker":
        worker(rest[0], rest[1], rest[2], int(rest[3]), float(rest[4]), *rest[5:])
    else:
        producer(rest[0], rest[1], rest[2], int(rest[3]))
