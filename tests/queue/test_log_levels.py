"""LoggingListener gives each deferred-queue event a level that fits it: the queue doing
its work (a call deferred, a retry scheduled, a worker waiting) at INFO, a job given up
to the dead letters at ERROR; the events of the other policies keep their levels."""

from __future__ import annotations

import logging
import re

import pytest

from stormguard import CircuitBreaker, CircuitOpen, DeferredQueue, Pipeline
from stormguard.observability.events import RetryScheduled, StateChanged
from stormguard.queue import Backoff, JobDead, JobDeferred, JobRetryScheduled, WorkerPaused
from stormguard.resilience import LoggingListener
from stormguard.testing import FakeClock

LEVELS = {"JobDeferred": logging.INFO, "JobRetryScheduled": logging.INFO,
          "WorkerPaused": logging.INFO, "JobDead": logging.ERROR}


def _records(caplog: pytest.LogCaptureFixture) -> dict[str, set[int]]:
    """The levels each event kind was logged at, by the event's class name."""
    out: dict[str, set[int]] = {}
    for r in caplog.records:
        if r.name == "stormguard.test":
            kind = str(r.args[1]).split("(", 1)[0] if isinstance(r.args, tuple) else ""
            out.setdefault(kind, set()).add(r.levelno)
    return out


def test_a_job_deferred_retried_paused_and_dead_logs_at_its_own_level(
        caplog: pytest.LogCaptureFixture, clock: FakeClock) -> None:
    listener = LoggingListener(logging.getLogger("stormguard.test"))
    queue = DeferredQueue("memory://", clock=clock)

    def provider(order: int) -> None:
        raise CircuitOpen(remaining=30.0)

    calls: list[float] = []

    def send(order: int) -> None:
        calls.append(clock.monotonic())
        if len(calls) == 1:
            raise CircuitOpen(remaining=5.0)  # the worker waits 5 s, no attempt spent
        raise RuntimeError("provider down")

    with caplog.at_level(logging.DEBUG, logger="stormguard.test"):
        queue.fallback("send", listeners=(listener,)).call(provider, 7)
        worker = queue.worker({"send": send}, max_attempts=2, concurrency=1,
                              backoff=Backoff(jitter=0.0), listeners=(listener,))
        assert worker.drain(timeout=60)
    assert len(calls) == 3  # paused once, then two failed attempts
    assert queue.stats() == {"pending": 0, "in_flight": 0, "dead": 1}
    want = {kind: {level} for kind, level in LEVELS.items()}
    want["FallbackUsed"] = {logging.INFO}  # the fallback's own event, as any Fallback's
    assert _records(caplog) == want
    dead = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(dead) == 1
    assert "provider down" in dead[0].getMessage()  # the reason is in the line
    queue.close()


def test_each_queue_event_kind_declares_its_level() -> None:
    for cls in (JobDeferred, JobRetryScheduled, JobDead, WorkerPaused):
        assert cls.log_level == LEVELS[cls.__name__], cls


def test_the_other_events_keep_their_levels(caplog: pytest.LogCaptureFixture,
                                            clock: FakeClock) -> None:
    listener = LoggingListener(logging.getLogger("stormguard.test"))
    assert listener.level(RetryScheduled("r", 0.0, 1, 0.5, RuntimeError())) == logging.INFO
    assert listener.level(StateChanged("b", 0.0, "closed", "open")) == logging.WARNING
    breaker = CircuitBreaker(window=1, min_calls=1, name="sms", clock=clock,
                             listeners=(listener,))
    with caplog.at_level(logging.DEBUG, logger="stormguard.test"), \
            pytest.raises(ValueError):
        Pipeline(breaker).call(int, "not a number")
    assert _records(caplog) == {"StateChanged": {logging.WARNING}}


def test_the_documented_levels_are_the_levels() -> None:
    """docs/observability.md's table of event levels names every policy and queue event,
    each at the level LoggingListener logs it at."""
    from pathlib import Path

    from stormguard import queue as queue_events
    from stormguard.observability import events
    from stormguard.stores.hybrid import store as hybrid_events
    from stormguard.stores.regional import events as regional_events

    doc = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text(
        encoding="utf-8")
    section = doc.split("### Event levels", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| (DEBUG|INFO|WARNING|ERROR) \| (.+) \|$", section, flags=re.M)
    documented = {name: getattr(logging, level) for level, names in rows
                  for name in re.findall(r"`(\w+)`", names)}
    kinds = {name: cls for module in (events, queue_events, hybrid_events, regional_events)
             for name in module.__all__
             if isinstance(cls := getattr(module, name), type)
             and issubclass(cls, events.Event) and cls is not events.Event}
    assert set(documented) == set(kinds)
    for name, cls in kinds.items():
        assert LoggingListener.level(object.__new__(cls)) == documented[name], name
