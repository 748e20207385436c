"""Who is being limited and how the service is doing: ``GET /v1/top`` (the most-denied
keys), ``GET /v1/stats`` (the dashboard's figures) and ``GET /dashboard`` (one page, its
assets shipped inside the package: no CDN, works offline; it polls ``/v1/stats``)."""

from __future__ import annotations

import time
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

from stormguard.observability import metrics as _metrics
from stormguard.service.base import ServiceBase
from stormguard.service.http import ApiError, json_response

__all__ = ["ASSETS", "MAX_TOP", "ObserveEndpoints"]

MAX_TOP = 1000
ASSETS = {"dashboard.js": "text/javascript; charset=utf-8",
          "dashboard.css": "text/css; charset=utf-8"}
_QUEUE_KINDS = ("queue", "shaper", "shedder")  # waiting work: jobs, paced calls, requests
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _asset(name: str) -> bytes:
    return resources.files("stormguard.service").joinpath("static", name).read_bytes()


def _top_n(request: Request, default: int = 20) -> int:
    raw = request.query_params.get("n")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_TOP:
        raise ApiError(422, f"n: must be an integer from 1 to {MAX_TOP} (got {raw!r:.40})",
                       field="n")
    return int(raw)


class ObserveEndpoints(ServiceBase):
    """``/v1/top``, ``/v1/stats``, ``/dashboard`` and its assets."""

    async def top_keys(self, request: Request) -> Response:
        n = _top_n(request)
        return json_response({
            "keys": [t.to_dict() for t in self.top.top(n)],
            "held": len(self.top), "capacity": self.top.capacity,
            "denials": self.top.total})

    def stats(self) -> dict[str, object]:
        """The dashboard's figures: cumulative counters (the page turns them into rates)."""
        rules: dict[str, dict[str, int]] = {}
        for (rule, result), n in self.metrics.checks.items():
            rules.setdefault(rule, {"allowed": 0, "denied": 0, "shadow_denied": 0})[result] = n
        for rule, n in self.metrics.shadow_denials.items():
            rules.setdefault(rule, {"allowed": 0, "denied": 0, "shadow_denied": 0})[
                "shadow_denied"] = n
        store = self.limiter.store
        machines = getattr(store, "breaker_machines", None)
        breakers = [{"name": b.name, "state": b.state, "kind": "store"}
                    for b in (machines() if machines is not None else ())]
        breakers += [{"name": b.name, "state": b.state, "kind": "policy"}
                     for b in _metrics.tracked("breaker")]
        queues = []
        for kind in _QUEUE_KINDS:
            for q in _metrics.tracked(kind):
                try:  # a queue on a store that is down: no depth, never a 500
                    stats = q.stats() if hasattr(q, "stats") else {}
                except Exception:
                    stats = {}
                depth = next((stats[k] for k in ("pending", "waiting", "depth")
                              if isinstance(stats.get(k), int | float)), None)
                queues.append({"name": str(getattr(q, "name", kind)), "kind": kind,
                               "depth": depth})
        return {
            "time": time.time(),
            "checks": sum(self.metrics.checks.values()),
            "rules": dict(sorted(rules.items())),
            "degraded": self.metrics.degraded,
            "degraded_now": self._degraded_since is not None,
            "store": {"name": str(getattr(store, "name", type(store).__name__)),
                      "kind": type(store).__name__,
                      "on_error": self.limiter.on_error},
            "breakers": breakers,
            "queues": queues,
            "top": [t.to_dict() for t in self.top.top(10)],
            "rules_version": self.source.current.version,
        }

    async def stats_endpoint(self, request: Request) -> Response:
        return json_response(self.stats(), headers={"cache-control": "no-store"})

    async def dashboard(self, request: Request) -> Response:
        return Response(_asset("dashboard.html"), 200, {
            "content-security-policy": _CSP, "cache-control": "no-store",
            "x-content-type-options": "nosniff"}, "text/html; charset=utf-8")

    async def dashboard_asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        media = ASSETS.get(name)
        if media is None:
            raise ApiError(404, f"no dashboard asset {name!r:.80}")
        return Response(_asset(name), 200, {"x-content-type-options": "nosniff",
                                            "cache-control": "max-age=300"}, media)
