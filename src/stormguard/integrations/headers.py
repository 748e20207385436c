"""What the ASGI and WSGI middleware share: the rules argument, the request attributes'
sources (user/tier callables, API-key header, client IP), the exempt paths, the reset
header's form and the 429 body."""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from stormguard._core import validate
from stormguard._core.errors import ConfigError
from stormguard.integrations.clientip import ClientIP
from stormguard.integrations.deployment import warn_memory_store_workers
from stormguard.ratelimit.rule import DEFAULT_ALGORITHM, Rule
from stormguard.ratelimit.rules import CheckResult, RuleSet, RuleSpec

__all__ = ["RESET_HEADERS", "MiddlewareBase", "RulesArg", "coerce_rules", "denied_body",
           "exempt_matcher", "log_refused"]

RESET_HEADERS = ("seconds", "epoch")
"""``reset_header``: ``X-RateLimit-Reset`` as seconds from now, or as epoch seconds."""
RulesArg = (RuleSet | Iterable[RuleSpec | Mapping[str, Any]] | str | os.PathLike[str] | Rule
            | Iterable[Rule])
log = logging.getLogger("stormguard.middleware")


def log_refused(exc: ConfigError) -> None:
    log.error("stormguard: the store refused a rule, request passed unlimited: %s", exc)


def denied_body(result: CheckResult) -> bytes:
    d = result.decision
    body = {"error": "rate limit exceeded", **result.to_dict()}
    if d is not None:
        body["retry_after"] = round(d.retry_after, 3)
    return json.dumps(body, separators=(",", ":")).encode()


def coerce_rules(rules: RulesArg) -> RuleSet:
    """The middleware's ``rules``: rules as data (a RuleSet, a list, a rules file), or
    :class:`~stormguard.Rule` objects (``Rule.parse_many("10/minute;100/hour")``), which
    apply to every request per client IP, named by their ``name`` or their limit
    (``ip-10-per-60s``)."""
    if isinstance(rules, Rule):
        rules = [rules]
    if isinstance(rules, list | tuple) and rules and all(isinstance(r, Rule) for r in rules):
        return RuleSet(RuleSpec(r.name or f"ip-{r.limit}-per-{r.window:g}s", "ip", r.limit,
                                r.window, algorithm=r.algorithm or DEFAULT_ALGORITHM,
                                burst=r.burst) for r in rules)
    return RuleSet.coerce(rules)  # type: ignore[arg-type]


def exempt_matcher(exempt: Iterable[str]) -> Callable[[str], bool] | None:
    """``exempt`` path globs (``"/healthz"``, ``"/docs*"``) as one test; None for none."""
    if isinstance(exempt, str):
        exempt = [exempt]
    globs = []
    for glob in exempt:
        validate.text("exempt", glob)
        if not glob.startswith("/") and not glob.startswith("*"):
            raise ConfigError("exempt", glob, "must be path globs such as '/healthz' or "
                              "'/docs*'")
        globs.append(fnmatch.translate(glob))
    if not globs:
        return None
    pattern = re.compile("|".join(f"(?:{g})" for g in globs))
    return lambda path: pattern.match(path) is not None


class MiddlewareBase:
    """The rules and the request-attribute sources of a middleware, the exempt paths and
    the form of ``X-RateLimit-Reset``."""

    def __init__(self, limiter: Any, rules: RulesArg, *,
                 user: Callable[[Any], str | None] | None, tier: Callable[[Any], str | None]
                 | None, api_key_header: str | None, trusted_proxies: Iterable[str],
                 exempt: Iterable[str] = (), reset_header: str = "seconds") -> None:
        self.limiter = limiter
        self.rules = coerce_rules(rules)
        self.user = user
        self.tier = tier
        self.api_key_header = api_key_header.lower() if api_key_header else None
        self.client_ip = ClientIP(trusted_proxies)
        self.is_exempt = exempt_matcher(exempt)
        self.reset_header = validate.one_of("reset_header", reset_header, RESET_HEADERS)
        self._warned_workers = warn_memory_store_workers(getattr(limiter, "store", None))

    def check_multiprocess(self, multiprocess: object) -> None:
        """WSGI's ``wsgi.multiprocess`` (gunicorn sets it with more than one worker):
        warn once when the limits live in a per-process memory store."""
        if multiprocess and not self._warned_workers:
            self._warned_workers = True
            warn_memory_store_workers(getattr(self.limiter, "store", None), workers=0)

    def headers(self, result: CheckResult) -> dict[str, str]:
        if self.reset_header == "seconds":
            return result.headers()
        return result.headers(self.reset_header, self.limiter.store.clock.wall())
