"""The control plane, behind a bearer token: ``/v1/rules``, ``/v1/rules/{name}`` and
``POST /v1/reset`` (forget a key's counters)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from stormguard._core.errors import StorageError
from stormguard.ratelimit.limiter import AsyncRateLimiter
from stormguard.ratelimit.rules import RulesError, RuleSet, RuleSpec
from stormguard.service.base import ServiceBase
from stormguard.service.check import parse_check
from stormguard.service.http import (
    MAX_RULES_BODY,
    ApiError,
    etag,
    header,
    if_match,
    json_response,
    read_json,
)
from stormguard.service.sources import VersionConflict

__all__ = ["AdminEndpoints"]


class AdminEndpoints(ServiceBase):
    """Reading and editing the rules (optimistic concurrency through ``If-Match``)."""

    def _authorize(self, request: Request) -> None:
        if self.admin_token is None:
            raise ApiError(403, "control plane disabled: start the service with "
                           "STORMGUARD_ADMIN_TOKEN set")
        # bytes to bytes: the header as sent (UTF-8 for a non-ASCII token) against the
        # token's UTF-8 bytes, in constant time
        scheme, _, given = (header(request.scope, b"authorization") or b"").partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(),
                                                                   self.admin_token):
            raise ApiError(401, "missing or wrong bearer token",
                           {"WWW-Authenticate": 'Bearer realm="stormguard"'})

    def _rules_body(self, rules: RuleSet) -> dict[str, Any]:
        return {"version": rules.version, "rules": [r.to_dict() for r in rules.rules]}

    async def _edit(self, request: Request, edit: Any) -> RuleSet:
        try:
            return await self.source.edit(edit, if_match(request))
        except VersionConflict as exc:
            raise ApiError(412, f"rules changed: they are at version {exc.current}; "
                           "GET them and retry with If-Match", etag(exc.current),
                           version=exc.current) from None
        except RulesError as exc:
            raise ApiError(422, str(exc), problems=exc.to_list()) from None
        except StorageError as exc:
            raise ApiError(503, f"rules storage unavailable: {exc}") from None

    async def get_rules(self, request: Request) -> Response:
        self._authorize(request)
        if not self._started:
            await self.start()
        with contextlib.suppress(StorageError):
            await self.source.refresh()
        rules = self.source.current
        return json_response(self._rules_body(rules), 200, etag(rules.version))

    async def put_rules(self, request: Request) -> Response:
        self._authorize(request)  # before reading a body of up to 4 MiB
        body = await read_json(request, MAX_RULES_BODY)
        if isinstance(body, dict):
            if "rules" not in body:
                raise ApiError(422, "rules: required (the whole new rule set)", field="rules")
            body = {k: v for k, v in body.items() if k != "version"}  # If-Match decides
        # validated whole before anything is stored; in a thread: 10,000 rules take a
        # second of CPU, which must not stall the checks
        new = await asyncio.to_thread(RuleSet.from_data, body)

        def replace(_cur: RuleSet, version: int) -> RuleSet:
            return RuleSet(new.rules, version=version)

        rules = await self._edit(request, replace)
        return json_response(self._rules_body(rules), 200, etag(rules.version))

    async def get_rule(self, request: Request) -> Response:
        self._authorize(request)
        name = request.path_params["name"]
        rules = self.source.current
        spec = rules.get(name)
        if spec is None:
            raise ApiError(404, f"unknown rule {name!r:.80}")
        return json_response({"version": rules.version, "rule": spec.to_dict()}, 200,
                             etag(rules.version))

    async def put_rule(self, request: Request) -> Response:
        self._authorize(request)
        name = request.path_params["name"]
        body = await read_json(request)
        if not isinstance(body, dict):
            raise ApiError(422, "body: must be a rule object")
        if body.get("name", name) != name:
            raise ApiError(422, f"name: the body says {body.get('name')!r:.80} but the path "
                           f"says {name!r:.80}", field="name")
        spec = RuleSpec.from_dict({**body, "name": name})
        created = False

        def upsert(cur: RuleSet, version: int) -> RuleSet:
            nonlocal created
            created = name not in cur
            return cur.with_rule(spec, version=version)

        rules = await self._edit(request, upsert)
        return json_response({"version": rules.version, "rule": spec.to_dict()},
                             201 if created else 200, etag(rules.version))

    async def delete_rule(self, request: Request) -> Response:
        self._authorize(request)
        name = request.path_params["name"]

        def delete(cur: RuleSet, version: int) -> RuleSet:
            if name not in cur:
                raise ApiError(404, f"unknown rule {name!r:.80}")
            return cur.without(name, version=version)

        rules = await self._edit(request, delete)
        return json_response({"version": rules.version, "deleted": name}, 200,
                             etag(rules.version))

    async def reset_counters(self, request: Request) -> Response:
        """``POST /v1/reset`` with a key-based check body (``key`` + ``rule``, ``key`` +
        an inline limit, or ``key`` + ``limits``): forget that key's counters of those
        rules. It lifts a limit, so it is a control-plane call (the bearer token)."""
        self._authorize(request)
        if not self._started:
            await self.start()
        body = await read_json(request)
        if isinstance(body, dict):
            extra = [k for k in ("cost", "peek") if k in body]
            if extra:
                raise ApiError(422, f"{extra[0]}: not a field of a reset", field=extra[0])
        c = parse_check(body, self.source.current)
        if c.key is None:
            raise ApiError(422, "key: a reset names a key and its rule (key + rule, key + "
                           "limit, or key + limits)", field="key")
        rules = [spec.rule for spec in c.specs]
        target = rules if len(rules) > 1 else rules[0]
        try:
            if isinstance(self.limiter, AsyncRateLimiter):
                await self.limiter.reset(c.key, target)
            else:
                self.limiter.reset(c.key, target)
        except StorageError as exc:
            raise ApiError(503, f"store unavailable: {exc}") from None
        return json_response({"reset": True, "key": c.key,
                              "rules": [spec.name for spec in c.specs if spec.name]})
