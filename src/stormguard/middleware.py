"""Rate-limit middleware: pure ASGI (FastAPI, Starlette, ...) and WSGI (Flask, Django, ...).

Both take a limiter and rules (a list, a :class:`~stormguard.ratelimit.rules.RuleSet` or a rules
file path), build the request attributes (user id from a callable, API key from a header,
the client IP, method, path, tier), check every matching rule in one go and answer a
denied request with ``429``, a JSON body, ``Retry-After`` and the rate-limit headers.
Allowed responses carry the rate-limit headers too.

**Client IP.** The socket peer address, unless the peer is a configured trusted proxy
(``trusted_proxies=["10.0.0.0/8", "127.0.0.1"]``): then ``X-Forwarded-For`` is walked
from the right, skipping trusted hops, and the first untrusted address is the client.
A client that is not a trusted proxy cannot change its address by sending the header.
Under uvicorn run the app with ``--no-proxy-headers``: uvicorn's default rewrites the
client address from ``X-Forwarded-For`` (for connections from 127.0.0.1) before the
middleware sees it; a warning is logged when such a rewrite is detected.

**One store per process.** ``memory://`` counts in the process: under N workers
(``gunicorn -w N``, ``uvicorn --workers N``) every limit admits N times its requests.
Use ``redis://...`` for several workers; a warning is logged when it can be detected.

**Store failures** follow the limiter's ``on_error`` (allow / deny / local); the limiter
turns every :class:`~stormguard.StorageError` into a degraded decision, so a storage
outage never becomes a 500.

**Blocking limiters.** The ASGI middleware takes an
:class:`~stormguard.AsyncRateLimiter`; a blocking :class:`~stormguard.RateLimiter` is
accepted only over ``memory://`` (it never blocks) and refused with a
:class:`~stormguard.ConfigError` naming ``limiter`` over any other store, where every
check would block the event loop for up to the store's timeout.

**Exempt paths.** ``exempt=["/healthz", "/metrics", "/docs*"]`` (globs on the path): such
requests are neither checked nor given rate-limit headers.

**X-RateLimit-Reset** is in seconds from now (the default) or, with
``reset_header="epoch"``, an epoch timestamp in whole seconds, rounded up (as
Flask-Limiter and slowapi send it). ``RateLimit``'s ``t`` and ``Retry-After`` stay seconds.

**Load shedding.** :class:`LoadSheddingMiddleware` (ASGI) and
:class:`WSGILoadSheddingMiddleware` (thread-pool WSGI servers) protect the whole process
from overload: requests are tiered ("critical", "degraded", "sheddable") by path
patterns, a callable or a trusted proxy's header, and past an adaptive concurrency limit
the least important are answered ``503`` at once (docs/overload.md).
"""

from __future__ import annotations

from stormguard.integrations.asgi import RateLimitMiddleware, Scope
from stormguard.integrations.clientip import ClientIP
from stormguard.integrations.shedding import LoadSheddingMiddleware, WSGILoadSheddingMiddleware
from stormguard.integrations.wsgi import WSGIRateLimitMiddleware

__all__ = ["ClientIP", "LoadSheddingMiddleware", "RateLimitMiddleware", "Scope",
           "WSGILoadSheddingMiddleware", "WSGIRateLimitMiddleware"]
