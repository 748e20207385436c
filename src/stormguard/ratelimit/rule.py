"""`Rule`: how many, per how long, with which algorithm."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from stormguard._core import validate
from stormguard._core.errors import ConfigError
from stormguard.ratelimit.algorithms import ALGORITHMS, Algorithm

__all__ = ["DEFAULT_ALGORITHM", "Rule"]

DEFAULT_ALGORITHM = "sliding_window_counter"
_BUCKET_DEFAULT = "token_bucket"

_PARSE = re.compile(
    r"""^\s*(?P<limit>\d+)\s*(?:/|\bper\b)\s*
        (?P<count>\d+(?:\.\d+)?)?\s*(?P<unit>[a-z]+)\s*
        (?:\bburst\s*(?P<burst>\d+))?\s*$""",
    re.IGNORECASE | re.VERBOSE,
)

_MAX_WINDOW = 366 * 86400.0
_SEPARATORS = re.compile(r"[;,|]")


@dataclass(frozen=True, slots=True)
class Rule:
    """A rate limit: ``limit`` units of cost per ``window`` seconds.

    ``algorithm`` is one of ``fixed_window``, ``sliding_window_log``,
    ``sliding_window_counter`` (the default), ``token_bucket``, ``gcra``,
    ``leaky_bucket``. ``burst`` is the bucket capacity of the three bucket
    algorithms (default ``limit``); giving a burst without an algorithm selects
    ``token_bucket``. ``name`` labels the rule in headers and metrics and keeps
    the counters of two otherwise equal rules apart.

    Rules are immutable values: two equal rules share counters in a store.
    """

    limit: int
    window: float
    algorithm: str | None = None
    burst: int | None = None
    name: str | None = None
    _algo: Algorithm = field(init=False, repr=False, compare=False, hash=False)
    _id: str = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        limit = validate.integer("limit", self.limit)
        window = validate.number("window", self.window, minimum=0.001, allow_zero=True,
                                 maximum=_MAX_WINDOW)
        algorithm = self.algorithm
        if algorithm is None:
            algorithm = _BUCKET_DEFAULT if self.burst is not None else DEFAULT_ALGORITHM
            object.__setattr__(self, "algorithm", algorithm)
        cls = ALGORITHMS.get(algorithm) if isinstance(algorithm, str) else None
        if cls is None:
            raise ConfigError(
                "algorithm", algorithm, f"unknown algorithm; expected one of {sorted(ALGORITHMS)}"
            )
        burst = self.burst
        if burst is not None:
            validate.integer("burst", burst)
            if not cls.uses_burst:
                raise ConfigError(
                    "burst", burst,
                    f"{algorithm} has no burst; use token_bucket, gcra or leaky_bucket",
                )
        if self.name is not None:
            validate.text("name", self.name)
        window_us = round(window * 1_000_000)
        algo = cls(limit, window_us, burst if burst is not None else limit)
        object.__setattr__(self, "_algo", algo)
        rid = f"{algorithm}:{limit}:{window_us}:{algo.B}"
        if self.name:
            rid = f"{rid}:{self.name}"
        object.__setattr__(self, "_id", rid)

    @property
    def capacity(self) -> int:
        """The most cost one key can spend at once: ``burst`` for buckets, else ``limit``."""
        return self._algo.B

    @property
    def id(self) -> str:
        """A stable identifier of this rule's parameters (part of every storage key)."""
        return self._id

    @property
    def policy_name(self) -> str:
        """The name used in ``RateLimit-Policy`` headers."""
        return self.name or "default"

    @classmethod
    def parse(cls, text: str, *, algorithm: str | None = None, name: str | None = None,
              burst: int | None = None) -> Rule:
        """Parse ``"100/minute"``, ``"10/second"``, ``"5 per 2 seconds"``,
        ``"100/minute burst 150"``, ``"1000/hour"``, ``"20/5m"``, ``"1000/month"`` (30
        days), ``"10000/year"`` (365 days)."""
        if not isinstance(text, str):
            raise ConfigError("rule", text, "must be a string like '100/minute'")
        m = _PARSE.match(text)
        if m is None:
            raise ConfigError("rule", text, "cannot parse; expected forms like '100/minute', "
                              "'5 per 2 seconds' or '100/minute burst 150'")
        unit = m["unit"].lower()
        secs = validate.UNITS.get(unit)
        if secs is None:
            raise ConfigError("rule", text, f"unknown time unit {unit!r}; expected one of "
                              "ms, second, minute, hour, day, week, month, year")
        count = float(m["count"]) if m["count"] else 1.0
        if count <= 0:
            raise ConfigError("rule", text, "window count must be positive")
        if m["burst"] is not None:
            if burst is not None:
                raise ConfigError("burst", burst, "given twice (in the text and as an argument)")
            burst = int(m["burst"])
        window = count * secs
        if window == int(window):
            window = int(window)
        return cls(int(m["limit"]), window, algorithm=algorithm, burst=burst, name=name)

    @classmethod
    def parse_many(cls, text: str, *, algorithm: str | None = None) -> list[Rule]:
        """Several limits in one string, as limits / Flask-Limiter / slowapi write them:
        ``"10/minute;100/hour"`` (``;``, ``,`` or ``|`` between limits) -> one
        :class:`Rule` each, in order (for :meth:`RateLimiter.hit_all`)."""
        if not isinstance(text, str):
            raise ConfigError("rule", text, "must be a string like '10/minute;100/hour'")
        parts = [part.strip() for part in _SEPARATORS.split(text)]
        if not any(parts):
            raise ConfigError("rule", text, "names no limit; expected forms like "
                              "'10/minute;100/hour'")
        if not all(parts):
            raise ConfigError("rule", text, "an empty limit between separators")
        return [cls.parse(part, algorithm=algorithm) for part in parts]

    def with_limit(self, limit: int) -> Rule:
        """A copy of this rule with another limit (and the burst scaled alike)."""
        burst = None
        if self.burst is not None:
            burst = max(1, (self.burst * limit) // self.limit)
        return Rule(limit, self.window, self.algorithm, burst, self.name)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"limit": self.limit, "window": self.window,
                             "algorithm": self.algorithm}
        if self.burst is not None:
            d["burst"] = self.burst
        if self.name is not None:
            d["name"] = self.name
        return d

    def __str__(self) -> str:
        w = self.window
        text = f"{self.limit}/{w:g}s {self.algorithm}"
        if self.burst is not None:
            text += f" burst {self.burst}"
        return f"{self.name}: {text}" if self.name else text
