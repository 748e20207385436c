"""A real ``stormguard serve`` process for the client tests (module-scoped per test file
would start several; one per session is enough: every test uses its own keys)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_servers import free_port
from tests.service.helpers import wait_healthy

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "client-test-token"
"""The service's admin token (``ServiceStore(token=...)`` for ``reset``)."""
RULES = """rules:
  - {name: three, scope: user, limit: 3, window: 1h, algorithm: fixed_window}
  - {name: big, scope: user, limit: 1000000, window: 1h, algorithm: fixed_window}
  - {name: bucket, scope: user, limit: 5, window: 1h, algorithm: token_bucket, burst: 5}
"""


@pytest.fixture(scope="session")
def service_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    rules = tmp_path_factory.mktemp("client-serve") / "rules.yaml"
    rules.write_text(RULES)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "STORMGUARD_ADMIN_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stormguard", "serve", "--port", str(port), "--rules",
         str(rules), "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        yield base
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


@pytest.fixture
def down_url() -> str:
    """A loopback port where nothing listens: connection refused."""
    return f"http://127.0.0.1:{free_port()}"
