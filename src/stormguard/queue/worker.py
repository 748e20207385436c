"""The worker: takes jobs from a :class:`~stormguard.DeferredQueue` and runs their handlers
through a pipeline, at least once.

* A job leaves the queue only after its handler returned (the dispatcher acknowledges
  the jobs done since its last round together with its next take: one round trip, one
  transaction); a job whose worker died is taken again when its lease
  (``visibility_timeout``) ends. A worker renews the leases
  of the jobs it is still working on every half ``visibility_timeout``.
* A failed attempt is retried after ``backoff(failures)`` seconds (a
  :class:`~stormguard.TransientError`'s ``retry_after`` when longer); after
  ``max_attempts`` failed attempts the job goes to the dead letters with its last error.
  A job whose task has no handler goes there at once; so does a job whose lease ended
  unanswered ``max_attempts`` times (a job that crashes or hangs its worker).
* ``CircuitOpen`` and ``ShaperFull`` (any StormguardError with a numeric ``retry_after``)
  from the pipeline are not failed attempts: the job is pending again at once, its
  attempts unchanged, and the worker takes no work until the breaker's ``remaining``
  open time (or the ``retry_after``) has passed.

``run()`` (threads) and ``await arun()`` (tasks) work until :meth:`Worker.stop`; the
jobs in flight then finish. ``drain(timeout=...)`` / ``await adrain(...)`` work until
the queue holds no pending and no in-flight job (True) or the timeout passes (False),
handing back the jobs still held: they are pending again at once (a handler still
running then may finish later; its job runs again, at least once).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import inspect
import itertools
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from stormguard._core import validate
from stormguard._core.clock import Clock
from stormguard._core.errors import CircuitOpen, ConfigError, StorageError, StormguardError
from stormguard.observability.events import Event, Listener, emit, observed
from stormguard.queue.events import JobDead, JobRetryScheduled, WorkerPaused
from stormguard.queue.job import Backoff, Job

if TYPE_CHECKING:
    from stormguard.queue.core import DeferredQueue
    from stormguard.resilience._base import Policy

__all__ = ["Lease", "Worker", "pause_for"]

_log = logging.getLogger("stormguard.queue")
_owners = itertools.count(1)


def pause_for(exc: BaseException, minimum: float) -> float | None:
    """How long a worker pauses after ``exc`` (None: ``exc`` is a failed attempt)."""
    if isinstance(exc, CircuitOpen):
        return max(float(exc.remaining), minimum)
    if isinstance(exc, StormguardError):
        after = getattr(exc, "retry_after", None)
        if isinstance(after, int | float) and not isinstance(after, bool):
            return max(float(after), minimum)
    return None


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Lease:
    """A job a dispatcher holds, leased at ``leased_at`` (the worker's monotonic clock):
    :meth:`Worker.renew` extends its lease every half ``visibility_timeout``."""

    __slots__ = ("job", "leased_at")

    def __init__(self, job: Job, leased_at: float) -> None:
        self.job = job
        self.leased_at = leased_at


class Worker:
    """Drains a queue: ``handlers`` maps task names to functions called with the payload
    as keyword arguments, through ``pipeline`` when given."""

    def __init__(self, queue: DeferredQueue, handlers: Mapping[str, Callable[..., Any]], *,
                 pipeline: Policy | None = None, concurrency: int = 8, max_attempts: int = 10,
                 visibility_timeout: float = 30.0,
                 backoff: Callable[[int], float] | None = None, poll_interval: float = 0.1,
                 name: str = "worker", clock: Clock | None = None,
                 listeners: tuple[Listener, ...] | list[Listener] = ()) -> None:
        from stormguard.resilience._base import Policy

        if not isinstance(handlers, Mapping):
            raise ConfigError("handlers", handlers, "must map task names to functions")
        for task, fn in handlers.items():
            if not isinstance(task, str) or not task:
                raise ConfigError("handlers", task, "task names must be non-empty strings")
            if not callable(fn):
                raise ConfigError(f"handlers[{task!r}]", fn, "must be callable")
        if pipeline is not None and not isinstance(pipeline, Policy):
            raise ConfigError("pipeline", pipeline, "must be a stormguard policy or Pipeline")
        from stormguard.queue.fallback import DeferFallback

        layers = getattr(pipeline, "policies", (pipeline,))
        if any(isinstance(p, DeferFallback) for p in layers):
            raise ConfigError("pipeline", pipeline, "must not hold a queue's fallback: a "
                              "job that fails would be deferred again instead of retried")
        if backoff is not None and not callable(backoff):
            raise ConfigError("backoff", backoff, "must be a function of the number of "
                              "failed attempts giving seconds (e.g. stormguard.queue.Backoff)")
        self.queue = queue
        self.handlers = dict(handlers)
        self.pipeline = pipeline
        self.concurrency = validate.integer("concurrency", concurrency, maximum=10_000)
        self.max_attempts = validate.integer("max_attempts", max_attempts)
        self.visibility_timeout = validate.duration("visibility_timeout", visibility_timeout)
        self.poll_interval = validate.duration("poll_interval", poll_interval)
        self.backoff: Callable[[int], float] = Backoff() if backoff is None else backoff
        self.name = validate.text("name", name)
        self.clock: Clock = queue.clock if clock is None else clock
        self.listeners: list[Listener] = list(listeners)
        self.owner = (f"{socket.gethostname()}-{os.getpid()}-{next(_owners)}-"
                      f"{uuid.uuid4().hex[:8]}")
        self._stop = threading.Event()
        self._done: collections.deque[Job] = collections.deque()
        self._pause_lock = threading.Lock()
        self._paused_until = float("-inf")
        self.completed = 0
        """Jobs whose handler succeeded (and that were acknowledged)."""
        self.failures = 0
        """Failed attempts (retried later or sent to the dead letters)."""

    def __repr__(self) -> str:
        return f"Worker({self.name!r}, {self.queue!r}, concurrency={self.concurrency})"

    def add_listener(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def _emit(self, event: Event) -> None:
        emit(self.listeners, event)

    # -- decisions (no blocking, no awaiting but the backend's own calls) ----------------
    def _handler(self, job: Job) -> tuple[Callable[..., Any], dict[str, Any]] | None:
        """The handler and its arguments; None when the job went to the dead letters."""
        if job.lost >= self.max_attempts:
            self._bury(job, job.attempts, f"lost {job.lost} times: its worker crashed, was "
                       "killed or hung past visibility_timeout while running it")
            return None
        handler = self.handlers.get(job.task)
        if handler is None:
            self._bury(job, job.attempts, f"unknown task {job.task!r}: the worker has no "
                       "handler for it")
            return None
        try:
            return handler, job.arguments()
        except (ValueError, TypeError) as exc:
            self._bury(job, job.attempts, f"unreadable payload: {exc}")
            return None

    def _bury(self, job: Job, attempts: int, error: str) -> None:
        self.queue.backend.bury(job, attempts, error, self.clock.wall())
        if observed(self.listeners):
            self._emit(JobDead(self.name, self.clock.monotonic(), job.task, job.id, attempts,
                               error))

    def _settle(self, job: Job, exc: BaseException | None) -> None:
        """Record the outcome of one attempt (never raises)."""
        try:
            self._outcome(job, exc)
        except StorageError as err:
            _log.warning("stormguard worker %s: job %s: the queue failed (%s); the job is "
                         "taken again when its lease ends", self.name, job.id, err)
        except Exception:
            _log.exception("stormguard worker %s: job %s: recording its outcome failed",
                           self.name, job.id)

    def _outcome(self, job: Job, exc: BaseException | None) -> None:
        backend = self.queue.backend
        if exc is None:
            self._done.append(job)  # acknowledged by the dispatcher's next round
            return
        pause = pause_for(exc, self.poll_interval)
        if pause is not None:
            # pause first: a job given back before the pause is in force could be taken
            # at once by a dispatcher round for another slot, inside the breaker's wait
            self._pause(pause)
            backend.release(job, self.clock.wall())
            if observed(self.listeners):
                self._emit(WorkerPaused(self.name, self.clock.monotonic(), job.task, job.id,
                                        pause, type(exc).__name__))
            return
        with self._pause_lock:
            self.failures += 1
        failures = job.attempts + 1
        error = describe(exc)
        if failures >= self.max_attempts:
            self._bury(job, failures, error)
            return
        delay = float(self.backoff(failures))
        after = getattr(exc, "retry_after", None)
        if isinstance(after, int | float) and not isinstance(after, bool) and after > delay:
            delay = float(after)
        backend.retry_later(job, self.clock.wall() + delay, failures, error)
        if observed(self.listeners):
            self._emit(JobRetryScheduled(self.name, self.clock.monotonic(), job.task, job.id,
                                         failures, delay, error))

    def _pause(self, seconds: float) -> None:
        until = self.clock.monotonic() + seconds
        with self._pause_lock:
            self._paused_until = max(self._paused_until, until)

    def _round(self, n: int) -> list[Job]:
        """Acknowledge the jobs done since the last round and take up to ``n`` more, in
        one call to the backend (one round trip, one transaction)."""
        done: list[Job] = []
        while True:
            try:
                done.append(self._done.popleft())
            except IndexError:
                break
        if not done and n <= 0:
            return []
        try:
            acked, jobs = self.queue.backend.finish(done, n, self.clock.wall(),
                                                    self.visibility_timeout, self.owner)
        except StorageError as err:
            self._done.extendleft(reversed(done))  # acknowledged in a later round
            _log.warning("stormguard worker %s: the queue failed (%s); trying again in "
                         "%.3g s", self.name, err, self.poll_interval)
            self._pause(self.poll_interval)
            return []
        if done:
            with self._pause_lock:
                self.completed += sum(acked)
        return jobs

    def _taken(self, jobs: list[Job]) -> list[Job]:
        """The jobs a round took, unless a handler paused the worker meanwhile (a breaker
        opened on another slot while the round was on its way): those are given back
        untouched and taken again when the pause ends."""
        if not jobs or self._paused_until <= self.clock.monotonic():
            return jobs
        for job in jobs:
            try:
                self.queue.backend.release(job, self.clock.wall())
            except StorageError as err:
                _log.warning("stormguard worker %s: job %s: the queue failed (%s); the job "
                             "is taken again when its lease ends", self.name, job.id, err)
        return []

    def _renew(self, held: Iterable[Lease], now: float) -> None:
        due = [h for h in held if now - h.leased_at >= self.visibility_timeout / 2]
        if not due:
            return
        try:
            self.queue.backend.extend([h.job for h in due], self.clock.wall(),
                                      self.visibility_timeout)
        except StorageError as err:
            _log.warning("stormguard worker %s: renewing leases failed (%s)", self.name, err)
            return
        for h in due:
            h.leased_at = now

    def _release(self, jobs: Iterable[Job]) -> None:
        now = self.clock.wall()
        for job in jobs:
            try:
                self.queue.backend.release(job, now)
            except StorageError as err:
                _log.warning("stormguard worker %s: job %s: handing back failed (%s); it is "
                             "taken again when its lease ends", self.name, job.id, err)

    def _idle_delay(self, end: float | None, drain: bool) -> float | None:
        """How long to wait for work when none could be taken; None: drained."""
        try:
            due = self.queue.backend.next_due(self.clock.wall())
        except StorageError:
            due = self.clock.wall() + self.poll_interval
        if due is None and drain:
            return None
        wall = self.clock.wall()
        delay = self.poll_interval if due is None or due <= wall else min(
            self.poll_interval, due - wall)
        if end is not None:
            delay = min(delay, max(end - self.clock.monotonic(), 0.0))
        return delay

    # -- one dispatcher step at a time, for a driver of its own (the simulator drives a
    # real worker in virtual time with these; run / drain are loops over the same steps)
    def take(self, n: int) -> list[Job]:
        """Acknowledge the jobs done since the last call and take up to ``n`` more, in one
        call to the backend (``take(0)`` only acknowledges); a queue failure takes none and
        pauses the worker ``poll_interval``."""
        return self._round(n)

    def paused_for(self, now: float | None = None) -> float:
        """Seconds the worker still takes no work (an open breaker's remaining time, a
        shaper's ``retry_after``, a queue failure); zero or less: not paused. ``now``: the
        clock's monotonic time (read when omitted)."""
        return self._paused_until - (self.clock.monotonic() if now is None else now)

    def renew(self, leases: Iterable[Lease], now: float) -> None:
        """Extend the leases held for half ``visibility_timeout`` or more (one backend
        call); ``now``: the clock's monotonic time."""
        self._renew(leases, now)

    def process(self, job: Job) -> None:
        """Run a taken job's handler (through the pipeline) in this thread and record the
        outcome: acknowledged with the next :meth:`take`, retried later with backoff,
        dead-lettered, or a pause (the job pending again). A handler's error never
        propagates."""
        self._process(job)

    def idle_delay(self) -> float:
        """How long to wait for work when a :meth:`take` found none: ``poll_interval``,
        or less when a retry falls due sooner."""
        delay = self._idle_delay(None, drain=False)
        assert delay is not None  # only a drain is ever over
        return delay

    def stop(self) -> None:
        """Ask :meth:`run` / :meth:`arun` to return (the jobs in flight finish first)."""
        self._stop.set()

    # -- threads --------------------------------------------------------------------------
    def _process(self, job: Job) -> None:
        found = self._handler(job)
        if found is None:
            return
        handler, kwargs = found
        try:
            if self.pipeline is not None:
                result = self.pipeline.call(handler, **kwargs)
            else:
                result = handler(**kwargs)
            if inspect.isawaitable(result):  # never run: not done, so not acknowledged
                if inspect.iscoroutine(result):
                    result.close()
                raise TypeError(f"the handler of {job.task!r} returned an awaitable: "
                                "async handlers run with arun() / adrain()")
        except Exception as exc:
            self._settle(job, exc)
        else:
            self._settle(job, None)

    def _safe_process(self, job: Job) -> None:
        try:
            self._process(job)
        except Exception:
            _log.exception("stormguard worker %s: job %s", self.name, job.id)

    def run(self) -> None:
        """Work (``concurrency`` threads) until :meth:`stop`."""
        self._loop(drain=False, timeout=None)

    def drain(self, timeout: float | None = None) -> bool:
        """Work until the queue is empty (True) or ``timeout`` seconds passed (False)."""
        if timeout is not None:
            timeout = validate.duration("timeout", timeout, allow_zero=True)
        return self._loop(drain=True, timeout=timeout)

    def _loop(self, *, drain: bool, timeout: float | None) -> bool:
        for task, fn in self.handlers.items():
            if inspect.iscoroutinefunction(fn):
                raise ConfigError(f"handlers[{task!r}]", fn, "is async: run it with "
                                  "await worker.arun() or await worker.adrain()")
        clock = self.clock
        end = None if timeout is None else clock.monotonic() + timeout
        pool = concurrent.futures.ThreadPoolExecutor(
            self.concurrency, thread_name_prefix=f"stormguard-{self.name}")
        running: dict[concurrent.futures.Future[None], Lease] = {}
        drained = abandoned = False
        try:
            while True:
                for fut in [f for f in running if f.done()]:
                    del running[fut]
                if self._stop.is_set():
                    break
                now = clock.monotonic()
                if end is not None and now >= end:
                    abandoned = True
                    break
                self._renew(running.values(), now)
                wait = self._paused_until - now
                if wait > 0:
                    self._round(0)
                    clock.sleep(min(wait, self.poll_interval) if end is None
                                else min(wait, self.poll_interval, end - now))
                    continue
                jobs = self._taken(self._round(self.concurrency - len(running)))
                for job in jobs:
                    running[pool.submit(self._safe_process, job)] = Lease(job, now)
                if jobs:
                    continue
                if running:
                    concurrent.futures.wait(running, timeout=self.poll_interval,
                                            return_when=concurrent.futures.FIRST_COMPLETED)
                    continue
                delay = self._idle_delay(end, drain)
                if delay is None:
                    drained = True
                    break
                clock.sleep(delay)
        finally:
            if abandoned or not (drained or self._stop.is_set()):
                left = [h.job for f, h in running.items() if not f.done()]
                pool.shutdown(wait=False, cancel_futures=True)
                self._release(left)
            else:
                pool.shutdown(wait=True)
            self._round(0)  # the last acknowledgements
            self._stop.clear()
        return drained

    # -- asyncio --------------------------------------------------------------------------
    async def _aprocess(self, job: Job) -> None:
        found = self._handler(job)
        if found is None:
            return
        handler, kwargs = found
        fn: Callable[..., Any] = handler
        if not inspect.iscoroutinefunction(handler):
            async def fn(**kw: Any) -> Any:
                result = handler(**kw)
                if inspect.isawaitable(result):  # a partial of an async function, ...
                    result = await result
                return result
        try:
            if self.pipeline is not None:
                await self.pipeline.acall(fn, **kwargs)
            else:
                await fn(**kwargs)
        except Exception as exc:
            self._settle(job, exc)
        else:
            self._settle(job, None)

    async def _asafe_process(self, job: Job) -> None:
        try:
            await self._aprocess(job)
        except Exception:
            _log.exception("stormguard worker %s: job %s", self.name, job.id)

    async def arun(self) -> None:
        """Work (``concurrency`` tasks on the running loop) until :meth:`stop`."""
        await self._aloop(drain=False, budget=None)

    async def adrain(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 (drain's)
        """:meth:`drain` on the running loop."""
        if timeout is not None:
            timeout = validate.duration("timeout", timeout, allow_zero=True)
        return await self._aloop(drain=True, budget=timeout)

    async def _aloop(self, *, drain: bool, budget: float | None) -> bool:
        clock = self.clock
        end = None if budget is None else clock.monotonic() + budget
        running: dict[asyncio.Task[None], Lease] = {}
        drained = False
        finished = False
        try:
            while True:
                for task in [t for t in running if t.done()]:
                    del running[task]
                if self._stop.is_set():
                    finished = True
                    break
                now = clock.monotonic()
                if end is not None and now >= end:
                    break
                self._renew(running.values(), now)
                wait = self._paused_until - now
                if wait > 0:
                    self._round(0)
                    await clock.asleep(min(wait, self.poll_interval) if end is None
                                       else min(wait, self.poll_interval, end - now))
                    continue
                jobs = self._taken(self._round(self.concurrency - len(running)))
                for job in jobs:
                    running[asyncio.ensure_future(self._asafe_process(job))] = Lease(job, now)
                if jobs:
                    await asyncio.sleep(0)
                    continue
                if running:
                    limit = self.poll_interval if end is None else min(
                        self.poll_interval, max(end - now, 0.0))
                    await asyncio.wait(running, timeout=limit,
                                       return_when=asyncio.FIRST_COMPLETED)
                    continue
                delay = self._idle_delay(end, drain)
                if delay is None:
                    drained = finished = True
                    break
                await clock.asleep(delay)
        finally:
            if finished and running:
                await asyncio.gather(*running, return_exceptions=True)
            else:
                left = [h.job for t, h in running.items() if not t.done()]
                for task in running:
                    task.cancel()
                if running:
                    await asyncio.gather(*running, return_exceptions=True)
                self._release(left)
            self._round(0)  # the last acknowledgements
            self._stop.clear()
        return drained
