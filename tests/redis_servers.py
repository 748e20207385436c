"""Private redis-server processes for tests: free loopback ports, stopped by PID.

Never touches a server the developer already runs (6379 is never used).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import redis

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (whose +10000 bus port is free too, for cluster nodes)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port == 6379 or port + 10000 > 65535:
            continue
        with socket.socket() as s2:
            try:
                s2.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair found")


@dataclass
class RedisServer:
    port: int
    proc: subprocess.Popen[bytes]
    dir: str
    cluster: bool = False
    extra: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def stop(self) -> None:
        """SIGKILL by PID (a crash, as far as clients can tell) and reap."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP: the server keeps its socket open but never answers (a hung Redis)."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self) -> None:
        """Start a fresh process on the same port (after :meth:`stop`)."""
        self.stop()
        fresh = start_redis(self.port, cluster=self.cluster, extra=self.extra, workdir=self.dir)
        self.proc = fresh.proc


def _wait_ready(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:  # the probe's client is closed: its socket never waits for the collector
            with redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.5) as probe:
                if probe.ping():
                    return
        except redis.RedisError:
            pass
        time.sleep(0.02)  # real time: waiting for a real redis-server to accept
    raise RuntimeError(f"redis-server on port {port} did not start")


def start_redis(port: int | None = None, *, cluster: bool = False, extra: list[str] | None = None,
                workdir: str | None = None) -> RedisServer:
    port = port or free_port()
    assert port != 6379, "tests never use the developer's server on 6379"
    workdir = workdir or tempfile.mkdtemp(prefix=f"sg-redis-{port}-")
    extra = list(extra or [])
    args = [
        REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no", "--dir", workdir, "--daemonize", "no",
        "--protected-mode", "no", "--loglevel", "warning", "--logfile", "",
    ]
    if cluster:
        args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                 "--cluster-node-timeout", "2000"]
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(workdir, f"nodes-{port}.conf"))
    args += extra
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = RedisServer(port, proc, workdir, cluster, extra)
    try:
        _wait_ready(port)
    except Exception:
        server.stop()
        raise
    return server


@dataclass
class RedisCluster:
    nodes: list[RedisServer]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def start_cluster(masters: int = 3) -> RedisCluster:
    """A ``masters``-node cluster with the 16384 slots split evenly, no replicas."""
    nodes = [start_redis(cluster=True) for _ in range(masters)]
    try:
        clients = [n.client() for n in nodes]
        per = 16384 // masters
        for i, c in enumerate(clients):
            lo = i * per
            hi = 16383 if i == masters - 1 else (i + 1) * per - 1
            c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        for c in clients[1:]:
            c.execute_command("CLUSTER", "MEET", "127.0.0.1", nodes[0].port)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            infos = [c.execute_command("CLUSTER", "INFO") for c in clients]
            texts = [i.decode() if isinstance(i, bytes) else str(i) for i in infos]
            if all("cluster_state:ok" in t and f"cluster_known_nodes:{masters}" in t
                   for t in texts):
                return RedisCluster(nodes)
            time.sleep(0.05)  # real time: real nodes converging
        raise RuntimeError("cluster did not converge")
    except Exception:
        for n in nodes:
            n.stop()
        raise
