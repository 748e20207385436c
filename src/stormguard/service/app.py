"""The rate-limit service: a Starlette app answering "may this request pass?".

Only translation lives here (HTTP <-> :mod:`stormguard.ruleset`); the decisions are
the limiter's.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import json
import os
import re
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from stormguard.errors import ConfigError, StorageError
from stormguard.limiter import AsyncRateLimiter, RateLimiter
from stormguard.ruleset import (
    CheckResult,
    Plan,
    RequestAttrs,
    RulesError,
    RuleSet,
    RuleSpec,
    acheck_plan,
)
from stormguard.service.metrics import CONTENT_TYPE_LATEST, Metrics
from stormguard.service.openapi import openapi_document
from stormguard.service.sources import (
    FileRules,
    MemoryRules,
    RedisRules,
    RulesSource,
    VersionConflict,
)
from stormguard.stores.base import check_cost

__all__ = ["MAX_BATCH", "MAX_BODY", "ApiError", "Service", "ServiceApp", "create_app"]

MAX_BODY = 64 * 1024
MAX_BATCH = 1000
MAX_KEY = 4096
_ATTRS = ("user", "api_key", "ip", "method", "path", "tier")
_CHECK_FIELDS = frozenset(("key", "rule", "cost", *_ATTRS))
_ETAG = re.compile(r'\s*"(\d{1,18})"\s*')
_FROM_ENV: Any = object()
_JSON = "application/json"


class ApiError(Exception):
    """A 4xx/5xx answer with a JSON body ``{"error": message, ...}``."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None,
                 **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})
        self.extra = extra

    def body(self) -> bytes:
        body = {"error": self.message, "status": self.status, **self.extra}
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()

    def response(self) -> Response:
        return Response(self.body(), self.status, self.headers, _JSON)


def _json(body: object, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return Response(data.encode(), status, headers, _JSON)


def _header(scope: Mapping[str, Any], name: bytes) -> bytes | None:
    for k, v in scope.get("headers") or ():
        if k == name:
            value: bytes = v
            return value
    return None


async def _read_body(scope: Mapping[str, Any], receive: Any) -> bytes:
    """The request body; 413 past 64 KiB (checked on Content-Length and while reading)."""
    length = _header(scope, b"content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise ApiError(400, f"invalid Content-Length {length[:40]!r}")
        if int(length) > MAX_BODY:
            raise ApiError(413, f"body is larger than {MAX_BODY} bytes")
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ApiError(400, "client disconnected before sending the body")
        chunk: bytes = message.get("body", b"")
        body += chunk
        if len(body) > MAX_BODY:
            raise ApiError(413, f"body is larger than {MAX_BODY} bytes")
        if not message.get("more_body", False):
            return body


def _loads(body: bytes) -> Any:
    """Parse JSON; 400 naming the problem when malformed."""
    if not body.strip():
        raise ApiError(400, "malformed JSON: the body is empty")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"malformed JSON: {exc}"[:300]) from None


async def _read_json(request: Request) -> Any:
    return _loads(await _read_body(request.scope, request.receive))


@functools.lru_cache(maxsize=4096)
def _jstr(text: str | None) -> str:
    return json.dumps(text)


def _names(names: list[str]) -> str:
    return "[" + ",".join(_jstr(n) for n in names) + "]" if names else "[]"


def result_json(result: CheckResult) -> bytes:
    """``CheckResult.to_dict()`` as JSON, formatted directly (the hot path of /v1/check)."""
    d = result.decision
    tail = (f'"degraded":{"true" if result.degraded else "false"},'
            f'"shadow_denied":{_names(result.shadow_denied)},"rules":{_names(result.rules)}}}')
    if d is None:
        return ('{"allowed":true,"limit":null,"remaining":null,"reset_after":0.0,'
                '"retry_after":0.0,"rule":null,"shadow":false,' + tail).encode()
    rule = d.rule.name if d.rule is not None else None
    return (f'{{"allowed":{"true" if result.allowed else "false"},"limit":{d.limit},'
            f'"remaining":{d.remaining},"reset_after":{round(d.reset_after, 6)!r},'
            f'"retry_after":{round(d.retry_after, 6)!r},"rule":{_jstr(rule)},'
            f'"shadow":{"true" if result.shadow else "false"},' + tail).encode()


class _Check:
    """One validated check request."""

    __slots__ = ("attrs", "cost", "key", "spec")

    def __init__(self, key: str | None, spec: RuleSpec | None, attrs: RequestAttrs | None,
                 cost: int) -> None:
        self.key = key
        self.spec = spec
        self.attrs = attrs
        self.cost = cost


def _parse_check(obj: object, rules: RuleSet, where: str = "") -> _Check:
    if not isinstance(obj, dict):
        raise ApiError(422, f"{where or 'body'}: must be a JSON object")
    unknown = [k for k in obj if k not in _CHECK_FIELDS]
    if unknown:
        raise ApiError(422, f"{where}{unknown[0]}: unknown field; expected some of "
                       f"{sorted(_CHECK_FIELDS)}", field=f"{where}{unknown[0]}"[:200])
    cost = obj.get("cost", 1)
    if isinstance(cost, bool) or not isinstance(cost, int) or cost <= 0:
        raise ApiError(422, f"{where}cost: must be a positive integer (got {cost!r:.40})",
                       field=f"{where}cost")
    for name in _ATTRS:
        v = obj.get(name)
        if v is not None and not isinstance(v, str):
            raise ApiError(422, f"{where}{name}: must be a string (got {v!r:.40})",
                           field=f"{where}{name}")
    key, rule = obj.get("key"), obj.get("rule")
    if key is not None or rule is not None:
        if not isinstance(key, str) or not key or len(key) > MAX_KEY:
            raise ApiError(422, f"{where}key: must be a non-empty string of at most {MAX_KEY} "
                           f"characters when 'rule' is given (got {key!r:.40})",
                           field=f"{where}key")
        if not isinstance(rule, str):
            raise ApiError(422, f"{where}rule: must be a rule name when 'key' is given "
                           f"(got {rule!r:.40})", field=f"{where}rule")
        attrs = [n for n in _ATTRS if obj.get(n) is not None]
        if attrs:
            raise ApiError(422, f"{where}{attrs[0]}: give either key+rule or request "
                           "attributes, not both", field=f"{where}{attrs[0]}")
        spec = rules.get(rule)
        if spec is None:
            raise ApiError(404, f"{where}rule: unknown rule {rule!r:.80}", field=f"{where}rule")
        return _Check(key, spec, None, cost)
    a = RequestAttrs(obj.get("user"), obj.get("api_key"), obj.get("ip"), obj.get("method"),
                     obj.get("path"), obj.get("tier"))
    return _Check(None, None, a, cost)


def _if_match(request: Request) -> frozenset[int] | None:
    """The versions an ``If-Match`` header accepts (None: no header or ``*``)."""
    header = request.headers.get("if-match")
    if header is None or header.strip() == "*":
        return None
    out = set()
    for part in header.split(","):
        m = _ETAG.fullmatch(part)
        if m is not None:
            out.add(int(m[1]))
    return frozenset(out)


def _etag(version: int) -> dict[str, str]:
    return {"ETag": f'"{version}"'}


class Service:
    """The state behind one app: limiter, rules source, metrics, admin token."""

    def __init__(self, limiter: AsyncRateLimiter | RateLimiter, source: RulesSource,
                 admin_token: str | None, metrics: Metrics) -> None:
        self.limiter = limiter
        self.source = source
        self.admin_token = admin_token.encode() if admin_token else None
        self.metrics = metrics
        self._started = False

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if not self._started:
            self._started = True
            await self.source.start()

    async def stop(self) -> None:
        if self._started:
            self._started = False
            await self.source.stop()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    # -- checks ----------------------------------------------------------------------------
    @staticmethod
    def _plan(c: _Check, rules: RuleSet, where: str = "") -> Plan:
        """The ``(key, rule)`` pairs of a check; a cost above any of their capacities is
        a 422 here, before anything is consumed (a batch is refused whole)."""
        if c.spec is not None and c.key is not None:
            plan: Plan = [(c.key, c.spec)]
        else:
            assert c.attrs is not None
            plan = rules.plan(c.attrs)
        if c.cost != 1:
            for _, spec in plan:
                try:
                    check_cost(spec.rule, c.cost)
                except ConfigError as exc:
                    raise ApiError(422, f"{where}{exc}", field=f"{where}cost") from None
        return plan

    async def _run(self, plan: Plan, cost: int) -> CheckResult:
        t0 = time.perf_counter()
        try:
            result = await acheck_plan(self.limiter, plan, cost)
        except ConfigError as exc:  # a rule this store cannot enforce: say so, never a 500
            raise ApiError(422, f"the store refuses the rule: {exc}"[:500],
                           field=exc.field) from None
        self.metrics.record(result, time.perf_counter() - t0)
        return result

    async def check(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/check`` as a raw ASGI handler (the hot path skips the router)."""
        headers: list[tuple[bytes, bytes]]
        try:
            if not self._started:
                await self.start()
            rules = self.source.current
            c = _parse_check(_loads(await _read_body(scope, receive)), rules)
            result = await self._run(self._plan(c, rules), c.cost)
            status, body = 200, result_json(result)
            headers = [(k.lower().encode(), v.encode()) for k, v in result.headers().items()]
        except ApiError as exc:
            status, body = exc.status, exc.body()
            headers = [(k.lower().encode(), v.encode("latin-1")) for k, v in exc.headers.items()]
        headers.append((b"content-type", b"application/json"))
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def check_batch(self, request: Request) -> Response:
        if not self._started:
            await self.start()
        body = await _read_json(request)
        items = body.get("checks") if isinstance(body, dict) else None
        if not isinstance(body, dict) or set(body) != {"checks"} or not isinstance(items, list):
            raise ApiError(422, "body: must be {\"checks\": [check, ...]}", field="checks")
        if len(items) > MAX_BATCH:
            raise ApiError(422, f"checks: at most {MAX_BATCH} checks per batch", field="checks")
        rules = self.source.current
        plans = []
        for i, item in enumerate(items):
            c = _parse_check(item, rules, f"checks[{i}].")
            plans.append((self._plan(c, rules, f"checks[{i}]."), c.cost))
        results = [(await self._run(plan, cost)).to_dict() for plan, cost in plans]
        return _json({"results": results})

    # -- control plane ---------------------------------------------------------------------
    def _authorize(self, request: Request) -> None:
        if self.admin_token is None:
            raise ApiError(403, "control plane disabled: start the service with "
                           "STORMGUARD_ADMIN_TOKEN set")
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        given = credentials.strip().encode("utf-8", "surrogateescape")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, self.admin_token):
            raise ApiError(401, "missing or wrong bearer token",
                           {"WWW-Authenticate": 'Bearer realm="stormguard"'})

    def _rules_body(self, rules: RuleSet) -> dict[str, Any]:
        return {"version": rules.version, "rules": [r.to_dict() for r in rules.rules]}

    async def _edit(self, request: Request, edit: Any) -> RuleSet:
        try:
            return await self.source.edit(edit, _if_match(request))
        except VersionConflict as exc:
            raise ApiError(412, f"rules changed: they are at version {exc.current}; "
                           "GET them and retry with If-Match", _etag(exc.current),
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
        return _json(self._rules_body(rules), 200, _etag(rules.version))

    async def put_rules(self, request: Request) -> Response:
        self._authorize(request)
        body = await _read_json(request)
        if isinstance(body, dict):
            if "rules" not in body:
                raise ApiError(422, "rules: required (the whole new rule set)", field="rules")
            body = {k: v for k, v in body.items() if k != "version"}  # If-Match decides
        new = RuleSet.from_data(body)  # validated whole before anything is stored

        def replace(_cur: RuleSet, version: int) -> RuleSet:
            return RuleSet(new.rules, version=version)

        rules = await self._edit(request, replace)
        return _json(self._rules_body(rules), 200, _etag(rules.version))

    async def get_rule(self, request: Request) -> Response:
        self._authorize(request)
        name = request.path_params["name"]
        rules = self.source.current
        spec = rules.get(name)
        if spec is None:
            raise ApiError(404, f"unknown rule {name!r:.80}")
        return _json({"version": rules.version, "rule": spec.to_dict()}, 200,
                     _etag(rules.version))

    async def put_rule(self, request: Request) -> Response:
        self._authorize(request)
        name = request.path_params["name"]
        body = await _read_json(request)
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
        return _json({"version": rules.version, "rule": spec.to_dict()},
                     201 if created else 200, _etag(rules.version))

    async def delete_rule(self, request: Request) -> Response:
        self._authorize(request)
        name = request.path_params["name"]

        def delete(cur: RuleSet, version: int) -> RuleSet:
            if name not in cur:
                raise ApiError(404, f"unknown rule {name!r:.80}")
            return cur.without(name, version=version)

        rules = await self._edit(request, delete)
        return _json({"version": rules.version, "deleted": name}, 200, _etag(rules.version))

    # -- operations ------------------------------------------------------------------------
    async def healthz(self, request: Request) -> Response:
        return _json({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        try:
            if isinstance(self.limiter, AsyncRateLimiter):
                ok = await self.limiter.ping()
            else:
                ok = self.limiter.ping()
        except Exception as exc:  # any failure of the store means "not ready", never a 500
            return _json({"status": "unavailable", "error": f"store: {exc}"[:300]}, 503)
        if not ok:
            return _json({"status": "unavailable", "error": "store does not answer"}, 503)
        return _json({"status": "ready", "rules": len(self.source.current),
                      "version": self.source.current.version})

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(self.metrics.render(), 200, media_type=CONTENT_TYPE_LATEST)

    async def openapi(self, request: Request) -> Response:
        return _json(openapi_document())


def _handle(handler: Any) -> Any:
    async def endpoint(request: Request) -> Response:
        try:
            response: Response = await handler(request)
        except ApiError as exc:
            return exc.response()
        except RulesError as exc:
            return ApiError(422, str(exc), problems=exc.to_list()).response()
        return response

    endpoint.__name__ = handler.__name__
    return endpoint


def _by_method(**handlers: Any) -> Any:
    wrapped = {method: _handle(h) for method, h in handlers.items()}
    wrapped["HEAD"] = wrapped["GET"]

    async def endpoint(request: Request) -> Response:
        response: Response = await wrapped[request.method](request)
        return response

    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    headers = exc.headers if isinstance(exc, HTTPException) else None
    return ApiError(status, f"{detail}: {request.method} {request.url.path}"[:300],
                    headers).response()


def create_app(limiter: AsyncRateLimiter | RateLimiter | None = None,
               rules: RuleSet | Iterable[RuleSpec | Mapping[str, Any]] | str
               | os.PathLike[str] | None = None, *,
               admin_token: str | None = _FROM_ENV,
               rules_path: str | os.PathLike[str] | None = None,
               rules_url: str | None = None,
               rules_prefix: str = "stormguard",
               poll_interval: float | None = None,
               metrics: Metrics | None = None) -> ServiceApp:
    """Build the service app.

    * ``limiter``: an :class:`AsyncRateLimiter` (or a blocking :class:`RateLimiter` over a
      store that never blocks); default ``AsyncRateLimiter("memory://")``.
    * ``rules``: the initial rules (RuleSet, list, or rules-file path).
    * ``admin_token``: the control plane's bearer token; default the
      ``STORMGUARD_ADMIN_TOKEN`` environment variable; None or empty disables it.
    * ``rules_path``: a rules file that control-plane edits rewrite atomically (the
      initial rules come from it when ``rules`` is not given).
    * ``rules_url``: a Redis URL: the rules live in Redis and every instance picks up
      changes within ``poll_interval`` (0.25 s) seconds; ``rules``/``rules_path`` only
      seed an empty Redis.
    """
    if limiter is None:
        limiter = AsyncRateLimiter("memory://")
    if not isinstance(limiter, AsyncRateLimiter | RateLimiter):
        raise ConfigError("limiter", limiter, "must be an AsyncRateLimiter or RateLimiter")
    if admin_token is _FROM_ENV:
        admin_token = os.environ.get("STORMGUARD_ADMIN_TOKEN") or None
    initial = RuleSet.coerce(rules) if rules is not None else None
    source: RulesSource
    if rules_url is not None:
        seed = initial
        if seed is None and rules_path is not None:
            seed = RuleSet.load(rules_path)
        source = RedisRules(rules_url, prefix=rules_prefix, seed=seed,
                            poll_interval=0.25 if poll_interval is None else poll_interval)
    elif rules_path is not None:
        if initial is not None and not os.path.exists(rules_path):
            with open(rules_path, "w", encoding="utf-8") as f:
                f.write(initial.dumps())
        source = FileRules(rules_path, poll_interval=1.0 if poll_interval is None
                           else poll_interval)
    else:
        source = MemoryRules(initial)
    service = Service(limiter, source, admin_token, metrics or Metrics())
    s = service
    check_endpoint = _RawEndpoint(service.check)
    routes = [
        Route("/v1/check", check_endpoint, methods=["POST"]),  # 405 for other methods
        Route("/v1/check/batch", _handle(s.check_batch), methods=["POST"]),
        # one route per path, dispatching on the method, so a 405 lists every method
        Route("/v1/rules", _by_method(GET=s.get_rules, PUT=s.put_rules),
              methods=["GET", "PUT"]),
        Route("/v1/rules/{name}", _by_method(GET=s.get_rule, PUT=s.put_rule,
                                             DELETE=s.delete_rule),
              methods=["GET", "PUT", "DELETE"]),
        Route("/healthz", s.healthz, methods=["GET"]),
        Route("/readyz", s.readyz, methods=["GET"]),
        Route("/metrics", s.metrics_endpoint, methods=["GET"]),
        Route("/openapi.json", s.openapi, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=service.lifespan,
                    exception_handlers={HTTPException: _http_error, Exception: _http_error})
    app.state.service = service
    return ServiceApp(app, service)


class _RawEndpoint:
    """A raw ASGI handler as a Starlette route endpoint (a class instance, not a function,
    so Starlette calls it with scope/receive/send)."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handler(scope, receive, send)


class ServiceApp:
    """The service's ASGI app: ``POST /v1/check`` straight to its handler, everything else
    through the Starlette app (``.starlette``); ``.state.service`` is the :class:`Service`."""

    def __init__(self, starlette: Starlette, service: Service) -> None:
        self.starlette = starlette
        self.service = service
        self.state = starlette.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/check" \
                and scope["method"] == "POST":
            await self.service.check(scope, receive, send)
        else:
            await self.starlette(scope, receive, send)
