"""deploy/: the Dockerfile, the compose file and the Kubernetes manifests cannot be built
here, so they are held to the tested command line: the Dockerfile's own ``serve``
invocation runs (with its environment) as a real process, and the other files must use
the same command, real environment variables, ports and probe paths."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import grpc
import httpx
import pytest
import yaml
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from stormguard.cli import _parser
from stormguard.gateways import load_envoy_config, loads_envoy_config
from stormguard.ratelimit.rules import RuleSet
from tests.gateways.conftest import ROOT, serve_env
from tests.redis_servers import free_port

DEPLOY = ROOT / "deploy"
CLI_SOURCE = (ROOT / "src" / "stormguard" / "cli" / "__init__.py").read_text()
SERVE_ENV = set(re.findall(r'_env\("(STORMGUARD_[A-Z_]+)"', CLI_SOURCE))


def healthcheck() -> list[str]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    m = re.search(r"^HEALTHCHECK .*? CMD (\[.*\])$", text, re.MULTILINE)
    assert m is not None
    cmd: list[str] = json.loads(m[1])
    return cmd


def dockerfile() -> tuple[list[str], dict[str, str], dict[str, str], str]:
    """The runtime stage's CMD, ENV, COPY (destination -> source) and USER."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    stage = text.split("\nFROM ")[-1]
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", stage, re.MULTILINE)[1])  # type: ignore[index]
    env: dict[str, str] = {}
    for line in re.findall(r"^ENV (.*)$", stage, re.MULTILINE):
        env.update(dict(re.findall(r"(\w+)=(\S+)", line)))
    copies = {dst: src for src, dst in re.findall(r"^COPY (?!--)(\S+) (\S+)$", stage,
                                                 re.MULTILINE)}
    user = re.search(r"^USER (\S+)$", stage, re.MULTILINE)[1]  # type: ignore[index]
    return cmd, env, copies, user


def test_dockerfile_shape() -> None:
    cmd, env, copies, user = dockerfile()
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.MULTILINE)
    assert user == "10001"  # not root
    assert cmd[:2] == ["stormguard", "serve"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert set(env) - {"PYTHONUNBUFFERED"} <= SERVE_ENV, "only real serve variables"
    assert copies["/etc/stormguard/rules.yaml"] == "examples/rules.yaml"
    _parser().parse_args(cmd[1:])  # the flags exist


@pytest.mark.slow
def test_the_dockerfile_command_runs() -> None:
    """The Dockerfile's CMD with its ENV, paths mapped to the files it COPYs, on free
    ports; on 127.0.0.1 instead of 0.0.0.0 (tests bind loopback only)."""
    cmd, env, copies, _ = dockerfile()
    run_env = serve_env()
    for name, value in env.items():
        run_env[name] = str(ROOT / copies[value]) if value in copies else value
    port, grpc_port = free_port(), free_port()
    run_env["STORMGUARD_PORT"], run_env["STORMGUARD_GRPC_PORT"] = str(port), str(grpc_port)
    argv = [a if a != "0.0.0.0" else "127.0.0.1" for a in cmd[2:]]
    proc = subprocess.Popen([sys.executable, "-m", "stormguard", "serve", *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=run_env)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "not healthy in 20 s"
            try:
                if httpx.get(f"{base}/healthz", timeout=0.5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)  # real time: waiting for a real process to bind
        ready = httpx.get(f"{base}/readyz").json()
        assert ready["status"] == "ready"
        assert ready["rules"] == len(RuleSet.load(ROOT / "examples" / "rules.yaml"))
        stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(
            f"127.0.0.1:{grpc_port}"))
        d = ratelimit_pb2.RateLimitDescriptor
        answer = stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="stormguard", descriptors=[
            d(entries=[d.Entry(key="remote_address", value="203.0.113.9")])]), timeout=10)
        assert answer.statuses[0].current_limit.requests_per_unit == 60  # anonymous-per-ip
        # the image's HEALTHCHECK command, with the container's environment
        probe = healthcheck()
        assert probe[0] == "python"
        subprocess.run([sys.executable, *probe[1:]], env=run_env, check=True, timeout=30)
    finally:
        os.kill(proc.pid, signal.SIGTERM)  # the Dockerfile's STOPSIGNAL
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err


def _real_serve_env(env: dict[str, Any]) -> None:
    unknown = set(env) - SERVE_ENV
    assert not unknown, f"not serve variables: {unknown}"


def test_compose_runs_the_same_command() -> None:
    cmd, _, _, _ = dockerfile()
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    sg = doc["services"]["stormguard"]
    assert sg["command"] == cmd
    assert sg["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    env = sg["environment"]
    _real_serve_env(env)
    assert env["STORMGUARD_STORE"].startswith("redis://redis:")
    assert "redis" in doc["services"]
    assert "redis" in sg["depends_on"]
    assert sg["ports"] == [f"{env['STORMGUARD_PORT']}:{env['STORMGUARD_PORT']}",
                           f"{env['STORMGUARD_GRPC_PORT']}:{env['STORMGUARD_GRPC_PORT']}"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in sg["volumes"]}
    rules = (DEPLOY / mounts[env["STORMGUARD_RULES"]]).resolve()
    assert len(RuleSet.load(rules)) > 0
    envoy = load_envoy_config(DEPLOY / mounts[env["STORMGUARD_ENVOY_CONFIG"]])
    assert "edge" in envoy.domains
    args = _parser().parse_args(cmd[1:])
    assert args.command == "serve"


def test_kubernetes_manifests() -> None:
    cmd, _, _, user = dockerfile()
    docs = {d["kind"]: d for d in yaml.safe_load_all((DEPLOY / "k8s" /
                                                       "stormguard.yaml").read_text())}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == cmd
    assert pod["securityContext"]["runAsUser"] == int(user)
    env = {e["name"]: e["value"] for e in container["env"]}
    _real_serve_env(env)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": int(env["STORMGUARD_PORT"]), "grpc": int(env["STORMGUARD_GRPC_PORT"])}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert {p["targetPort"] for p in docs["Service"]["spec"]["ports"]} <= set(ports)
    data = docs["ConfigMap"]["data"]
    mounts = {m["mountPath"]: m["subPath"] for m in container["volumeMounts"]}
    assert len(RuleSet.loads(data[mounts[env["STORMGUARD_RULES"]]])) == 2
    assert "edge" in loads_envoy_config(data[mounts[env["STORMGUARD_ENVOY_CONFIG"]]]).domains
