"""Which requests a rule applies to: scopes, endpoint globs, tiers, and the counter key."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["METHODS", "SCOPES", "Matcher", "RequestAttrs", "parse_endpoint"]

SCOPES = ("user", "api_key", "ip", "global")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE",
                     "CONNECT"})


class RequestAttrs(NamedTuple):
    """What the rules match on. ``None`` means "not known"; a rule scoped to an
    attribute that is ``None`` does not apply to the request. (A named tuple: built
    once per request on the hot path.)"""

    user: str | None = None
    api_key: str | None = None
    ip: str | None = None
    method: str | None = None
    path: str | None = None
    tier: str | None = None


def parse_endpoint(endpoint: str) -> tuple[str | None, re.Pattern[str] | None]:
    """``"METHOD /path-glob"`` -> (method or None for any, compiled glob or None for any);
    raises ValueError naming the problem."""
    text = endpoint.strip()
    method: str | None = None
    path = text
    if " " in text:
        method, _, path = text.partition(" ")
        path = path.strip()
        method = method.upper()
        if method == "*":
            method = None
        elif method not in METHODS:
            raise ValueError(f"unknown HTTP method {method!r} in {endpoint!r}")
    elif text.upper() in METHODS:
        return text.upper(), None
    if not path.startswith("/") and path != "*":
        raise ValueError(f"expected 'METHOD /path-glob' such as 'GET /search*', got {endpoint!r}")
    pattern = None if path in ("*", "/*") else re.compile(fnmatch.translate(path))
    return method, pattern


@dataclass(frozen=True, slots=True)
class Matcher:
    """The matching half of a rule: ``scope`` (one of :data:`SCOPES`), an optional
    ``tier``, and the endpoint as a method (None: any) and a compiled path glob (None: any).
    """

    scope: str
    tier: str | None = None
    method: str | None = None
    path: re.Pattern[str] | None = None

    @classmethod
    def build(cls, scope: str, endpoint: str | None, tier: str | None) -> Matcher:
        """From the rule's fields (already type-checked); ValueError for a bad endpoint."""
        method, path = (None, None) if endpoint is None else parse_endpoint(endpoint)
        return cls(scope, tier, method, path)

    def matches(self, a: RequestAttrs) -> bool:
        if self.tier is not None and a.tier != self.tier:
            return False
        if self.method is not None and (a.method is None or a.method.upper() != self.method):
            return False
        if self.path is not None and (a.path is None or self.path.match(a.path) is None):
            return False
        return self.scope == "global" or getattr(a, self.scope) is not None

    def key_for(self, a: RequestAttrs) -> str:
        """The counter key for a request this matches: ``"<scope>:<value>"`` or ``"global"``."""
        if self.scope == "global":
            return "global"
        return f"{self.scope}:{getattr(a, self.scope)}"
