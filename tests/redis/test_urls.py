"""A store URL's query takes the options the constructor takes (``prefix`` first of all),
for every Redis URL form (one server, a cluster, a hybrid store over either); a keyword
wins over the query; anything the store and redis-py do not know is refused, named."""

from __future__ import annotations

from typing import Any

import pytest

from stormguard import ConfigError, RateLimiter, RedisClusterStore, RedisStore, Rule
from stormguard.stores import from_url
from stormguard.stores.hybrid import HybridStore
from tests.redis_servers import RedisCluster, RedisServer

RULE = Rule(5, 3600, algorithm="fixed_window")

# every option a query can carry, as text and as the constructor's keyword
OPTIONS: list[tuple[str, str, Any]] = [
    ("prefix", "app", "app"), ("time_source", "client", "client"),
    ("timeout", "0.25", 0.25), ("connect_timeout", "0.5", 0.5),
    ("breaker_threshold", "3", 3), ("breaker_cooldown", "2.5", 2.5),
    ("max_connections", "7", 7), ("ttl_slack", "4", 4.0)]


def _settings(store: RedisStore | RedisClusterStore) -> dict[str, Any]:
    return {name: getattr(store, name) for name, _, _ in OPTIONS}


def _query(options: list[tuple[str, str, Any]]) -> str:
    return "&".join(f"{name}={text}" for name, text, _ in options)


def test_a_prefix_in_the_url_names_the_keys_on_the_server(server: RedisServer) -> None:
    store = RedisStore.from_url(f"{server.url}?prefix=app", timeout=1.0)
    assert store.prefix == "app"
    assert store.hit("user:1", RULE).remaining == 4
    assert [k.decode() for k in server.client().keys("*")] == [store.key("user:1", RULE)]
    assert store.key("user:1", RULE).startswith("app:{")
    # another prefix is another counter on the same server
    other = from_url(f"{server.url}?prefix=other&timeout=1")
    assert other.hit("user:1", RULE).remaining == 4
    assert store.hit("user:1", RULE).remaining == 3
    store.close()
    other.close()


def test_every_constructor_option_works_in_the_query(server: RedisServer) -> None:
    from_query = RedisStore.from_url(f"{server.url}?{_query(OPTIONS)}")
    from_keywords = RedisStore.from_url(server.url, **{n: v for n, _, v in OPTIONS})
    assert _settings(from_query) == _settings(from_keywords) == {n: v for n, _, v in OPTIONS}
    assert from_query.transport.max_connections == 7
    assert from_query.transport.timeout == 0.25
    assert from_query.breaker_threshold == 3
    assert from_query.hit("k", RULE).allowed  # the rest of the URL still reaches the server
    # the constructor and the registry read the query too
    assert RedisStore(f"{server.url}?prefix=ctor").prefix == "ctor"
    limiter = RateLimiter(f"{server.url}?prefix=lim&timeout=1")
    assert limiter.store.prefix == "lim"  # type: ignore[attr-defined]
    assert limiter.hit("k", RULE).remaining == 4
    limiter.close()
    from_query.close()
    from_keywords.close()


def test_a_keyword_wins_over_the_query() -> None:
    store = RedisStore.from_url("redis://127.0.0.1:1/0?prefix=url&timeout=0.3",
                                prefix="kw")
    assert (store.prefix, store.timeout) == ("kw", 0.3)
    assert store.url == "redis://127.0.0.1:1/0"  # the store's options leave the URL


def test_connection_options_stay_in_the_url(server: RedisServer) -> None:
    """redis-py's options still reach its connections (a named client on the server)."""
    store = RedisStore.from_url(f"{server.url}?client_name=checkout&prefix=p", timeout=1.0)
    assert store.hit("k", RULE).allowed
    names = [c["name"] for c in server.client().client_list()]
    assert "checkout" in names
    assert store.prefix == "p"
    store.close()
    tls = from_url("rediss://127.0.0.1:1/0?ssl_cert_reqs=none&prefix=t")
    assert tls.prefix == "t"  # type: ignore[attr-defined]
    assert tls.transport.endpoint.tls is not None  # type: ignore[attr-defined]
    assert not tls.transport.endpoint.tls.check_hostname  # type: ignore[attr-defined]
    unix = from_url("unix:///run/redis.sock?db=2&prefix=u")
    assert unix.prefix == "u"  # type: ignore[attr-defined]
    assert unix.transport.endpoint.connection_kwargs["db"] == 2  # type: ignore[attr-defined]


def test_a_cluster_url_takes_the_same_options(cluster_url: str,
                                              redis_cluster: RedisCluster) -> None:
    store = RedisClusterStore.from_url(
        f"{cluster_url}?{_query(OPTIONS[:1] + OPTIONS[2:])}&client_name=edge")
    want = {n: v for n, _, v in OPTIONS}
    want["time_source"] = "server"
    assert _settings(store) == want
    store.timeout = store.transport.timeout = 1.0  # a loaded machine: no flaky first connect
    assert store.hit("user:1", RULE).remaining == 4
    keys = [k.decode() for node in redis_cluster.nodes for k in node.client().keys("*")]
    assert keys == [store.key("user:1", RULE)]
    assert keys[0].startswith("app:{")
    names = [c["name"] for node in redis_cluster.nodes for c in node.client().client_list()]
    assert "edge" in names  # the connection options reach every node
    store.close()


def test_a_hybrid_url_passes_them_to_its_backend(server: RedisServer) -> None:
    store = from_url(f"hybrid+{server.url}?prefix=h&sync_interval=none&timeout=1")
    assert isinstance(store, HybridStore)
    assert store.sync_interval is None
    assert store.backend.prefix == "h"  # type: ignore[attr-defined]
    assert store.backend.timeout == 1.0  # type: ignore[attr-defined]
    store.close()


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:1/0?prefx=app",
    "rediss://127.0.0.1:1/0?prefx=app",
    "unix:///run/redis.sock?prefx=app",
    "redis+cluster://127.0.0.1:1,127.0.0.1:2?prefx=app",
    "hybrid+redis://127.0.0.1:1/0?prefx=app",
    "hybrid+redis+cluster://127.0.0.1:1,127.0.0.1:2?prefx=app",
])
def test_an_unknown_parameter_is_refused_by_name(url: str) -> None:
    with pytest.raises(ConfigError) as exc:
        from_url(url)
    assert exc.value.field == "url"
    assert exc.value.value == ["prefx"]
    assert "unknown query parameter 'prefx'" in str(exc.value)
    assert "prefix" in exc.value.problem  # what it could have been


def test_several_unknown_parameters_are_all_named() -> None:
    with pytest.raises(ConfigError) as exc:
        RedisStore.from_url("redis://127.0.0.1:1/0?a=1&prefix=ok&b=2")
    assert exc.value.value == ["a", "b"]
    assert "'a', 'b'" in exc.value.problem
    with pytest.raises(ConfigError) as exc:
        from_url("memory://?max_keys=5&prefix=x")
    assert (exc.value.field, exc.value.value) == ("url", ["prefix"])


@pytest.mark.parametrize(("query", "field", "problem"), [
    ("timeout=fast", "timeout", "must be a number"),
    ("timeout=0", "timeout", "must be > 0"),
    ("max_connections=1.5", "max_connections", "must be an integer"),
    ("breaker_threshold=11", "breaker_threshold", "<= 10"),
    ("time_source=gps", "time_source", "gps"),
    ("prefix=a{b}", "prefix", "{"),
    ("prefix=", "prefix", "must not be empty"),
    ("prefix=a&prefix=b", "prefix", "given twice"),
])
def test_a_bad_value_names_its_field(query: str, field: str, problem: str) -> None:
    for url in (f"redis://127.0.0.1:1/0?{query}",
                f"redis+cluster://127.0.0.1:1,127.0.0.1:2?{query}"):
        with pytest.raises(ConfigError) as exc:
            from_url(url)
        assert exc.value.field == field, url
        assert problem in str(exc.value), url


def test_a_cluster_url_refuses_a_database() -> None:
    with pytest.raises(ConfigError) as exc:
        from_url("redis+cluster://127.0.0.1:1,127.0.0.1:2?db=1")
    assert (exc.value.field, exc.value.value) == ("url", ["db"])
    assert "only database 0" in exc.value.problem
