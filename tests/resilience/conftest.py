"""Run every scenario through ``call`` (blocking) and ``acall`` (asyncio) alike."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from stormguard.resilience import Policy


class Mode:
    """How a scenario calls a policy: ``policy.call(fn)`` or ``await policy.acall(afn)``."""

    def __init__(self, is_async: bool) -> None:
        self.is_async = is_async

    def __repr__(self) -> str:
        return "async" if self.is_async else "sync"

    async def call(self, policy: Policy, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.is_async:
            async def afn(*a: Any, **kw: Any) -> Any:
                return fn(*a, **kw)

            return await policy.acall(afn, *args, **kwargs)
        return policy.call(fn, *args, **kwargs)

    async def outcome(self, policy: Policy, fn: Callable[..., Any]) -> Any:
        """The result, or the exception instance raised."""
        try:
            return await self.call(policy, fn)
        except Exception as exc:
            return exc


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> Mode:
    return Mode(request.param)


class Boom(Exception):
    """A plain failure."""


def failing(exc: BaseException | None = None) -> Callable[[], Any]:
    def fn() -> Any:
        raise exc if exc is not None else Boom("boom")

    return fn


def ok(value: Any = "ok") -> Callable[[], Any]:
    return lambda: value


def run_threads(target: Callable[[], Any], n: int) -> None:
    """Run ``target`` in ``n`` real threads at once and wait for all of them."""
    threads = [threading.Thread(target=target) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def eventually(predicate: Callable[[], bool], limit: float = 30.0) -> None:
    """Wait until another thread makes ``predicate()`` true (yielding the CPU, not
    sleeping; ``limit`` real seconds is only a safety net against a hang)."""
    give_up = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < give_up, "the other thread never got there"
        os.sched_yield()
