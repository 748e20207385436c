"""The Envoy configuration is reloaded when its files change; an invalid change is
refused whole and the previous configuration stays; counters survive a reload."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from stormguard import AsyncRateLimiter, MemoryStore
from stormguard.gateways import EnvoyChecker, load_envoy_config
from stormguard.gateways.rls import OK, OVER_LIMIT
from stormguard.gateways.watch import EnvoyConfigWatcher
from stormguard.testing import FakeClock

V1 = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"
V2 = V1 + "  - key: other\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
BAD = V2 + "  - key: broken\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"


async def _codes(c: EnvoyChecker, key: str, n: int) -> list[int]:
    return [(await c.check("d", [([(key, "v")], 0)])).code for _ in range(n)]


async def test_reload_applies_refuses_and_keeps_counters(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "stormguard")
    f = tmp_path / "d.yaml"
    f.write_text(V1)
    checker = EnvoyChecker(AsyncRateLimiter(MemoryStore(clock=FakeClock())),
                           load_envoy_config(tmp_path))
    watcher = EnvoyConfigWatcher(tmp_path, checker)
    assert await watcher.refresh() is False  # nothing changed
    assert await _codes(checker, "k", 2) == [OK, OK]
    f.write_text(V2)
    assert await watcher.refresh() is True
    assert await _codes(checker, "other", 2) == [OK, OVER_LIMIT]
    # the unchanged limit kept its counter: 1 left of 3
    assert await _codes(checker, "k", 2) == [OK, OVER_LIMIT]
    f.write_text(BAD)
    assert await watcher.refresh() is False
    assert "refused, the previous one stays" in caplog.text
    assert "fortnight" in caplog.text
    assert checker.config.lookup("d", [("other", "v")]) is not None  # V2 still in force
    assert checker.metrics.reloads == {"ok": 1, "error": 1}
    # a new file in the directory is picked up too
    (tmp_path / "e.yml").write_text("domain: e\n")
    f.write_text(V2)
    assert await watcher.refresh() is True
    assert sorted(checker.config.domains) == ["d", "e"]


async def test_the_watcher_polls_while_started(tmp_path: Path) -> None:
    f = tmp_path / "d.yaml"
    f.write_text(V1)
    checker = EnvoyChecker(AsyncRateLimiter("memory://"), load_envoy_config(f))
    watcher = EnvoyConfigWatcher(f, checker, poll_interval=0.01)
    await watcher.start()
    try:
        f.write_text(V2)
        deadline = time.monotonic() + 5
        while checker.config.lookup("d", [("other", "v")]) is None:
            assert time.monotonic() < deadline, "not reloaded in 5 s"
            # real time: the watcher stats real files from a thread every 10 ms
            await asyncio.sleep(0.01)
    finally:
        await watcher.stop()
    assert watcher._task is None


def test_serve_wires_the_server_and_the_watcher(tmp_path: Path) -> None:
    from stormguard.cli import _parser, serve_setup
    from stormguard.gateways.grpc import RateLimitServer

    (tmp_path / "d.yaml").write_text(V1)
    config, limiter = serve_setup(_parser().parse_args(
        ["serve", "--grpc-port", "0", "--envoy-config", str(tmp_path), "--envoy-headers"]))
    kinds = [type(c) for c in config.app.service.companions]
    assert kinds == [RateLimitServer, EnvoyConfigWatcher]
    server = config.app.service.companions[0]
    assert server.headers is True
    assert server.checker.config.lookup("d", [("k", "v")]) is not None
    limiter.store.close()


async def test_a_configmap_style_symlink_swap_is_picked_up(tmp_path: Path) -> None:
    """Kubernetes mounts a ConfigMap as ``name -> ..data/name`` with ``..data`` a symlink to
    a timestamped directory, and updates it by swapping ``..data``."""
    old, new = tmp_path / "..2026_01", tmp_path / "..2026_02"
    old.mkdir()
    new.mkdir()
    (old / "d.yaml").write_text(V1)
    (new / "d.yaml").write_text(V2)
    (tmp_path / "..data").symlink_to(old.name)
    (tmp_path / "d.yaml").symlink_to("..data/d.yaml")
    checker = EnvoyChecker(AsyncRateLimiter("memory://"), load_envoy_config(tmp_path))
    assert sorted(checker.config.domains) == ["d"]  # the hidden directories are not files
    watcher = EnvoyConfigWatcher(tmp_path, checker)
    (tmp_path / "..data_tmp").symlink_to(new.name)
    (tmp_path / "..data_tmp").rename(tmp_path / "..data")  # the atomic swap
    assert await watcher.refresh() is True
    assert checker.config.lookup("d", [("other", "v")]) is not None
