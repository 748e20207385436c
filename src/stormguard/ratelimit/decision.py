"""`Decision`: everything a 429 response (or a 200 with headers) needs."""

from __future__ import annotations

import math
import time
from operator import itemgetter
from typing import TYPE_CHECKING

from stormguard._core.errors import ConfigError

if TYPE_CHECKING:
    from stormguard.ratelimit.rule import Rule

__all__ = ["Decision"]

_new = tuple.__new__
_FIELDS = ("allowed", "limit", "remaining", "reset_after", "retry_after", "rule", "degraded")


def _ceil_s(seconds: float) -> int:
    # 1e-9 guards against 2.0000000000000004 becoming 3
    return max(0, math.ceil(seconds - 1e-9))


def _sf_string(text: str) -> str:
    """Make ``text`` a valid structured-field string body (printable ASCII, escaped)."""
    if not (text.isascii() and text.isprintable()):
        text = "".join(ch if " " <= ch <= "~" else "?" for ch in text)
    return text.replace("\\", "\\\\").replace('"', '\\"')


class Decision(tuple[bool, int, int, float, float, "Rule | None", bool]):
    """The answer to one check (an immutable record).

    * ``allowed``: admit the request?
    * ``limit``: the rule's capacity (``limit``, or ``burst`` for bucket algorithms)
    * ``remaining``: how much cost could still be admitted right now
    * ``reset_after``: seconds until the quota is fully restored (0.0 when it is full)
    * ``retry_after``: seconds to wait before the same request is admitted (0.0 when allowed)
    * ``rule``: the rule that decided (for ``hit_all``, the binding rule)
    * ``degraded``: True when the store failed and ``on_error`` answered instead

    It is a tuple underneath (cheap to build on the hot path), but compares and
    prints as a record; use the attributes, not positions.
    """

    __slots__ = ()

    def __new__(cls, allowed: bool, limit: int, remaining: int, reset_after: float,
                retry_after: float, rule: Rule | None = None, degraded: bool = False) -> Decision:
        return _new(cls, (allowed, limit, remaining, reset_after, retry_after, rule, degraded))

    allowed: bool = property(itemgetter(0))  # type: ignore[assignment]
    limit: int = property(itemgetter(1))  # type: ignore[assignment]
    remaining: int = property(itemgetter(2))  # type: ignore[assignment]
    reset_after: float = property(itemgetter(3))  # type: ignore[assignment]
    retry_after: float = property(itemgetter(4))  # type: ignore[assignment]
    rule: Rule | None = property(itemgetter(5))  # type: ignore[assignment]
    degraded: bool = property(itemgetter(6))  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return self[0]

    def replace(self, **changes: object) -> Decision:
        """A copy with some fields changed."""
        fields: dict[str, object] = dict(zip(_FIELDS, self, strict=True))
        for name in changes:
            if name not in fields:
                raise TypeError(f"Decision has no field {name!r}")
        fields.update(changes)
        return _new(Decision, tuple(fields[f] for f in _FIELDS))

    def __repr__(self) -> str:
        return "Decision(" + ", ".join(
            f"{f}={v!r}" for f, v in zip(_FIELDS, self, strict=True)) + ")"

    def __getnewargs__(self) -> tuple[object, ...]:
        return tuple(self)

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready view (the rule by name)."""
        return {
            "allowed": self.allowed,
            "limit": self.limit,
            "remaining": self.remaining,
            "reset_after": self.reset_after,
            "retry_after": self.retry_after,
            "rule": self.rule.policy_name if self.rule is not None else None,
            "degraded": self.degraded,
        }

    def reset_epoch(self, now: float | None = None, field: str = "epoch") -> int:
        """When the quota is fully restored, as epoch seconds (an integer, rounded up);
        ``now`` is the wall time (default :func:`time.time`)."""
        if field != "epoch":
            raise ConfigError("reset_header", field, "must be 'seconds' or 'epoch'")
        if now is None:
            now = time.time()
        return max(0, math.ceil(now + self.reset_after - 1e-6))

    def headers(self, reset_header: str = "seconds", now: float | None = None
                ) -> dict[str, str]:
        """Response headers: ``X-RateLimit-*``, IETF ``RateLimit`` / ``RateLimit-Policy``
        (draft-ietf-httpapi-ratelimit-headers, structured fields) and ``Retry-After``
        when denied.

        ``X-RateLimit-Reset`` is in seconds from now (``reset_header="seconds"``, the
        default) or an epoch timestamp in whole seconds, rounded up (``"epoch"``, as
        Flask-Limiter and slowapi send it; ``now`` is the wall time, default
        :func:`time.time`). ``RateLimit``'s ``t`` and ``Retry-After`` are always seconds.
        """
        reset = _ceil_s(self.reset_after)
        remaining = self.remaining if self.remaining > 0 else 0
        rule = self.rule
        name = rule.policy_name if rule is not None else "default"
        name = _sf_string(name)
        h = {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(remaining),
            "X-RateLimit-Reset": str(reset),
        }
        if reset_header != "seconds":
            h["X-RateLimit-Reset"] = str(self.reset_epoch(now, reset_header))
        if rule is not None:
            window = max(1, math.ceil(rule.window - 1e-9))
            h["RateLimit-Policy"] = f'"{name}";q={rule.limit};w={window}'
        h["RateLimit"] = f'"{name}";r={remaining};t={reset}'
        if not self.allowed:
            h["Retry-After"] = str(max(1, _ceil_s(self.retry_after)))
        return h
