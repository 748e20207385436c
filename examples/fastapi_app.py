"""FastAPI behind stormguard's ASGI middleware.

Run it:   uvicorn examples.fastapi_app:app          (or: python examples/fastapi_app.py)
Try it:   for i in 1 2 3 4 5 6; do curl -si -H 'X-User: 42' localhost:8000/search | head -1; done
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from stormguard import AsyncRateLimiter
from stormguard.middleware import RateLimitMiddleware, Scope

RULES = Path(__file__).with_name("rules.yaml")
API_KEY_TIERS = {"key-free-1": "free", "key-pro-1": "pro"}  # your key store


def user_id(scope: Scope) -> str | None:
    """Stand-in for your authentication: the user id of the request, or None.
    (Never trust a client-supplied header in production; read your verified session.)"""
    for name, value in scope["headers"]:
        if name == b"x-user":
            return value.decode("latin-1")
    return None


def tier(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"x-api-key":
            return API_KEY_TIERS.get(value.decode("latin-1"))
    return None


def create_app(limiter: AsyncRateLimiter | None = None) -> FastAPI:
    app = FastAPI(title="stormguard example")

    @app.get("/search")
    async def search(q: str = "") -> dict[str, object]:
        return {"query": q, "results": []}

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    app.add_middleware(
        RateLimitMiddleware,
        limiter=limiter or AsyncRateLimiter("memory://", on_error="allow"),
        rules=RULES,
        user=user_id,
        tier=tier,
        api_key_header="x-api-key",
        trusted_proxies=["127.0.0.1"],  # your load balancers; X-Forwarded-For only from them
    )
    return app


app = create_app()

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=8000)
