"""What the ASGI and WSGI middleware share: the rules argument, the request attributes'
sources (user/tier callables, API-key header, client IP) and the 429 body."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from stormguard._core.errors import ConfigError
from stormguard.integrations.clientip import ClientIP
from stormguard.integrations.deployment import warn_memory_store_workers
from stormguard.ratelimit.rules import CheckResult, RuleSet, RuleSpec

__all__ = ["MiddlewareBase", "RulesArg", "denied_body", "log_refused"]

RulesArg = RuleSet | Iterable[RuleSpec | Mapping[str, Any]] | str | os.PathLike[str]
log = logging.getLogger("stormguard.middleware")


def log_refused(exc: ConfigError) -> None:
    log.error("stormguard: the store refused a rule, request passed unlimited: %s", exc)


def denied_body(result: CheckResult) -> bytes:
    d = result.decision
    body = {"error": "rate limit exceeded", **result.to_dict()}
    if d is not None:
        body["retry_after"] = round(d.retry_after, 3)
    return json.dumps(body, separators=(",", ":")).encode()


class MiddlewareBase:
    """The rules and the request-attribute sources of a middleware."""

    def __init__(self, limiter: Any, rules: RulesArg, *,
                 user: Callable[[Any], str | None] | None, tier: Callable[[Any], str | None]
                 | None, api_key_header: str | None, trusted_proxies: Iterable[str]) -> None:
        self.limiter = limiter
        self.rules = RuleSet.coerce(rules)
        self.user = user
        self.tier = tier
        self.api_key_header = api_key_header.lower() if api_key_header else None
        self.client_ip = ClientIP(trusted_proxies)
        self._warned_workers = warn_memory_store_workers(getattr(limiter, "store", None))

    def check_multiprocess(self, multiprocess: object) -> None:
        """WSGI's ``wsgi.multiprocess`` (gunicorn sets it with more than one worker):
        warn once when the limits live in a per-process memory store."""
        if multiprocess and not self._warned_workers:
            self._warned_workers = True
            warn_memory_store_workers(getattr(self.limiter, "store", None), workers=0)
