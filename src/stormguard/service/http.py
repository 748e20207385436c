"""HTTP plumbing of the service: JSON errors and responses, reading bodies, parsing JSON,
``If-Match``/``ETag``, and the wrappers that turn handlers into Starlette endpoints."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from stormguard.ratelimit.rules import RulesError

__all__ = ["MAX_BODY", "MAX_HEAD", "MAX_HEADERS", "MAX_RULES_BODY", "ApiError", "RawEndpoint",
           "by_method", "etag", "handle", "header", "http_error", "if_match", "json_response",
           "loads", "read_body", "read_json"]

MAX_BODY = 64 * 1024
MAX_RULES_BODY = 4 * 1024 * 1024
"""The body of ``PUT /v1/rules`` (read only after the token was checked): room for a rule
set of ``MAX_RULES`` (10,000) rules of up to about 400 bytes each."""
MAX_HEAD = 16 * 1024
"""Bytes of a request's line and headers that ``stormguard serve`` reads (uvicorn's h11
``h11_max_incomplete_event_size``); past it the connection gets 400 and is closed."""
MAX_HEADERS = 100
"""Header fields of one request (Apache's ``LimitRequestFields``); past it, 431."""
_ETAG = re.compile(r'\s*"(\d{1,18})"\s*')
JSON_TYPE = "application/json"


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
        # backslashreplace: whatever a message quotes, the answer is valid JSON
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8", "backslashreplace")

    def response(self) -> Response:
        return Response(self.body(), self.status, self.headers, JSON_TYPE)


def json_response(body: object, status: int = 200,
                  headers: Mapping[str, str] | None = None) -> Response:
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return Response(data.encode("utf-8", "backslashreplace"), status, headers, JSON_TYPE)


def header(scope: Mapping[str, Any], name: bytes) -> bytes | None:
    for k, v in scope.get("headers") or ():
        if k == name:
            value: bytes = v
            return value
    return None


async def read_body(scope: Mapping[str, Any], receive: Any, limit: int = MAX_BODY) -> bytes:
    """The request body; 413 past ``limit`` (64 KiB; checked on Content-Length and while
    reading)."""
    length = header(scope, b"content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise ApiError(400, f"invalid Content-Length {length[:40]!r}")
        if int(length) > limit:
            raise ApiError(413, f"body is larger than {limit} bytes")
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ApiError(400, "client disconnected before sending the body")
        chunk: bytes = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"body is larger than {limit} bytes")
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def loads(body: bytes) -> Any:
    """Parse a JSON body: UTF-8 without a byte-order mark (RFC 8259 section 8.1), else
    400; a string holding a lone UTF-16 surrogate (``"\\ud800"``: valid JSON syntax,
    but no Unicode text, so it could never be encoded into an answer, a rules file or
    Redis) is a 422 naming the field."""
    if not body.strip():
        raise ApiError(400, "malformed JSON: the body is empty")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"malformed JSON: the body is not UTF-8 (byte {exc.start}); "
                       "JSON bodies must be UTF-8 (RFC 8259)") from None
    if text.startswith("\ufeff"):
        raise ApiError(400, "malformed JSON: the body starts with a byte-order mark; "
                       "send UTF-8 without one (RFC 8259)")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"malformed JSON: {exc}"[:300]) from None
    if "\\u" in text:  # the only way to a lone surrogate: a \uD800-\uDFFF escape
        where = _surrogate(doc, "")
        if where is not None:
            where = where or "body"
            raise ApiError(422, f"{where}: a lone UTF-16 surrogate is not Unicode text (pair "
                           "it, or send the character itself)", field=where)
    return doc


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate(doc: Any, where: str) -> str | None:
    """The path (``checks[2].user``) of the first string in ``doc`` (key or value) that
    holds a lone surrogate; a bad key is named by its escaped form."""
    stack = [(doc, where)]
    while stack:
        obj, path = stack.pop()
        if isinstance(obj, str):
            if _SURROGATE.search(obj):
                return path
        elif isinstance(obj, dict):
            prefix = f"{path}." if path else ""
            for k in obj:
                if _SURROGATE.search(k):
                    return prefix + json.dumps(k)[1:-1]
            stack.extend((v, prefix + k) for k, v in reversed(obj.items()))
        elif isinstance(obj, list):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(obj))))
    return None


async def read_json(request: Request, limit: int = MAX_BODY) -> Any:
    return loads(await read_body(request.scope, request.receive, limit))


def if_match(request: Request) -> frozenset[int] | None:
    """The versions an ``If-Match`` header accepts (None: no header or ``*``)."""
    value = request.headers.get("if-match")
    if value is None or value.strip() == "*":
        return None
    out = set()
    for part in value.split(","):
        m = _ETAG.fullmatch(part)
        if m is not None:
            out.add(int(m[1]))
    return frozenset(out)


def etag(version: int) -> dict[str, str]:
    return {"ETag": f'"{version}"'}


def handle(handler: Any) -> Any:
    """A Starlette endpoint answering an :class:`ApiError` (or an invalid rule set) as
    its JSON error."""
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


def by_method(**handlers: Any) -> Any:
    """One endpoint for a path, dispatching on the method (so a 405 lists every method)."""
    wrapped = {method: handle(h) for method, h in handlers.items()}
    wrapped["HEAD"] = wrapped["GET"]

    async def endpoint(request: Request) -> Response:
        response: Response = await wrapped[request.method](request)
        return response

    return endpoint


async def http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    headers = exc.headers if isinstance(exc, HTTPException) else None
    return ApiError(status, f"{detail}: {request.method} {request.url.path}"[:300],
                    headers).response()


class RawEndpoint:
    """A raw ASGI handler as a Starlette route endpoint (a class instance, not a function,
    so Starlette calls it with scope/receive/send)."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handler(scope, receive, send)
