"""The records of the queue: a job, a dead letter, the ``Deferred`` answer, the payload
codec (JSON, never pickle) and the retry backoff."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stormguard._core import validate
from stormguard._core.errors import ConfigError

__all__ = ["Backoff", "DeadLetter", "Deferred", "Job", "decode_payload", "encode_payload"]


@dataclass(frozen=True, slots=True)
class Deferred:
    """What a queue's fallback answers instead of the call's result: the work was not done
    now, it is in the queue under ``job_id`` and a worker will do it later."""

    job_id: str
    task: str = ""

    def __str__(self) -> str:
        return f"deferred {self.task or 'job'} {self.job_id}"


@dataclass(frozen=True, slots=True)
class Job:
    """One delivery of a job to a worker.

    ``attempts`` counts the failed attempts before this delivery; ``token`` is the lease
    this delivery holds (an answer from a worker whose lease was lost changes nothing);
    ``lost`` counts the deliveries whose lease ended unanswered (their worker crashed, was
    killed or hung past its visibility timeout).
    """

    id: str
    task: str
    payload: str
    attempts: int = 0
    key: str | None = None
    token: str = ""
    error: str | None = None
    lost: int = 0

    def arguments(self) -> dict[str, Any]:
        """The payload as the handler's keyword arguments."""
        return decode_payload(self.payload)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A job the worker gave up on: ``error`` is the text of its last error."""

    id: str
    task: str
    payload: dict[str, Any]
    attempts: int
    error: str
    key: str | None = None
    died_at: float = 0.0
    """Epoch seconds on the queue's clock."""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "task": self.task, "payload": self.payload,
                "attempts": self.attempts, "error": self.error, "key": self.key,
                "died_at": self.died_at}


def _dumps(value: object) -> str:
    return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def encode_payload(payload: object, what: str = "payload") -> str:
    """``payload`` (a dict of keyword arguments) as JSON text.

    Raises :class:`TypeError` naming the argument that JSON cannot hold (``what[name]``),
    so nothing half-written ever reaches a queue."""
    if not isinstance(payload, Mapping):
        raise TypeError(f"{what}: must be a dict of keyword arguments "
                        f"(got {type(payload).__name__})")
    for name in payload:
        if not isinstance(name, str) or not name.isidentifier():
            raise TypeError(f"{what}: every name must be a Python identifier, the handler "
                            f"is called as handler(**payload) (got {name!r})")
    try:
        return _dumps(dict(payload))
    except (TypeError, ValueError, RecursionError):
        pass
    for name, value in payload.items():
        try:
            _dumps(value)
        except (TypeError, ValueError, RecursionError) as exc:
            raise TypeError(f"{what}[{name!r}]: {type(value).__name__} value cannot be "
                            f"stored as JSON ({exc})") from None
    raise TypeError(f"{what}: cannot be stored as JSON")  # pragma: no cover


def decode_payload(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise TypeError(f"payload: not a JSON object ({text[:60]!r})")
    return value


@dataclass(frozen=True, slots=True)
class Backoff:
    """The delay before retry ``n`` (1-based, after ``n`` failed attempts):
    ``min(max_delay, base * multiplier ** (n - 1))``, then with ``jitter`` a uniform
    factor in ``[1 - jitter, 1]`` (``jitter=0``: exact). Defaults: the first retry within
    0.5-1 s, then 1-2 s, 2-4 s, ... capped at 30-60 s."""

    base: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 60.0
    jitter: float = 0.5
    _random: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate.duration("backoff.base", self.base, allow_zero=True)
        validate.number("backoff.multiplier", self.multiplier, minimum=1.0, allow_zero=True)
        validate.duration("backoff.max_delay", self.max_delay, allow_zero=True)
        validate.number("backoff.jitter", self.jitter, allow_zero=True, maximum=1.0)
        if self.max_delay < self.base:
            raise ConfigError("backoff.max_delay", self.max_delay, "must be >= base")

    def __call__(self, failures: int) -> float:
        try:
            nominal = self.base * self.multiplier ** max(failures - 1, 0)
        except OverflowError:
            nominal = math.inf
        delay = min(self.max_delay, nominal)
        if self.jitter:
            delay *= 1.0 - self.jitter * self._random.random()
        return delay
