"""What ``stormguard serve`` and the middleware say and do at start-up: the store and
rules in force, never the sample rules into a shared Redis unless asked, no proxy
headers, and warnings for deployments that weaken the limits."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from stormguard import AsyncRateLimiter, MemoryStore, RateLimiter
from stormguard.cli import EXIT_LISTEN, _parser, main, redact, serve_setup
from stormguard.integrations.deployment import worker_count
from stormguard.middleware import RateLimitMiddleware, WSGIRateLimitMiddleware
from stormguard.testing import FakeClock

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_RULES = ROOT / "examples" / "rules.yaml"
RULE = [{"name": "per-ip", "scope": "ip", "limit": 5, "window": 60}]


async def _started(argv: list[str]) -> Any:
    """The service ``stormguard serve ARGV`` would run, started (its lifespan's start)."""
    config, _limiter = serve_setup(_parser().parse_args(["serve", *argv]))
    service = config.app.service
    await service.start()
    return service


async def test_serve_on_redis_without_rules_seeds_nothing(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "stormguard")
    service = await _started(["--store", redis_url])
    try:
        assert len(service.source.current) == 0
    finally:
        await service.stop()
    raw = redis.Redis.from_url(redis_url)
    assert not raw.exists("stormguard:rules")  # the sample rules were not made the fleet's
    log = caplog.text
    assert f"store {redis_url}" in log
    assert "not seeded" in log
    assert "--sample-rules" in log  # says how to ask for them
    assert "no rules in Redis" in log
    # asked explicitly: seeded
    service = await _started(["--store", redis_url, "--sample-rules"])
    await service.stop()
    assert raw.exists("stormguard:rules")
    raw.close()


async def test_serve_on_redis_seeds_from_the_rules_file(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "stormguard")
    service = await _started(["--store", redis_url, "--rules", str(EXAMPLE_RULES)])
    assert len(service.source.current) == 4
    await service.stop()
    assert f"{EXAMPLE_RULES} seeds them" in caplog.text


async def test_serve_logs_the_store_and_rules_in_force(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "stormguard")
    serve_setup(_parser().parse_args(["serve"]))
    assert "store memory://" in caplog.text
    assert "packaged SAMPLE rules" in caplog.text
    assert "--rules FILE" in caplog.text
    caplog.clear()
    serve_setup(_parser().parse_args(["serve", "--rules", str(EXAMPLE_RULES)]))
    assert f"rules from {EXAMPLE_RULES} (4 rules)" in caplog.text
    assert "SAMPLE" not in caplog.text
    assert main(["serve", "--rules", str(EXAMPLE_RULES), "--sample-rules"]) == 2


def test_serve_never_enables_proxy_headers() -> None:
    """uvicorn's default (--proxy-headers, trusting 127.0.0.1) rewrites the client
    address from X-Forwarded-For before any app code runs."""
    config, _ = serve_setup(_parser().parse_args(["serve"]))
    assert config.proxy_headers is False


def test_redact_hides_passwords() -> None:
    assert redact("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert redact("rediss://user:pw@h/1") == "rediss://user:***@h/1"
    assert redact("redis://user@h") == "redis://user@h"
    assert redact("memory://") == "memory://"


def test_port_in_use_is_not_the_store_exit_code() -> None:
    """A real ``stormguard serve`` process on a port that is taken: exit 4, not 3 (3
    means the store failed). End-to-end: the bind failure happens in uvicorn."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "stormguard", "serve", "--port",
                            str(port)], capture_output=True, text=True, timeout=60,
                           check=False, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert p.returncode == EXIT_LISTEN == 4, p.stderr
    assert "address already in use" in p.stderr
    assert f"could not serve on 127.0.0.1:{port}" in p.stderr
    assert "packaged SAMPLE rules" in p.stderr  # the start-up lines reach stderr


def test_version_and_subcommand_usage(capsys: pytest.CaptureFixture[str]) -> None:
    from stormguard import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"stormguard {__version__}"
    assert main(["serve", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: stormguard serve")
    assert "unrecognized arguments: --bogus" in err
    assert main(["rules", "validate", "x.yaml", "--bogus"]) == 2
    assert capsys.readouterr().err.startswith("usage: stormguard rules validate")


def test_check_on_memory_store_says_each_run_is_new(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "k", "1/minute", "--store", "memory://"]) == 0
    assert "new, empty store in each run" in capsys.readouterr().err


# -- the middleware ----------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "env", "expected"), [
    (["gunicorn", "-w", "2", "app:app"], {}, 2),
    (["gunicorn", "--workers=3", "app:app"], {}, 3),
    (["/venv/bin/uvicorn", "app:app", "--workers", "4"], {}, 4),
    (["gunicorn", "app:app"], {"GUNICORN_CMD_ARGS": "--bind :80 -w 5"}, 5),
    (["python", "app.py"], {"WEB_CONCURRENCY": "6"}, 6),
    (["python", "app.py"], {}, None),
    (["pytest", "-w", "2"], {}, None),
])
def test_worker_count(argv: list[str], env: dict[str, str], expected: int | None) -> None:
    assert worker_count(env, argv) == expected


def test_memory_store_under_several_workers_warns(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("WEB_CONCURRENCY", "2")
    RateLimitMiddleware(lambda *a: None, limiter=AsyncRateLimiter("memory://"),  # type: ignore[arg-type]
                        rules=RULE)
    assert "admits up to 2x its requests" in caplog.text
    assert "redis://" in caplog.text
    caplog.clear()
    monkeypatch.delenv("WEB_CONCURRENCY")
    app = WSGIRateLimitMiddleware(lambda environ, start: [b"ok"],
                                  limiter=RateLimiter(MemoryStore(clock=FakeClock())),
                                  rules=RULE)
    assert caplog.text == ""
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": "1.2.3.4",
               "wsgi.multiprocess": True}  # gunicorn -w 2 sets it
    for _ in range(2):
        app(environ, lambda status, headers, exc_info=None: None)
    assert caplog.text.count("memory store under several worker processes") == 1


async def test_client_address_rewritten_by_uvicorn_proxy_headers_warns(
        caplog: pytest.LogCaptureFixture) -> None:
    """Behind uvicorn's default proxy headers the scope's client is already taken from
    X-Forwarded-For: a client can rotate its address. Not preventable by the middleware,
    but detectable: the peer is one of the header's hops."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    async def home(request: object) -> PlainTextResponse:
        return PlainTextResponse("hi")

    limited = RateLimitMiddleware(Starlette(routes=[Route("/", home)]),
                                  limiter=AsyncRateLimiter(MemoryStore(clock=FakeClock())),
                                  rules=RULE)
    app = ProxyHeadersMiddleware(limited, trusted_hosts="127.0.0.1")  # uvicorn's default
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as c:
        codes = [(await c.get("/", headers={"X-Forwarded-For": f"10.0.0.{i}"})).status_code
                 for i in range(8)]
    assert codes == [200] * 8  # the rotation works: that is the hazard
    assert caplog.text.count("--no-proxy-headers") == 1
    assert limited.client_ip.rewritten
