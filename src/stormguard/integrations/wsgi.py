"""WSGI rate-limit middleware (Flask, Django, ...): see :mod:`stormguard.middleware`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from stormguard._core.errors import ConfigError
from stormguard.integrations.headers import MiddlewareBase, RulesArg, denied_body, log_refused
from stormguard.ratelimit.limiter import RateLimiter
from stormguard.ratelimit.rules import RequestAttrs

__all__ = ["WSGIRateLimitMiddleware"]

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class WSGIRateLimitMiddleware(MiddlewareBase):
    """WSGI middleware with a blocking :class:`RateLimiter`. ``user(environ)`` and
    ``tier(environ)`` return the user id and tier (or None); ``exempt`` and
    ``reset_header`` as for :class:`~stormguard.middleware.RateLimitMiddleware`."""

    def __init__(self, app: WSGIApp, *, limiter: RateLimiter, rules: RulesArg,
                 user: Callable[[dict[str, Any]], str | None] | None = None,
                 tier: Callable[[dict[str, Any]], str | None] | None = None,
                 api_key_header: str | None = "x-api-key",
                 trusted_proxies: Iterable[str] = (), exempt: Iterable[str] = (),
                 reset_header: str = "seconds") -> None:
        if not isinstance(limiter, RateLimiter):
            raise ConfigError("limiter", limiter,
                              "must be a RateLimiter (WSGI is blocking; use "
                              "RateLimitMiddleware for an AsyncRateLimiter)")
        super().__init__(limiter, rules, user=user, tier=tier, api_key_header=api_key_header,
                         trusted_proxies=trusted_proxies, exempt=exempt,
                         reset_header=reset_header)
        self.app = app
        self._api_key_env = ("HTTP_" + self.api_key_header.upper().replace("-", "_")
                             if self.api_key_header else None)

    def attrs(self, environ: dict[str, Any]) -> RequestAttrs:
        api_key = environ.get(self._api_key_env) if self._api_key_env else None
        return RequestAttrs(
            user=self.user(environ) if self.user is not None else None,
            api_key=api_key or None,
            ip=self.client_ip.resolve(environ.get("REMOTE_ADDR"),
                                      environ.get("HTTP_X_FORWARDED_FOR")),
            method=environ.get("REQUEST_METHOD"),
            path=environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""),
            tier=self.tier(environ) if self.tier is not None else None,
        )

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        if not self._warned_workers:
            self.check_multiprocess(environ.get("wsgi.multiprocess"))
        if self.is_exempt is not None and self.is_exempt(
                environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")):
            return self.app(environ, start_response)
        attrs = self.attrs(environ)
        if not self.rules.match(attrs):
            return self.app(environ, start_response)
        try:
            result = self.rules.check(self.limiter, attrs)
        except ConfigError as exc:  # a rule the store cannot enforce: never a 500
            log_refused(exc)
            return self.app(environ, start_response)
        headers = list(self.headers(result).items())
        if not result.allowed:
            body = denied_body(result)
            start_response("429 Too Many Requests", [
                ("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                *headers])
            return [body]

        def start_with_headers(status: str, response_headers: list[tuple[str, str]],
                               exc_info: Any = None) -> Any:
            return start_response(status, [*response_headers, *headers], exc_info)

        return self.app(environ, start_with_headers)
