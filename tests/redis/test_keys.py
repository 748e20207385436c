"""Key layout, TTLs, hash tags, time source and the packaged Lua files."""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import redis

from stormguard import ConfigError, RedisClusterStore, RedisStore, Rule, _speedups
from stormguard.ratelimit.algorithms import ALGORITHMS
from stormguard.stores.redis import SCRIPT
from stormguard.testing import FakeClock
from tests.redis_servers import RedisCluster, RedisServer

ALGOS = sorted(ALGORITHMS)


def test_lua_files_are_package_data() -> None:
    lua = importlib.resources.files("stormguard.stores.redis") / "lua"
    names = sorted(p.name for p in lua.iterdir() if p.name.endswith(".lua"))
    assert names == ["fixed_window.lua", "gcra.lua", "leaky_bucket.lua", "lease.lua",
                     "main.lua", "prelude.lua", "reservation.lua", "reserve.lua",
                     "shaper.lua",
                     "sliding_window_counter.lua", "sliding_window_log.lua",
                     "token_bucket.lua"]
    for name in names:
        # the entry points of the reservation (test_reserve_lua.py), the hybrid store's
        # leases and the shaper's bookings (test_shaper_redis.py): their own scripts
        if name not in ("reservation.lua", "reserve.lua", "lease.lua", "shaper.lua"):
            assert lua.joinpath(name).read_text(encoding="utf-8") in SCRIPT


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("time_source", ["server", "client"])
def test_every_key_has_a_ttl_within_the_bound(server: RedisServer, algo: str,
                                              time_source: str) -> None:
    store = RedisStore.from_url(server.url, time_source=time_source, prefix="ttl", timeout=1.0,
                                ttl_slack=0)  # type: ignore[arg-type]
    rule = Rule(10, 60, algorithm=algo)
    for i in range(25):
        store.hit(f"user:{i % 5}", rule, cost=1 + i % 2)
        store.peek(f"other:{i}", rule)  # peeks write nothing
    store.hit_all("both", [rule, Rule(3, 1, algorithm=algo)])
    c = server.client()
    keys = c.keys("*")
    assert len(keys) == 7
    bound_ms = 2 * 60_000 if algo == "sliding_window_counter" else 60_000
    for k in keys:
        assert k.startswith(b"ttl:{")
        pttl = c.pttl(k)
        assert 0 < pttl <= bound_ms, (k, pttl)
    store.close()


def test_ttl_slack_in_client_mode_is_added(server: RedisServer, clock: FakeClock) -> None:
    store = RedisStore.from_url(server.url, time_source="client", clock=clock, ttl_slack=5,
                                timeout=1.0)
    rule = Rule(10, 2, algorithm="token_bucket")
    store.hit("k", rule, cost=10)  # empty: 2 s to refill
    pttl = server.client().pttl(store.key("k", rule))
    assert 5000 < pttl <= 7000
    store.close()


def test_key_layout_and_braces(server: RedisServer) -> None:
    store = RedisStore.from_url(server.url, prefix="app", timeout=1.0)
    rule = Rule(5, 60)
    k1 = store.key("{user}:1", rule)
    k2 = store.key("{user}:2", rule)
    assert re.fullmatch(r"app:\{[0-9a-f]{32}\}:sliding_window_counter:5:60000000:5", k1)
    # the hash tag is ours: braces in user keys do not pick the slot
    tag1 = k1[k1.index("{") + 1:k1.index("}")]
    tag2 = k2[k2.index("{") + 1:k2.index("}")]
    assert tag1 != tag2
    assert "user" not in k1
    # all rules of one key share the tag (one slot), different rules never share a key
    other = Rule(5, 60, name="other")
    assert store.key("{user}:1", other).startswith(k1[:k1.index("}") + 1])
    assert store.key("{user}:1", other) != k1
    store.close()


def test_user_keys_cannot_collide_with_other_rules(server: RedisServer) -> None:
    store = RedisStore.from_url(server.url, timeout=1.0)
    rule_a = Rule(1, 60, algorithm="fixed_window", name="a")
    rule_ab = Rule(1, 60, algorithm="fixed_window", name="a:b")
    crafted = ["b", ":b", "a:b", "fixed_window:1:60000000:1:a:b", "}", "{", "{}", "}{"]
    keys = {store.key(k, r) for k in crafted for r in (rule_a, rule_ab)}
    assert len(keys) == 2 * len(crafted)
    for k in crafted:
        assert store.hit(k, rule_a).allowed
        assert store.hit(k, rule_ab).allowed
    store.close()


def test_cluster_slots_follow_our_tag(redis_cluster: RedisCluster) -> None:
    for node in redis_cluster.nodes:
        node.client().flushall()
    store = RedisClusterStore.from_url(redis_cluster.url, timeout=1.0)
    rules = [Rule(5, 60, name=str(i)) for i in range(4)]
    # keys that would all land in slot of "x" if braces in them were hash tags
    users = [f"{{x}}{i}" for i in range(30)]
    for u in users:
        assert store.hit_all(u, rules).allowed
    slots = {redis.cluster.key_slot(store.key(u, rules[0]).encode()) for u in users}
    assert len(slots) > 10
    for u in users:
        assert len({redis.cluster.key_slot(store.key(u, r).encode()) for r in rules}) == 1
    store.close()


def test_rules_too_large_for_exact_lua_are_rejected(server: RedisServer) -> None:
    store = RedisStore.from_url(server.url, timeout=1.0)
    huge = Rule(10**7, 86400 * 365, algorithm="token_bucket")
    with pytest.raises(ConfigError, match="rule"):
        store.hit("k", huge)
    assert store.hit("k", Rule(10**6, 3600, algorithm="token_bucket")).allowed
    store.close()


def test_bad_options() -> None:
    with pytest.raises(ConfigError, match="prefix"):
        RedisStore.from_url("redis://127.0.0.1:1/0", prefix="a{b}")
    with pytest.raises(ConfigError, match="time_source"):
        RedisStore.from_url("redis://127.0.0.1:1/0", time_source="gps")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="timeout"):
        RedisStore.from_url("redis://127.0.0.1:1/0", timeout=0)
    with pytest.raises(ConfigError, match="breaker_threshold"):
        RedisStore.from_url("redis://127.0.0.1:1/0", breaker_threshold=11)
    with pytest.raises(ConfigError, match="url"):
        RedisClusterStore.from_url("redis+cluster://nohost")
    with pytest.raises(ConfigError, match="url"):
        RedisStore.from_url("redis://127.0.0.1:port/0")


def test_server_time_agrees_across_skewed_clients(server: RedisServer) -> None:
    ahead = FakeClock(start=2_000_000_000.0)
    behind = FakeClock(start=1_000_000_000.0)
    s1 = RedisStore.from_url(server.url, clock=ahead, timeout=1.0)
    s2 = RedisStore.from_url(server.url, clock=behind, timeout=1.0)
    rule = Rule(10, 60, algorithm="fixed_window")
    results = [s.hit("shared", rule) for s in (s1, s2) * 6]
    assert [d.allowed for d in results] == [True] * 10 + [False] * 2
    # both see the same window: reset times agree to well under a second
    assert abs(results[10].retry_after - results[11].retry_after) < 0.5
    # client time with these clocks does not agree on the window: the client behind is
    # held to the newer window the other wrote (no extra admissions), as if its clock
    # were at that window's start, so it waits a whole window
    c1 = RedisStore.from_url(server.url, clock=ahead, time_source="client", prefix="c",
                             timeout=1.0)
    c2 = RedisStore.from_url(server.url, clock=behind, time_source="client", prefix="c",
                             timeout=1.0)
    assert c1.hit("x", rule, cost=10).allowed
    d = c2.hit("x", rule, cost=10)
    assert not d.allowed
    assert d.retry_after == 60.0
    for s in (s1, s2, c1, c2):
        s.close()


@pytest.mark.wheel
def test_wheel_holds_the_lua_scripts_and_the_compiled_hot_path(tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason="building the wheel needs hatchling")
    root = Path(__file__).resolve().parents[2]
    # what the wheel holds does not depend on the C compiler's optimisation: -O0 (a fifth
    # less CPU for the whole build than the release's -O3; the suite's compiled run tests
    # the -O3 build of the install)
    env = {**os.environ, "STORMGUARD_MYPYC_OPT_LEVEL": "0"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(root)], check=True, timeout=300, env=env)
    (wheel,) = tmp_path.glob("stormguard-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    lua = importlib.resources.files("stormguard.stores.redis") / "lua"
    for p in lua.iterdir():
        if p.name.endswith(".lua"):
            assert f"stormguard/stores/redis/lua/{p.name}" in names
    # the dashboard's page and assets (served from the package: no CDN)
    for asset in ("dashboard.html", "dashboard.js", "dashboard.css"):
        assert f"stormguard/service/static/{asset}" in names
    # the build compiled the hot path (hatch_build.py): extension modules, their manifest,
    # the sources they were built from, and a platform tag
    assert "stormguard/_speedups.json" in names
    top = Path(_speedups.__file__).resolve().parents[1]
    compiled = [_speedups.source_path(m).relative_to(top).with_suffix("").as_posix()
                for m in _speedups.COMPILED_MODULES]
    assert "stormguard/ratelimit/algorithms/buckets" in compiled
    for stem in ("stormguard__mypyc", *compiled):
        assert any(n.startswith(stem + ".") and n.endswith(".so") for n in names), stem
    for stem in compiled:
        assert f"{stem}.py" in names
    assert not wheel.name.endswith("-none-any.whl"), wheel.name


def test_the_build_compiles_at_o3_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("hatchling", reason="the build hook needs hatchling")
    spec = importlib.util.spec_from_file_location(
        "hatch_build", Path(__file__).resolve().parents[2] / "hatch_build.py")
    assert spec is not None
    assert spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    monkeypatch.delenv("STORMGUARD_MYPYC_OPT_LEVEL", raising=False)
    assert hook._opt_level() == "3"
    monkeypatch.setenv("STORMGUARD_MYPYC_OPT_LEVEL", "0")
    assert hook._opt_level() == "0"
    monkeypatch.setenv("STORMGUARD_MYPYC_OPT_LEVEL", "fast")
    with pytest.raises(ValueError, match="STORMGUARD_MYPYC_OPT_LEVEL"):
        hook._opt_level()


def test_stormguard_imports_without_redis_py() -> None:
    code = (
        "import sys\n"
        "sys.modules['redis'] = None  # as if redis-py were not installed\n"
        "import stormguard\n"
        "from stormguard import ConfigError, MemoryStore, RateLimiter\n"
        "assert RateLimiter(MemoryStore()).hit('k', stormguard.Rule(1, 1)).allowed\n"
        "try:\n"
        "    RateLimiter('redis://127.0.0.1:1/0')\n"
        "except ConfigError as exc:\n"
        "    assert 'stormguard[redis]' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('no ConfigError')\n"
        "try:\n"
        "    stormguard.RedisStore\n"
        "except ImportError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('RedisStore without redis-py')\n"
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})


def test_log_with_a_large_cost_is_pushed_in_chunks(server: RedisServer, clock: FakeClock) -> None:
    store = RedisStore.from_url(server.url, clock=clock, time_source="client", timeout=1.0)
    rule = Rule(5000, 60, algorithm="sliding_window_log")
    assert store.hit("k", rule, cost=2500).remaining == 2500
    assert server.client().llen(store.key("k", rule)) == 2500
    assert store.hit("k", rule, cost=2500).remaining == 0
    d = store.hit("k", rule)
    assert not d.allowed
    assert d.retry_after == 60.0
    store.close()
