"""Shared test helpers for the service tests."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from typing import Any

import httpx

from stormguard import ConfigError, Decision, Rule, StorageError, Store
from stormguard.testing import FakeClock

RULES = [
    {"name": "search", "scope": "user", "endpoint": "GET /search*", "limit": 3, "window": 60,
     "algorithm": "fixed_window"},
    {"name": "per-ip", "scope": "ip", "limit": 100, "window": 60},
    {"name": "dry", "scope": "api_key", "limit": 1, "window": 60, "shadow": True},
]
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class DownStore(Store):
    """A store whose backend is down: every call raises StorageError."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.calls = 0

    def _fail(self) -> StorageError:
        self.calls += 1
        return StorageError("backend down (test)")

    def hit(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        raise self._fail()

    def peek(self, key: str, rule: Rule, cost: int = 1) -> Decision:
        raise self._fail()

    def hit_all(self, key: str, rules: Sequence[Rule], cost: int = 1) -> Decision:
        raise self._fail()

    def reset(self, key: str, rule: Rule | Sequence[Rule]) -> None:
        raise self._fail()

    def ping(self) -> bool:
        raise self._fail()


class RefusingStore(DownStore):
    """A store that cannot enforce the rules it is given (ConfigError, as RedisStore
    raises for a rule too large for its arithmetic)."""

    def _fail(self) -> StorageError:
        self.calls += 1
        raise ConfigError("rule", "x", "too large for this store (test)")


def wait_healthy(base: str, proc: subprocess.Popen[Any]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited early: {proc.communicate()}")
        try:
            if httpx.get(f"{base}/healthz", timeout=0.5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)  # waiting for a real process to bind its port
    raise AssertionError("serve did not become healthy in 20 s")
