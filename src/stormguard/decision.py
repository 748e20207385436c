"""`Decision`: everything a 429 response (or a 200 with headers) needs."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stormguard.rules import Rule

__all__ = ["Decision"]


def _ceil_s(seconds: float) -> int:
    # 1e-9 guards against 2.0000000000000004 becoming 3
    return max(0, math.ceil(seconds - 1e-9))


def _sf_string(text: str) -> str:
    """Make ``text`` a valid structured-field string body (printable ASCII, escaped)."""
    if not (text.isascii() and text.isprintable()):
        text = "".join(ch if " " <= ch <= "~" else "?" for ch in text)
    return text.replace("\\", "\\\\").replace('"', '\\"')


class Decision:
    """The answer to one check.

    * ``allowed``: admit the request?
    * ``limit``: the rule's capacity (``limit``, or ``burst`` for bucket algorithms)
    * ``remaining``: how much cost could still be admitted right now
    * ``reset_after``: seconds until the quota is fully restored (0.0 when it is full)
    * ``retry_after``: seconds to wait before the same request is admitted (0.0 when allowed)
    * ``rule``: the rule that decided (for ``hit_all``, the binding rule)
    * ``degraded``: True when the store failed and ``on_error`` answered instead
    """

    __slots__ = ("allowed", "degraded", "limit", "remaining", "reset_after", "retry_after", "rule")

    def __init__(self, allowed: bool, limit: int, remaining: int, reset_after: float,
                 retry_after: float, rule: Rule | None = None, degraded: bool = False) -> None:
        self.allowed = allowed
        self.limit = limit
        self.remaining = remaining
        self.reset_after = reset_after
        self.retry_after = retry_after
        self.rule = rule
        self.degraded = degraded

    def __bool__(self) -> bool:
        return self.allowed

    def _key(self) -> tuple[object, ...]:
        return (self.allowed, self.limit, self.remaining, self.reset_after, self.retry_after,
                self.rule, self.degraded)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"Decision(allowed={self.allowed}, limit={self.limit}, remaining={self.remaining}, "
                f"reset_after={self.reset_after!r}, retry_after={self.retry_after!r}, "
                f"rule={self.rule!r}, degraded={self.degraded})")

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

    def headers(self) -> dict[str, str]:
        """Response headers: ``X-RateLimit-*``, IETF ``RateLimit`` / ``RateLimit-Policy``
        (draft-ietf-httpapi-ratelimit-headers, structured fields) and ``Retry-After``
        when denied."""
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
        if rule is not None:
            window = max(1, math.ceil(rule.window - 1e-9))
            h["RateLimit-Policy"] = f'"{name}";q={rule.limit};w={window}'
        h["RateLimit"] = f'"{name}";r={remaining};t={reset}'
        if not self.allowed:
            h["Retry-After"] = str(max(1, _ceil_s(self.retry_after)))
        return h
