"""Flask behind stormguard's WSGI middleware.

Run it:   python examples/flask_app.py
Try it:   for i in 1 2 3 4 5 6; do curl -si -H 'X-User: 42' localhost:5000/search | head -1; done
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flask import Flask, jsonify

from stormguard import RateLimiter
from stormguard.middleware import WSGIRateLimitMiddleware

RULES = Path(__file__).with_name("rules.yaml")


def user_id(environ: dict[str, Any]) -> str | None:
    """Stand-in for your authentication (read your verified session in production)."""
    user: str | None = environ.get("HTTP_X_USER")
    return user


def create_app(limiter: RateLimiter | None = None) -> Flask:
    app = Flask(__name__)

    @app.get("/search")
    def search() -> Any:
        return jsonify(results=[])

    @app.get("/")
    def index() -> Any:
        return jsonify(hello="world")

    app.wsgi_app = WSGIRateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app,
        limiter=limiter or RateLimiter("memory://", on_error="allow"),
        rules=RULES,
        user=user_id,
        trusted_proxies=["127.0.0.1"],
    )
    return app


app = create_app()

if __name__ == "__main__":
    app.run(host="127.0.0.1", port=5000)
