"""Django rate-limit middleware, configured from ``settings.STORMGUARD``.

::

    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "stormguard.integrations.django.RateLimitMiddleware",   # after authentication
    ]
    STORMGUARD = {
        "store": "redis://redis:6379/0",     # or "limiter": a (Async)RateLimiter / its dotted path
        "on_error": "allow",                 # with "store": allow | deny | local
        "rules": BASE_DIR / "rules.yaml",    # or a list of rules as data
        "trusted_proxies": ["10.0.0.0/8"],   # only these may set X-Forwarded-For
    }

The request attributes the rules match: ``user`` is ``str(request.user.pk)`` for an
authenticated user, the client IP (:class:`~stormguard.integrations.clientip.ClientIP`)
counts anonymous requests (``"ip_scope": "all"``: every request), the API key comes from
``api_key_header``, the tier from ``"tier"`` (a callable of the request, or its dotted
path). ``exempt`` path globs are neither checked nor given headers; ``reset_header``
(``"seconds"`` or ``"epoch"``) is the form of ``X-RateLimit-Reset``. The check itself is
the rules' (:mod:`stormguard.ratelimit.rules`): a denied request is answered ``429``
with a JSON body, ``Retry-After`` and the rate-limit headers; allowed responses carry
the headers too. Store failures follow the limiter's ``on_error``; a rule the store
refuses is logged and the request passes.

Sync and async: under ASGI with an async middleware chain the middleware is a coroutine
(``request.auser()``, an :class:`~stormguard.AsyncRateLimiter` awaited, a blocking
:class:`~stormguard.RateLimiter` on a store other than memory run in a thread).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils.module_loading import import_string

from stormguard._core.errors import ConfigError
from stormguard.integrations.headers import MiddlewareBase, denied_body, log_refused
from stormguard.ratelimit.limiter import AsyncRateLimiter, RateLimiter
from stormguard.ratelimit.rules import CheckResult, Plan, RequestAttrs, acheck_plan, check_plan
from stormguard.stores.memory import MemoryStore

__all__ = ["SETTINGS", "RateLimitMiddleware"]

SETTINGS = ("limiter", "store", "on_error", "rules", "trusted_proxies", "api_key_header",
            "tier", "ip_scope", "exempt", "reset_header")
_PATH = "stormguard.integrations.django.RateLimitMiddleware"
_AUTH = "django.contrib.auth.middleware.AuthenticationMiddleware"
Limiter = RateLimiter | AsyncRateLimiter
_R = TypeVar("_R", bound=HttpResponseBase)


def _bad(name: str, problem: str) -> ImproperlyConfigured:
    where = f"settings.STORMGUARD[{name!r}]" if name else "settings.STORMGUARD"
    return ImproperlyConfigured(f"{where}: {problem}")


def _setting(conf: Mapping[str, Any], name: str, value: Any, kind: str) -> Any:
    """A dotted path (a string) imported, else ``value`` itself."""
    if isinstance(value, str):
        try:
            return import_string(value)
        except ImportError as exc:
            raise _bad(name, f"cannot import {value!r} ({exc}); expected {kind}") from exc
    return value


def _limiter(conf: Mapping[str, Any]) -> Limiter:
    if "limiter" in conf:
        if "store" in conf or "on_error" in conf:
            raise _bad("limiter", "give either 'limiter' or 'store' (and 'on_error'), "
                       "not both")
        limiter = _setting(conf, "limiter", conf["limiter"], "a RateLimiter")
        if not isinstance(limiter, RateLimiter | AsyncRateLimiter):
            raise _bad("limiter", f"must be a RateLimiter or AsyncRateLimiter, or the dotted "
                       f"path of one (got {limiter!r:.80})")
        return limiter
    try:
        return RateLimiter(conf.get("store", "memory://"), on_error=conf.get("on_error",
                                                                             "allow"))
    except ConfigError as exc:
        raise _bad("on_error" if exc.field == "on_error" else "store", str(exc)) from exc


def _config() -> tuple[Limiter, dict[str, Any]]:
    conf = getattr(settings, "STORMGUARD", None)
    if not isinstance(conf, Mapping):
        raise _bad("", f"must be a dict with at least 'rules' (got {conf!r:.80}); keys: "
                   f"{', '.join(SETTINGS)}")
    unknown = sorted(set(conf) - set(SETTINGS))
    if unknown:
        raise _bad(unknown[0], f"unknown setting; expected some of {', '.join(SETTINGS)}")
    if "rules" not in conf:
        raise _bad("rules", "required: a rules-file path or a list of rules")
    tier = conf.get("tier")
    if tier is not None:
        tier = _setting(conf, "tier", tier, "a callable(request) -> tier or None")
        if not callable(tier):
            raise _bad("tier", f"must be a callable(request) or its dotted path (got "
                       f"{tier!r:.80})")
    ip_scope = conf.get("ip_scope", "anonymous")
    if ip_scope not in ("anonymous", "all"):
        raise _bad("ip_scope", f"must be 'anonymous' or 'all' (got {ip_scope!r:.80})")
    return _limiter(conf), {**conf, "tier": tier, "ip_scope": ip_scope}


def _check_order() -> None:
    middleware = list(getattr(settings, "MIDDLEWARE", None) or ())
    if _PATH in middleware and _AUTH in middleware \
            and middleware.index(_AUTH) > middleware.index(_PATH):
        raise ImproperlyConfigured(f"settings.MIDDLEWARE: {_PATH} must come after {_AUTH}, "
                                   "or every request is anonymous to the rate limits")


class RateLimitMiddleware(MiddlewareBase):
    """Django middleware (sync and async): see the module docstring."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        limiter, conf = _config()
        _check_order()
        try:
            super().__init__(limiter, conf["rules"], user=None, tier=conf["tier"],
                             api_key_header=conf.get("api_key_header", "x-api-key"),
                             trusted_proxies=conf.get("trusted_proxies", ()),
                             exempt=conf.get("exempt", ()),
                             reset_header=conf.get("reset_header", "seconds"))
        except ConfigError as exc:
            field = exc.field if exc.field in SETTINGS else "rules"
            raise _bad(field, str(exc)) from exc
        self.get_response = get_response
        self.ip_scope: str = conf["ip_scope"]
        self._meta_key = ("HTTP_" + self.api_key_header.upper().replace("-", "_")
                          if self.api_key_header else None)
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)
        # a blocking limiter on the event loop: only the memory store never blocks
        self._in_thread = (isinstance(limiter, RateLimiter)
                           and type(limiter.store) is not MemoryStore)

    def attrs(self, request: HttpRequest, user: Any) -> RequestAttrs:
        meta = request.META
        uid = str(user.pk) if user is not None and user.is_authenticated else None
        ip = None
        if uid is None or self.ip_scope == "all":
            ip = self.client_ip.resolve(meta.get("REMOTE_ADDR"),
                                        meta.get("HTTP_X_FORWARDED_FOR"))
        return RequestAttrs(
            user=uid,
            api_key=(meta.get(self._meta_key) or None) if self._meta_key else None,
            ip=ip,
            method=request.method,
            path=request.path,
            tier=self.tier(request) if self.tier is not None else None,
        )

    def __call__(self, request: HttpRequest) -> Any:
        if self._async:
            return self.__acall__(request)
        if self.is_exempt is not None and self.is_exempt(request.path):
            return self.get_response(request)
        plan = self.rules.plan(self.attrs(request, getattr(request, "user", None)))
        if not plan:
            return self.get_response(request)
        try:
            if isinstance(self.limiter, AsyncRateLimiter):
                result = async_to_sync(acheck_plan)(self.limiter, plan)
            else:
                result = check_plan(self.limiter, plan)
        except ConfigError as exc:  # a rule the store cannot enforce: never a 500
            log_refused(exc)
            return self.get_response(request)
        if not result.allowed:
            return self._denied(result)
        return self._with_headers(self.get_response(request), result)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]] = self.get_response
        if self.is_exempt is not None and self.is_exempt(request.path):
            return await get_response(request)
        user = await request.auser() if hasattr(request, "auser") else None
        plan = self.rules.plan(self.attrs(request, user))
        if not plan:
            return await get_response(request)
        try:
            result = await self._acheck(plan)
        except ConfigError as exc:
            log_refused(exc)
            return await get_response(request)
        if not result.allowed:
            return self._denied(result)
        return self._with_headers(await get_response(request), result)

    def _denied(self, result: CheckResult) -> HttpResponse:
        response = HttpResponse(denied_body(result), status=429,
                                content_type="application/json")
        return self._with_headers(response, result)

    def _with_headers(self, response: _R, result: CheckResult) -> _R:
        for name, value in self.headers(result).items():
            response[name] = value
        return response

    async def _acheck(self, plan: Plan) -> CheckResult:
        if self._in_thread:
            assert isinstance(self.limiter, RateLimiter)
            return await sync_to_async(check_plan, thread_sensitive=False)(self.limiter, plan)
        return await acheck_plan(self.limiter, plan)


