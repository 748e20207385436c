"""Start-up warnings about deployments that silently weaken the limits: a per-process
memory store under a multi-worker server, and a server that rewrote the client address
from ``X-Forwarded-For`` before the middleware saw it."""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Sequence

__all__ = ["memory_store_workers_warning", "warn_memory_store_workers", "worker_count"]

log = logging.getLogger("stormguard.middleware")


def _workers_flag(argv: Sequence[str]) -> int | None:
    for i, arg in enumerate(argv):
        value: str | None = None
        if arg in ("-w", "--workers") and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--workers="):
            value = arg.partition("=")[2]
        elif arg.startswith("-w") and len(arg) > 2:
            value = arg[2:]
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def worker_count(environ: dict[str, str] | None = None,
                 argv: Sequence[str] | None = None) -> int | None:
    """How many worker processes the server runs, when it can be told: ``-w N`` /
    ``--workers N`` on a gunicorn or uvicorn command line, ``GUNICORN_CMD_ARGS``, or
    ``WEB_CONCURRENCY`` (read by gunicorn, uvicorn and most platforms); else None."""
    env = os.environ if environ is None else environ
    argv = sys.argv if argv is None else argv
    program = os.path.basename(argv[0]) if argv else ""
    if any(server in program for server in ("gunicorn", "uvicorn")) or (
            len(argv) > 2 and argv[1:3] == ["-m", "uvicorn"]):
        n = _workers_flag(argv[1:])
        if n is not None:
            return n
    n = _workers_flag(shlex.split(env.get("GUNICORN_CMD_ARGS", "")))
    if n is not None:
        return n
    value = env.get("WEB_CONCURRENCY", "").strip()
    return int(value) if value.isdigit() else None


def memory_store_workers_warning(workers: int | None) -> str | None:
    """The warning for a memory store under ``workers`` processes (0: several, how many
    unknown); None for one worker or an unknown deployment."""
    if workers is None or workers == 1:
        return None
    n = f"{workers}" if workers > 1 else "N"
    return (f"stormguard: the memory store under {'several' if workers < 1 else workers} "
            f"worker processes: each worker counts on its own, so every limit admits up to "
            f"{n}x its requests; use a shared store (redis://...) or run one worker")


def warn_memory_store_workers(store: object, workers: int | None = None) -> bool:
    """Log a warning when ``store`` is the per-process memory store and the server runs
    several workers (``workers``, 0 for several, else :func:`worker_count`); True if it
    warned."""
    from stormguard.stores.memory import MemoryStore

    if not isinstance(store, MemoryStore):
        return False
    message = memory_store_workers_warning(worker_count() if workers is None else workers)
    if message is None:
        return False
    log.warning("%s", message)
    return True
