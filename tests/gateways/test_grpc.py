"""The Envoy rate-limit service of a real ``stormguard serve --grpc-port`` process, asked
by a gRPC client built from the xds-protos stubs (as Envoy asks it)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from stormguard.cli import main
from tests.gateways.conftest import CONFIGS, Serve, serve_env
from tests.redis_servers import free_port, start_redis

D = ratelimit_pb2.RateLimitDescriptor
Resp = rls_pb2.RateLimitResponse
OK, OVER = Resp.Code.OK, Resp.Code.OVER_LIMIT


def descriptor(*entries: tuple[str, str], hits: int | None = None) -> Any:
    d = D(entries=[D.Entry(key=k, value=v) for k, v in entries])
    if hits is not None:
        d.hits_addend.value = hits
    return d


def stub(s: Serve) -> Any:
    channel = grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}")
    return rls_pb2_grpc.RateLimitServiceStub(channel)


def ask(st: Any, domain: str, *descs: Any, hits: int = 0) -> Any:
    return st.ShouldRateLimit(rls_pb2.RateLimitRequest(domain=domain, descriptors=descs,
                                                       hits_addend=hits), timeout=10)


def metric(s: Serve, line_start: str) -> float:
    text = httpx.get(f"{s.base}/metrics").text
    found = [ln for ln in text.splitlines() if ln.startswith(line_start)]
    return float(found[0].rsplit(" ", 1)[1]) if found else 0.0


@pytest.mark.slow
def test_should_rate_limit_end_to_end(serve: Callable[..., Serve]) -> None:
    s = serve("--envoy-config", str(CONFIGS), "--envoy-headers")
    st = stub(s)
    bar = descriptor(("source_cluster", "proxy"), ("destination_cluster", "bar"))
    answers = [ask(st, "rl", bar) for _ in range(11)]
    assert [a.overall_code for a in answers] == [OK] * 10 + [OVER]
    first, last = answers[0].statuses[0], answers[-1].statuses[0]
    assert (first.code, first.limit_remaining) == (OK, 9)
    assert (first.current_limit.requests_per_unit, first.current_limit.unit) == \
        (10, Resp.RateLimit.Unit.MINUTE)
    assert 0 < first.duration_until_reset.ToNanoseconds() <= 60 * 10**9
    assert last.code == OVER
    headers = {h.key: h.value for h in answers[-1].response_headers_to_add}
    assert headers["X-RateLimit-Limit"] == "10"
    assert headers["X-RateLimit-Remaining"] == "0"
    assert 1 <= int(headers["Retry-After"]) <= 60
    assert "RateLimit" in headers
    assert "RateLimit-Policy" in headers
    # envoyproxy/ratelimit's own names
    assert (headers["RateLimit-Limit"], headers["RateLimit-Remaining"]) == ("10", "0")
    assert 1 <= int(headers["RateLimit-Reset"]) <= 60
    # hits_addend on the request and on the descriptor
    users = descriptor(("database", "users"))
    assert ask(st, "mongo_cps", users, hits=100).statuses[0].limit_remaining == 400
    assert ask(st, "mongo_cps", descriptor(("database", "users"), hits=250)
               ).statuses[0].limit_remaining == 150
    # unknown domain and descriptor: OK with no limit, counted
    unknown = ask(st, "nope", descriptor(("a", "b")))
    assert unknown.overall_code == OK
    assert not unknown.statuses[0].HasField("current_limit")
    assert ask(st, "rl", descriptor(("zzz", "1"))).statuses[0].code == OK
    # shadow mode: OK, counted
    marketing = descriptor(("message_type", "marketing"), ("to_number", "1"))
    codes = [ask(st, "shadow_messaging", marketing).overall_code for _ in range(7)]
    assert codes == [OK] * 7
    assert metric(s, 'stormguard_envoy_descriptors_total{domain="shadow_messaging",'
                  'result="shadow_over_limit"}') == 2
    assert metric(s, 'stormguard_envoy_descriptors_total{domain="(unknown)",'
                  'result="unknown"}') == 1
    assert metric(s, 'stormguard_envoy_descriptors_total{domain="rl",result="unknown"}') == 1
    assert metric(s, 'stormguard_envoy_requests_total{code="OVER_LIMIT",domain="rl"}') == 1
    # a request Envoy would never send: a clear INVALID_ARGUMENT, not a crash
    with pytest.raises(grpc.RpcError) as info:
        ask(st, "", bar)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "domain" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        ask(st, "rl", *[bar] * 65)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 64 descriptors" in info.value.details()
    # the standard health service, as Envoy's grpc_health_check asks it
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    hs = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}"))
    for service in ("", "envoy.service.ratelimit.v3.RateLimitService"):
        answer = hs.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    err = s.stop()
    assert "Traceback" not in err


@pytest.mark.slow
def test_grpc_and_http_share_the_store_and_rules(serve: Callable[..., Serve]) -> None:
    """The domain ``stormguard`` is checked against the service's rules: a descriptor
    ``user=alice`` and a ``/v1/check`` of user alice spend the same counter."""
    s = serve()
    st = stub(s)
    alice = descriptor(("user", "alice"))
    first = ask(st, "stormguard", alice)
    assert first.overall_code == OK
    limit = first.statuses[0].current_limit
    assert (limit.name, limit.requests_per_unit, limit.unit) == \
        ("per-user", 3, Resp.RateLimit.Unit.MINUTE)
    assert first.statuses[0].limit_remaining == 2
    assert len(first.response_headers_to_add) == 0  # no --envoy-headers
    r = httpx.post(f"{s.base}/v1/check", json={"user": "alice"})
    assert r.json()["remaining"] == 1
    assert ask(st, "stormguard", alice).overall_code == OK
    assert ask(st, "stormguard", alice).overall_code == OVER
    assert httpx.post(f"{s.base}/v1/check", json={"user": "alice"}).json()["allowed"] is False


@pytest.mark.slow
def test_grpc_denials_feed_the_top_limited_keys(serve: Callable[..., Serve]) -> None:
    """``GET /v1/top`` counts what gRPC denies as it counts ``/v1/check`` denials: by store
    key and rule name; a user denied over both protocols is one key of the sketch."""
    s = serve("--envoy-config", str(CONFIGS))
    st = stub(s)
    alice = descriptor(("user", "alice"))
    assert [httpx.post(f"{s.base}/v1/check", json={"user": "alice"}).json()["allowed"]
            for _ in range(2)] == [True, True]
    assert [ask(st, "stormguard", alice).overall_code for _ in range(3)] == [OK, OVER, OVER]
    assert httpx.post(f"{s.base}/v1/check", json={"user": "alice"}).json()["allowed"] is False
    bar = descriptor(("source_cluster", "proxy"), ("destination_cluster", "bar"))
    assert [ask(st, "rl", bar).overall_code for _ in range(13)] == [OK] * 10 + [OVER] * 3
    banned = descriptor(("remote_address", "50.0.0.5"))  # requests_per_unit 0
    assert [ask(st, "edge_proxy_per_ip", banned).overall_code for _ in range(2)] == [OVER] * 2
    marketing = descriptor(("message_type", "marketing"), ("to_number", "1"))
    assert [ask(st, "shadow_messaging", marketing).overall_code
            for _ in range(7)] == [OK] * 7  # shadow: two would have been denied
    # a request denied by one limit: its other limits were only peeked, not counted
    both = [descriptor(("source_cluster", "proxy"), ("destination_cluster", "foo")), bar]
    assert ask(st, "rl", *both).overall_code == OVER
    top = httpx.get(f"{s.base}/v1/top", params={"n": 10}).json()
    assert [(k["key"], k["count"], k["rules"]) for k in top["keys"]] == [
        ("envoy:rl:source_cluster:proxy:destination_cluster:bar", 4,
         ["rl.source_cluster_proxy.destination_cluster_bar"]),
        ("user:alice", 3, ["per-user"]),
        ("envoy:edge_proxy_per_ip:remote_address:50.0.0.5", 2,
         ["edge_proxy_per_ip.remote_address_50.0.0.5"]),
        ("envoy:shadow_messaging:message_type:marketing:to_number:1", 2,
         ["shadow_messaging.message_type_marketing.to_number"]),
    ]
    assert top["denials"] == 4 + 3 + 2 + 2


@pytest.mark.slow
def test_concurrent_streams_over_redis_admit_exactly_the_limit(
        serve: Callable[..., Serve]) -> None:
    """16 threads on 2 channels to each of 2 service processes over one Redis, 200 calls
    of hits_addend 3 on a 100-a-day limit: exactly 33 are OK, whatever the interleaving
    (a non-atomic read-modify-write would admit more)."""
    redis = start_redis()
    try:
        services = [serve("--store", redis.url, "--envoy-config", str(CONFIGS))
                    for _ in range(2)]
        stubs = [stub(s) for s in services for _ in range(2)]
        results: list[int] = []
        lock = threading.Lock()
        to = descriptor(("to_number", "2065550100"))

        def worker(i: int) -> None:
            n = 200 // 16 + (i < 200 % 16)
            mine = [ask(stubs[i % 4], "messaging", to, hits=3).overall_code for _ in range(n)]
            with lock:
                results.extend(mine)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 200
        assert results.count(OK) == 33
    finally:
        redis.stop()


@pytest.mark.slow
def test_store_outage_follows_on_error(serve: Callable[..., Serve]) -> None:
    """Redis killed (SIGKILL): on_error allow answers OK; on_error deny OVER_LIMIT; never
    a gRPC error; the degraded start line is written."""
    redis = start_redis()
    try:
        allow = serve("--store", redis.url, "--envoy-config", str(CONFIGS))
        deny = serve("--store", redis.url, "--envoy-config", str(CONFIGS), "--on-error",
                     "deny")
        users = descriptor(("database", "users"))
        assert ask(stub(allow), "mongo_cps", users).overall_code == OK
        redis.stop()
        assert ask(stub(allow), "mongo_cps", users).overall_code == OK
        assert ask(stub(deny), "mongo_cps", users).overall_code == OVER
        assert metric(allow, "stormguard_degraded_decisions_total") >= 1
        # the serve command wires the gRPC path to the degraded log lines (one at the start)
        assert allow.stop().count("checks are answered degraded") == 1
    finally:
        redis.stop()


def _serve_fails(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stormguard", "serve", "--port",
                           str(free_port()), *args], capture_output=True, text=True,
                          env=serve_env(), timeout=60, check=False)


@pytest.mark.slow
def test_invalid_envoy_config_is_refused_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "cfg"
    bad.mkdir()
    (bad / "ok.yaml").write_text("domain: fine\n")
    (bad / "broken.yaml").write_text("domain: d\ndescriptors:\n  - key: a\n    descriptors:\n"
                                     "      - key: b\n        rate_limit:\n"
                                     "          unit: fortnight\n"
                                     "          requests_per_unit: 5\n")
    r = _serve_fails("--grpc-port", str(free_port()), "--envoy-config", str(bad))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert f"{bad / 'broken.yaml'}: descriptors[0].descriptors[0] (key 'b').rate_limit.unit: " \
        "invalid unit 'fortnight'" in r.stderr


def test_envoy_flags_are_checked_before_serving(capsys: pytest.CaptureFixture[str]) -> None:
    """Refused in ``serve``'s set-up (the same code path as above, in this process)."""
    port = str(free_port())
    assert main(["serve", "--port", port, "--envoy-config", str(CONFIGS)]) == 2
    assert "--envoy-config needs --grpc-port" in capsys.readouterr().err
    assert main(["serve", "--port", port, "--envoy-headers"]) == 2
    assert "--envoy-headers needs --grpc-port" in capsys.readouterr().err
    assert main(["serve", "--port", port, "--grpc-port", port]) == 2
    assert "a port of its own" in capsys.readouterr().err
    assert main(["serve", "--port", port, "--grpc-port", "99999"]) == 2
    assert "port must be 0..65535" in capsys.readouterr().err
    assert main(["serve", "--port", port, "--grpc-port", str(free_port()), "--envoy-config",
                 str(CONFIGS / "missing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_grpc_port_in_use_fails_to_start(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main(["serve", "--port", str(free_port()), "--grpc-port", str(port)]) == 4
    err = capsys.readouterr().err
    assert f"could not serve gRPC on 127.0.0.1:{port}" in err  # EXIT_LISTEN, as for --port
    assert "Traceback" not in err


@pytest.mark.slow
def test_a_changed_configuration_reaches_a_running_service(
        serve: Callable[..., Serve], tmp_path: Path) -> None:
    cfg = tmp_path / "envoy"
    cfg.mkdir()
    (cfg / "d.yaml").write_text("domain: d\ndescriptors:\n  - key: k\n"
                                "    rate_limit: {unit: minute, requests_per_unit: 1}\n")
    s = serve("--envoy-config", str(cfg))
    st = stub(s)
    k = descriptor(("k", "v"))
    assert [ask(st, "d", k).overall_code for _ in range(2)] == [OK, OVER]
    (cfg / "d.yaml").write_text("domain: d\ndescriptors:\n  - key: k\n"
                                "    rate_limit: {unit: minute, requests_per_unit: 100}\n")
    deadline = time.monotonic() + 10
    while ask(st, "d", k).statuses[0].current_limit.requests_per_unit != 100:
        assert time.monotonic() < deadline, "not reloaded in 10 s"
        time.sleep(0.1)  # real time: the service polls its files every second
    (cfg / "d.yaml").write_text("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {}\n")
    deadline = time.monotonic() + 10
    while metric(s, 'stormguard_envoy_config_reloads_total{result="error"}') < 1:
        assert time.monotonic() < deadline, "the invalid change was not noticed in 10 s"
        time.sleep(0.1)  # real time, as above
    assert ask(st, "d", k).statuses[0].current_limit.requests_per_unit == 100  # kept
    assert "refused, the previous one stays" in s.stop()
