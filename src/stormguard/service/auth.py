"""``/v1/auth``: the answer to nginx's ``auth_request`` subrequest.

nginx asks with the original request's method, URI and client address in headers
(``X-Original-Method``, ``X-Original-URI``: its path, decoded and normalised as the
application would see it, ``X-Real-IP``, and optionally
``X-Stormguard-User``, ``X-Stormguard-Api-Key``, ``X-Stormguard-Tier``); they are believed
only from a peer among the trusted proxies (``serve --trusted-proxies``), otherwise the
request is judged by its peer address alone. The rules match those attributes as they match
a ``/v1/check`` by attributes. 204 when allowed; 403 (the only denial ``auth_request`` passes
on) with ``Retry-After`` and the rate-limit headers when denied; a store outage follows the
limiter's ``on_error``.
"""

from __future__ import annotations

import ipaddress
import logging
import posixpath
from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import Response

from stormguard.integrations.clientip import ClientIP
from stormguard.ratelimit.rules import RequestAttrs
from stormguard.service.check import CheckEndpoints
from stormguard.service.http import ApiError

__all__ = ["AUTH_HEADERS", "AUTH_METHODS", "AuthEndpoints"]

log = logging.getLogger("stormguard.service")
AUTH_HEADERS = {"method": "x-original-method", "uri": "x-original-uri", "ip": "x-real-ip",
                "user": "x-stormguard-user", "api_key": "x-stormguard-api-key",
                "tier": "x-stormguard-tier"}
AUTH_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
"""nginx's subrequest keeps the original request's method unless ``proxy_method GET``."""


def request_path(uri: str) -> str:
    """The path an application would serve for ``uri`` (nginx's ``$request_uri``, raw):
    without the query, percent-decoded, with ``//``, ``.`` and ``..`` resolved, so
    ``/%73earch``, ``//search`` and ``/a/../search`` all match a rule on ``/search*``."""
    path = unquote(uri.split("?", 1)[0].split("#", 1)[0], errors="replace")
    if not path.startswith("/"):
        path = "/" + path
    normal = posixpath.normpath(path)
    if normal.startswith("//"):  # normpath keeps a leading "//" (POSIX): one is enough
        normal = "/" + normal.lstrip("/")
    if path.endswith("/") and normal != "/":
        normal += "/"
    return normal


class AuthEndpoints(CheckEndpoints):
    """``/v1/auth`` for nginx's ``auth_request``."""

    auth_proxies: ClientIP = ClientIP()
    _untrusted_warned = False

    def _trusted_peer(self, peer: str | None) -> bool:
        if peer is None or not self.auth_proxies.networks:
            return False
        try:
            return self.auth_proxies.is_trusted(ipaddress.ip_address(peer))
        except ValueError:
            return False

    async def auth(self, request: Request) -> Response:
        if not self._started:
            await self.start()
        peer = request.client.host if request.client is not None else None
        h = request.headers
        values: dict[str, str | None] = {}
        if self._trusted_peer(peer):
            for name, header in AUTH_HEADERS.items():
                values[name] = h.get(header) or None
            real = values["ip"]
            if real is not None:
                try:
                    values["ip"] = str(ipaddress.ip_address(real.strip()))
                except ValueError:
                    raise ApiError(400, f"X-Real-IP: not an IP address ({real!r:.60})",
                                   field="X-Real-IP") from None
            else:
                values["ip"] = peer
        else:
            if not self._untrusted_warned and any(h.get(x) for x in AUTH_HEADERS.values()):
                self._untrusted_warned = True
                log.warning("stormguard: /v1/auth: X-Original-* / X-Real-IP headers from %s "
                            "ignored: it is not a trusted proxy (serve --trusted-proxies, "
                            "STORMGUARD_TRUSTED_PROXIES); the request is judged by its peer "
                            "address only", peer)
            values = {"ip": peer}
        uri = values.get("uri")
        path = request_path(uri) if uri else None
        method = values.get("method")
        attrs = RequestAttrs(values.get("user"), values.get("api_key"), values.get("ip"),
                             method.upper() if method else None, path, values.get("tier"))
        rules = self.source.current
        result = await self._run(rules.plan(attrs), 1)
        headers = result.headers()
        if result.allowed:
            return Response(status_code=204, headers=headers)
        body = ApiError(403, "rate limited").body()
        return Response(body, 403, headers, "application/json")
