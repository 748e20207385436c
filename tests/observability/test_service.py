"""The service's side: ``GET /v1/top``, ``GET /v1/stats``, the dashboard's files, the
schema on ``/metrics``, the degraded start/stop log lines (a real Redis killed and
restarted) and ``serve --log-format json`` (a real process)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from stormguard import AsyncRateLimiter
from stormguard.service import create_app
from tests.redis_servers import free_port, start_redis

ROOT = Path(__file__).resolve().parents[2]
RULES = [
    {"name": "login", "scope": "user", "limit": 2, "window": 60},
    {"name": "dry", "scope": "ip", "limit": 1, "window": 60, "shadow": True},
]


def client(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
                             base_url="http://sg")


async def test_top_reports_the_most_denied_keys_with_their_rules() -> None:
    app = create_app(rules=RULES, top_keys=100)
    async with client(app) as c:
        for user, n in [("mallory", 12), ("bob", 4), ("alice", 1)]:
            for _ in range(n):
                await c.post("/v1/check", json={"user": user, "ip": "10.0.0.1"})
        top = (await c.get("/v1/top", params={"n": 2})).json()
        # a check the enforced rule denies stops there: the shadow rule sees only the five
        # that passed (one allowed, four it would have denied)
        assert [(k["key"], k["count"], k["rules"]) for k in top["keys"]] == [
            ("user:mallory", 10, ["login"]), ("ip:10.0.0.1", 4, ["dry"])]
        assert top["capacity"] == 100
        assert top["held"] == 3
        assert top["denials"] == 10 + 4 + 2
        assert len((await c.get("/v1/top")).json()["keys"]) == 3  # n defaults to 20
        for bad in ("0", "1001", "x", "-1", "2.5"):
            r = await c.get("/v1/top", params={"n": bad})
            assert r.status_code == 422
            assert r.json()["field"] == "n"


async def test_top_stats_and_metrics_agree_on_a_batch() -> None:
    """1,000 checks of 50 users in one batch (limit 2 each): the top keys, the dashboard's
    figures and the schema's counters all count the same 900 denials."""
    app = create_app(rules=RULES[:1], top_keys=100)
    checks = [{"key": f"user:{i % 50}", "rule": "login"} for i in range(1000)]
    async with client(app) as c:
        r = await c.post("/v1/check/batch", json={"checks": checks})
        assert sum(not x["allowed"] for x in r.json()["results"]) == 900
        top = (await c.get("/v1/top", params={"n": 100})).json()
        stats = (await c.get("/v1/stats")).json()
        text = (await c.get("/metrics")).text
    assert top["denials"] == 900
    assert top["held"] == 50
    assert sum(k["count"] for k in top["keys"]) == 900
    assert {k["count"] for k in top["keys"]} == {18}
    assert stats["rules"]["login"] == {"allowed": 100, "denied": 900, "shadow_denied": 0}
    assert 'stormguard_limiter_decisions_total{name="limiter",result="denied",' \
           'rule="login"} 900.0' in text


def test_top_keys_is_validated_by_name() -> None:
    from stormguard import ConfigError

    for bad in (0, -1, 2.5, "10", 10**7):
        with pytest.raises(ConfigError, match="top_keys"):
            create_app(rules=RULES, top_keys=bad)  # type: ignore[arg-type]


async def test_stats_metrics_and_dashboard_files() -> None:
    app = create_app(rules=RULES)
    async with client(app) as c:
        before = (await c.get("/v1/stats")).json()
        for _ in range(5):
            await c.post("/v1/check", json={"user": "u", "ip": "10.0.0.2"})
        stats = (await c.get("/v1/stats")).json()
        assert stats["checks"] - before["checks"] == 5
        assert stats["rules"]["login"]["denied"] - before["rules"].get(
            "login", {"denied": 0})["denied"] == 3
        assert stats["top"][0]["key"] in ("ip:10.0.0.2", "user:u")
        assert stats["store"]["on_error"] == "allow"
        metrics = (await c.get("/metrics")).text
        assert 'stormguard_limiter_decisions_total{name="limiter",result="denied",' \
               'rule="login"}' in metrics
        page = await c.get("/dashboard")
        assert page.status_code == 200
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert "http" not in page.text.replace("http-equiv", "")  # nothing from elsewhere
        for name, media in [("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")]:
            r = await c.get(f"/dashboard/assets/{name}")
            assert r.status_code == 200
            assert r.headers["content-type"].startswith(media)
            assert "//cdn" not in r.text
            assert "https://" not in r.text
        for bad in ("dashboard.html", "..%2Fapp.py", "x.js"):
            assert (await c.get(f"/dashboard/assets/{bad}")).status_code == 404


async def test_stats_list_breakers_and_queues_of_the_process() -> None:
    from stormguard import CircuitBreaker
    from stormguard.observability import metrics

    class Queue:  # a deferred queue's stats() shape: pending, in_flight, dead
        name = "emails"

        def stats(self) -> dict[str, int]:
            return {"pending": 4, "in_flight": 1, "dead": 0}

    class DownQueue:  # its store is down: stats() raises
        name = "sms-outbox"

        def stats(self) -> dict[str, int]:
            raise OSError("queue store down")

    queue, down = Queue(), DownQueue()
    metrics.track(queue, "queue")
    metrics.track(down, "queue")
    breaker = CircuitBreaker(name="sms-provider")
    breaker.force_open()
    from stormguard.overload import Shedder

    shedder = Shedder(10, name="edge-shedder")
    app = create_app(rules=RULES)
    async with client(app) as c:
        stats = (await c.get("/v1/stats")).json()
    assert {"name": "emails", "kind": "queue", "depth": 4} in stats["queues"]
    assert {"name": "sms-outbox", "kind": "queue", "depth": None} in stats["queues"]
    assert {"name": "edge-shedder", "kind": "shedder", "depth": 0} in stats["queues"]
    assert {"name": "sms-provider", "state": "open", "kind": "policy"} in stats["breakers"]
    del queue, down, breaker, shedder


@pytest.mark.slow
async def test_one_log_line_when_degraded_starts_and_one_when_it_stops(
        caplog: pytest.LogCaptureFixture) -> None:
    """A real Redis, SIGKILLed then restarted on its port: one WARNING when checks start
    being answered by on_error, none while they stay degraded, one when the store
    answers again (with how many were degraded)."""
    server = start_redis()
    try:
        limiter = AsyncRateLimiter(server.url, breaker_cooldown=0.05, timeout=0.2)
        app = create_app(limiter, RULES)
        caplog.set_level(logging.WARNING, logger="stormguard.service")
        async with client(app) as c:
            async def check() -> dict[str, object]:
                r = await c.post("/v1/check", json={"user": "u1"})
                assert r.status_code == 200  # an outage is never a 500
                body: dict[str, object] = r.json()
                return body

            assert (await check())["degraded"] is False
            server.stop()
            for _ in range(5):
                assert (await check())["degraded"] is True
            started = [r for r in caplog.records if getattr(r, "event", "") == "degraded_start"]
            assert len(started) == 1
            assert "on_error=allow" in started[0].getMessage()
            stats = (await c.get("/v1/stats")).json()
            assert stats["degraded_now"] is True
            store_breakers = [b for b in stats["breakers"] if b["kind"] == "store"]
            assert store_breakers == [{"name": f"redis:127.0.0.1:{server.port}",
                                       "state": "open", "kind": "store"}]
            server.restart()
            deadline = time.monotonic() + 10
            while (await check())["degraded"] is True:
                assert time.monotonic() < deadline, "the store never answered again"
                await asyncio.sleep(0.05)  # real time: the store's breaker cool-down
            await check()
            stopped = [r for r in caplog.records if getattr(r, "event", "") == "degraded_stop"]
            assert len(stopped) == 1
            assert getattr(stopped[0], "degraded_decisions", 0) >= 5
            assert len([r for r in caplog.records
                        if getattr(r, "event", "") == "degraded_start"]) == 1
        await limiter.aclose()
    finally:
        server.stop()


@pytest.mark.slow
def test_serve_log_format_json_writes_one_json_object_per_line() -> None:
    """A real ``stormguard serve --log-format json`` process: every line it writes to
    stderr while starting, serving and stopping is one JSON object."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stormguard", "serve", "--port", str(port),
         "--log-format", "json"], stderr=subprocess.PIPE, env=env, cwd=ROOT)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + 20
        while not any("running on" in ln.lower() for ln in lines):
            assert time.monotonic() < deadline, lines
            if sel.select(timeout=0.5):  # real time: a real server process starting
                line = proc.stderr.readline().decode()
                assert line, f"serve exited: {lines}"
                lines.append(line)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/check",
                       json={"key": "k", "limit": 1, "window": 60}, timeout=5)
        assert r.status_code == 200
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    lines += err.decode().splitlines()
    records = [json.loads(ln) for ln in lines if ln.strip()]
    assert {"ts", "level", "logger", "message"} <= set(records[0])
    loggers = {r["logger"] for r in records}
    assert "stormguard.service" in loggers
    assert "uvicorn.error" in loggers
    assert not any("color_message" in r for r in records)
    (access,) = [r for r in records if r["logger"] == "uvicorn.access"]
    assert (access["method"], access["path"], access["status"]) == ("POST", "/v1/check", 200)
    assert proc.returncode == 0
