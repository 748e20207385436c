"""Real ``stormguard serve`` processes for the gateway tests: free loopback ports, stopped
by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.redis_servers import free_port

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = Path(__file__).parent / "envoy_configs"
RULES = """\
rules:
  - name: per-user
    scope: user
    limit: 3
    window: 60
    algorithm: fixed_window
  - name: search-per-ip
    scope: ip
    endpoint: "GET /search*"
    limit: 2
    window: 60
    algorithm: fixed_window
"""


@dataclass
class Serve:
    proc: subprocess.Popen[str]
    port: int
    grpc_port: int | None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> str:
        """SIGTERM by PID (a clean shutdown), then the process's stderr."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            _, err = self.proc.communicate(timeout=5)
        return err


def serve_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def start_serve(args: list[str], *, grpc: bool = True, env: dict[str, str] | None = None
                ) -> Serve:
    port = free_port()
    grpc_port = free_port() if grpc else None
    argv = [sys.executable, "-m", "stormguard", "serve", "--port", str(port), *args]
    if grpc_port is not None:
        argv += ["--grpc-port", str(grpc_port)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env or serve_env())
    s = Serve(proc, port, grpc_port)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited early: {s.stop()}")
        try:
            if httpx.get(f"{s.base}/healthz", timeout=0.5).status_code == 200:
                return s
        except httpx.TransportError:
            pass
        time.sleep(0.05)  # real time: waiting for a real process to bind its port
    s.stop()
    raise AssertionError("serve did not become healthy in 20 s")


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return path


@pytest.fixture
def serve(rules_file: Path) -> Iterator[Callable[..., Serve]]:
    started: list[Serve] = []

    def make(*args: str, grpc: bool = True, **kw: Any) -> Serve:
        s = start_serve(["--rules", str(rules_file), *args], grpc=grpc, **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()
