"""The Redis transport on its own: arbitrary commands and registered scripts, sync and
asyncio, one node and a cluster; AUTH (password, ACL user), SELECT, TLS and reconnects
through it; the stores' breaker events."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from stormguard import AsyncRateLimiter, RateLimiter, RedisStore, Rule, StorageError
from stormguard._core.errors import StorageCircuitOpen
from stormguard.observability.events import CallRejected, Event, StateChanged
from stormguard.stores.redis import Command, register, transport_for
from stormguard.stores.redis.scripts import get
from stormguard.testing import FakeClock
from tests.redis_servers import REDIS_SERVER, RedisServer, free_port, start_redis


def command(server: RedisServer, *args: Any) -> Any:
    """One command on a private server, with a client closed at once."""
    with server.client() as c:
        return c.execute_command(*args)


def query(port: int, *args: Any, **options: Any) -> Any:
    with redis.Redis(port=port, **options) as c:
        return c.execute_command(*args)


XADD = register("tests.xadd", "return redis.call('XADD', KEYS[1], '*', 'n', ARGV[1])")
RULE = Rule(100, 60, algorithm="fixed_window")


def test_registering_is_idempotent_and_names_are_unique() -> None:
    assert register("tests.xadd", XADD.source) is XADD
    assert get("tests.xadd").sha == XADD.sha
    with pytest.raises(ValueError, match="name"):
        register("tests.xadd", "return 2")


def _streams_sync(t: Any, stream: str) -> None:
    assert t.call(Command.of("DEL", stream, key=stream)) in (0, 1)
    first = t.call(XADD.command([stream], [1]))  # NOSCRIPT -> SCRIPT LOAD -> again
    assert isinstance(first, bytes)
    assert b"-" in first  # a stream entry id
    t.call(Command.of("XADD", stream, "*", "n", "2", key=stream))
    assert t.call(Command.of("XLEN", stream, key=stream)) == 2
    entries = t.call(Command.of("XRANGE", stream, "-", "+", key=stream))
    assert [fields for _, fields in entries] == [[b"n", b"1"], [b"n", b"2"]]
    with pytest.raises(StorageError, match="WRONGTYPE"):
        t.call(Command.of("LPUSH", stream, "x", key=stream))  # Redis answered: an error


async def _streams_async(t: Any, stream: str) -> None:
    await t.acall(Command.of("DEL", stream, key=stream))
    await t.acall(XADD.command([stream], [1]))
    await t.acall(Command.of("XADD", stream, "*", "n", "2", key=stream))
    assert await t.acall(Command.of("XLEN", stream, key=stream)) == 2
    with pytest.raises(StorageError, match="WRONGTYPE"):
        await t.acall(Command.of("LPUSH", stream, "x", key=stream))
    assert await t.acall(Command.of("PING")) == b"PONG"


@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_custom_script_and_stream_commands(backend: str, request: pytest.FixtureRequest,
                                                 ) -> None:
    url = request.getfixturevalue("redis_url" if backend == "redis" else "cluster_url")
    t = transport_for(url, timeout=1.0)
    for i, stream in enumerate(["{jobs}:a", "{jobs}:b", "other{x}"]):
        _streams_sync(t, stream)
        await _streams_async(t, f"{stream}:{i}")
    # the script cache is flushed under us: the next call loads the script by name again
    nodes = [request.getfixturevalue("redis_server")] if backend == "redis" else \
        request.getfixturevalue("redis_cluster").nodes
    for n in nodes:
        command(n, "SCRIPT", "FLUSH")
    t.call(XADD.command(["{jobs}:a"], [3]))
    await t.acall(XADD.command(["{jobs}:a"], [4]))
    assert t.call(Command.of("XLEN", "{jobs}:a", key="{jobs}:a")) == 4
    await t.aclose()


def test_sync_cluster_follows_moved_and_ask() -> None:
    """The blocking path routes by itself: a stale slot map meets MOVED (followed, the
    slot fixed), a migrating slot ASK (followed after ASKING), as on the async path."""
    from redis.crc import key_slot

    from stormguard import RedisClusterStore
    from tests.redis_servers import start_cluster

    cluster = start_cluster(3)  # its own: this test changes slot states
    try:
        store = RedisClusterStore.from_url(cluster.url, timeout=1.0)
        assert store.hit("moved", RULE).remaining == 99
        t = store.transport
        assert t.slots is not None
        slot = key_slot(store.key("moved", RULE).encode())
        right = t.slots[slot]
        t.slots[slot] = next(n for n in t.masters if n != right)
        assert store.hit("moved", RULE).remaining == 98  # MOVED, followed
        assert t.slots[slot] == right
        key = store.key("migrating", RULE)
        slot = key_slot(key.encode())
        source = store.node_for("migrating", RULE)
        target = next(n for n in t.masters if n != source)
        by_name = {f"127.0.0.1:{n.port}": n for n in cluster.nodes}
        src, dst = by_name[source], by_name[target]
        command(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", command(src, "CLUSTER", "MYID"))
        command(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", command(dst, "CLUSTER", "MYID"))
        d = store.hit("migrating", RULE)  # ASK -> ASKING + the check on the new master
        assert (d.allowed, d.remaining, d.degraded) == (True, 99, False)
        assert command(dst, "CLUSTER", "COUNTKEYSINSLOT", slot) == 1
        assert command(src, "CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        command(src, "SCRIPT", "FLUSH")
        command(dst, "SCRIPT", "FLUSH")  # ASK + NOSCRIPT: SCRIPT LOAD, ASKING + the check
        assert store.hit("migrating", RULE).remaining == 98
        store.close()
    finally:
        cluster.stop()


@pytest.mark.parametrize("backend", ["redis", "cluster"])
def test_call_many_is_one_round_trip_per_server(backend: str,
                                                request: pytest.FixtureRequest) -> None:
    """The blocking batch (a hybrid store's sync, say): replies in order, an error reply
    in its place, NOSCRIPT answered, one round trip per server."""
    url = request.getfixturevalue("redis_url" if backend == "redis" else "cluster_url")
    t = transport_for(url, timeout=1.0)
    keys = [f"{{k{i}}}:n" for i in range(30)]
    t.call(Command.of("PING"))
    before = t.round_trips
    replies = t.call_many([Command.of("INCRBY", k, i, key=k) for i, k in enumerate(keys)])
    assert replies == list(range(30))
    servers = 1 if backend == "redis" else len({t.node_for(k) for k in keys})
    assert t.round_trips == before + servers
    t.call(Command.of("SET", "{k0}:s", "x", key="{k0}:s"))
    nodes = [request.getfixturevalue("redis_server")] if backend == "redis" else \
        request.getfixturevalue("redis_cluster").nodes
    for n in nodes:
        command(n, "SCRIPT", "FLUSH")  # the batch meets NOSCRIPT: loaded, sent again
    mixed = t.call_many([Command.of("INCR", "{k0}:s", key="{k0}:s"),
                         XADD.command(["{k0}:x"], [1]),
                         Command.of("GET", "{k0}:n", key="{k0}:n")])
    assert isinstance(mixed[0], StorageError)  # not an integer: an error in its place
    assert isinstance(mixed[1], bytes)
    assert mixed[2] == b"0"
    assert t.call_many([]) == []
    t.close()


def test_call_many_with_the_server_down(restartable: RedisServer) -> None:
    t = transport_for(restartable.url, timeout=1.0)
    restartable.stop()
    replies = t.call_many([Command.of("PING"), Command.of("PING")])
    assert all(isinstance(r, StorageError) for r in replies)
    t.close()


async def test_an_unregistered_script_fails_as_storage_error(redis_url: str) -> None:
    from stormguard.stores.redis.protocol import Command as Cmd

    t = transport_for(redis_url, timeout=1.0)
    cmd = Cmd.of("EVALSHA", "0" * 40, 0, script="tests.never-registered")
    with pytest.raises(StorageError, match="never-registered"):
        t.call(cmd)
    with pytest.raises(StorageError, match="never-registered"):
        await t.acall(cmd)
    assert t.call(Command.of("PING")) == b"PONG"  # the connections are still in step
    assert await t.acall(Command.of("PING")) == b"PONG"
    await t.aclose()


# -- private servers for AUTH, SELECT, TLS, reconnect -------------------------------------------
@pytest.fixture(scope="module")
def locked() -> Iterator[RedisServer]:
    """A private server with a password and an ACL user (set after start-up: the start
    helper pings without credentials)."""
    server = start_redis()
    command(server, "ACL", "SETUSER", "alice", "on", ">wonderland", "~*", "&*", "+@all")
    command(server, "CONFIG", "SET", "requirepass", "s3cret")
    yield server
    server.stop()


AUTH_URLS = {
    "password": "redis://:s3cret@127.0.0.1:{port}/0",
    "acl-user": "redis://alice:wonderland@127.0.0.1:{port}/0",
    "acl-user-db3": "redis://alice:wonderland@127.0.0.1:{port}/3",
}


@pytest.mark.parametrize("how", sorted(AUTH_URLS))
async def test_auth_and_select(locked: RedisServer, how: str) -> None:
    url = AUTH_URLS[how].format(port=locked.port)
    t = transport_for(url, timeout=1.0)
    key = f"auth:{how}"
    t.call(Command.of("SET", key, "sync", key=key))
    assert await t.acall(Command.of("GET", key, key=key)) == b"sync"
    await t.acall(Command.of("SET", key, "async", key=key))
    assert t.call(Command.of("GET", key, key=key)) == b"async"
    db = 3 if how.endswith("db3") else 0
    # in the URL's db, and only there
    assert query(locked.port, "GET", key, password="s3cret", db=db) == b"async"
    assert query(locked.port, "GET", key, password="s3cret", db=3 - db) is None
    # the stores on the same URL
    store = RedisStore.from_url(url, timeout=1.0)
    assert store.hit(how, RULE).remaining == 99
    assert (await store.ahit(how, RULE)).remaining == 98
    await store.aclose()
    await t.aclose()


async def test_wrong_password_is_an_error_not_a_hang(locked: RedisServer) -> None:
    t = transport_for(f"redis://:wrong@127.0.0.1:{locked.port}/0", timeout=1.0)
    with pytest.raises(StorageError):
        t.call(Command.of("PING"))
    with pytest.raises(StorageError, match=r"WRONGPASS|invalid"):
        await t.acall(Command.of("PING"))
    await t.aclose()


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[int, str]]:
    """redis-server with TLS only (``--port 0 --tls-port``) and a self-signed certificate
    for 127.0.0.1 made here with the openssl CLI."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make a test certificate")
    d = tempfile.mkdtemp(prefix="sg-tls-")
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True,
                   capture_output=True)
    port = free_port()
    log = open(os.path.join(d, "log"), "wb")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen([REDIS_SERVER, "--port", "0", "--tls-port", str(port), "--bind",
                             "127.0.0.1", "--tls-cert-file", cert, "--tls-key-file", key,
                             "--tls-ca-cert-file", cert, "--tls-auth-clients", "no",
                             "--save", "", "--appendonly", "no", "--dir", d],
                            stdout=subprocess.DEVNULL, stderr=log)
    try:
        end = time.monotonic() + 10
        while True:
            try:
                query(port, "PING", ssl=True, ssl_ca_certs=cert, socket_timeout=1)
                break
            except redis.RedisError:
                if proc.poll() is not None:
                    err = Path(d, "log").read_bytes()
                    if b"TLS" in err and b"not" in err:
                        pytest.skip(f"this redis-server build has no TLS: {err[:200]!r}")
                    raise
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)  # real time: waiting for a real redis-server to listen
        yield port, cert
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)  # real time: a SIGKILLed redis-server exits
        log.close()


async def test_tls(tls_server: tuple[int, str]) -> None:
    port, cert = tls_server
    url = f"rediss://127.0.0.1:{port}/0"
    t = transport_for(url, timeout=1.0, ssl_ca_certs=cert)
    t.call(Command.of("SET", "tls", "sync", key="tls"))
    assert await t.acall(Command.of("GET", "tls", key="tls")) == b"sync"
    store = RedisStore.from_url(url, timeout=1.0, ssl_ca_certs=cert)
    assert store.hit("u", RULE).remaining == 99
    assert (await store.ahit("u", RULE)).remaining == 98
    await store.aclose()
    await t.aclose()
    # an unknown certificate is refused, sync and async (StorageError, never a hang)
    bad = transport_for(url, timeout=1.0)
    with pytest.raises(StorageError):
        bad.call(Command.of("PING"))
    with pytest.raises(StorageError):
        await bad.acall(Command.of("PING"))
    await bad.aclose()


@pytest.fixture
def restartable() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


async def test_reconnect_after_a_restart_on_the_same_port(restartable: RedisServer) -> None:
    t = transport_for(restartable.url, timeout=1.0)
    ping = Command.of("PING")
    assert t.call(ping) == b"PONG"
    assert await t.acall(ping) == b"PONG"
    restartable.stop()
    with pytest.raises(StorageError):
        t.call(ping)
    with pytest.raises(StorageError):
        await t.acall(ping)
    restartable.restart()
    assert t.call(ping) == b"PONG"  # the same transport reconnects, sync and async
    assert await t.acall(ping) == b"PONG"
    await t.aclose()


async def test_unix_socket_and_db(tmp_path: Path) -> None:
    path = str(tmp_path / "redis.sock")
    server = start_redis(extra=["--unixsocket", path, "--unixsocketperm", "700"])
    try:
        url = f"unix://{path}?db=2"
        t = transport_for(url, timeout=1.0)
        t.call(Command.of("SET", "u", "1", key="u"))
        assert await t.acall(Command.of("INCR", "u", key="u")) == 2
        assert query(server.port, "GET", "u", db=2) == b"2"
        store = RedisStore.from_url(url, timeout=1.0)
        assert store.hit("k", RULE).remaining == 99
        assert (await store.ahit("k", RULE)).remaining == 98
        await store.aclose()
        await t.aclose()
    finally:
        server.stop()


def test_unknown_connection_options_are_a_config_error() -> None:
    with pytest.raises(ValueError, match="options"):
        RedisStore.from_url("redis://127.0.0.1:1/0", no_such_option=1)


# -- the stores' breaker: one state machine, events ------------------------------------------------
def test_store_breaker_events(restartable: RedisServer) -> None:
    clock = FakeClock()
    events: list[Event] = []
    store = RedisStore.from_url(restartable.url, clock=clock, timeout=1.0, breaker_threshold=2,
                                breaker_cooldown=1.0, listeners=[events.append])
    limiter = RateLimiter(store, on_error="allow")
    assert not limiter.hit("k", RULE).degraded
    restartable.stop()
    assert limiter.hit("k", RULE).degraded
    assert store.breaker.state == "closed"
    assert limiter.hit("k", RULE).degraded  # the 2nd consecutive failure opens it
    assert store.breaker.state == "open"
    name = f"redis:127.0.0.1:{restartable.port}"
    assert events == [StateChanged(name, clock.monotonic(), "closed", "open")]
    clock.advance(0.25)
    with pytest.raises(StorageCircuitOpen) as exc:
        store.hit("k", RULE)
    assert exc.value.remaining == pytest.approx(0.75)
    assert isinstance(exc.value, StorageError)
    assert events[-1] == CallRejected(name, clock.monotonic(), "open", pytest.approx(0.75))
    restartable.restart()
    clock.advance(0.75)
    assert not limiter.hit("k", RULE).degraded  # the probe closes it
    assert [(e.old, e.new) for e in events if isinstance(e, StateChanged)] == [
        ("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    store.remove_listener(events.append)
    restartable.stop()
    for _ in range(3):
        limiter.hit("k", RULE)
    assert store.breaker.state == "open"
    assert store.breaker.opened == 2
    assert [(e.old, e.new) for e in events if isinstance(e, StateChanged)][-1] == (
        "half_open", "closed")  # removed: no more events
    store.close()


async def test_async_store_breaker_opens_and_rejects(restartable: RedisServer) -> None:
    clock = FakeClock()
    events: list[Event] = []
    store = RedisStore.from_url(restartable.url, clock=clock, timeout=1.0, breaker_threshold=3)
    store.add_listener(events.append)
    limiter = AsyncRateLimiter(store, on_error="deny")
    assert not (await limiter.hit("k", RULE)).degraded
    restartable.stop()
    for _ in range(3):
        assert (await limiter.hit("k", RULE)).degraded
    assert store.breaker.state == "open"
    trips = store.round_trips
    with pytest.raises(StorageCircuitOpen):
        await store.ahit("k", RULE)
    assert store.round_trips == trips  # no network while open
    assert [type(e) for e in events] == [StateChanged, CallRejected]
    await limiter.aclose()


def test_docs_name_the_protocol_subset() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    for word in ("RESP2", "AUTH", "SELECT", "EVALSHA", "SCRIPT LOAD", "ASKING", "NOSCRIPT"):
        assert word in doc, word
