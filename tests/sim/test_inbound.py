"""The inbound side in a simulation: rate limits, tiered load shedding, deferred work.

Every figure is checked against arithmetic stated beside it; every scenario runs the
product's own RateLimiter, RuleSet, Shedder, DeferredQueue and Worker in virtual time.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from stormguard import ConfigError
from stormguard.sim.inbound import Keys
from stormguard.sim.model import run
from stormguard.sim.scenario import dump, from_dict, load


def shop(*, store: str = "shared", instances: int = 2, bot_rate: float = 500,
         clients: list[Any] | None = None, duration: float = 10) -> dict[str, Any]:
    return {
        "name": "limits", "duration": duration, "seed": 3, "measure": {"start": 2, "end": duration},
        "services": {"shop": {
            "instances": instances, "threads": None,
            "rate_limit": {"store": store, "rules": [
                {"name": "per-user", "scope": "user", "limit": 20, "window": "1s",
                 "algorithm": "fixed_window"}]},
            "endpoints": {"browse": {"route": "GET /products", "steps": [{"work": "10ms"}]}}}},
        "traffic": [
            {"name": "users", "target": "shop.browse",
             "keys": {"count": 500, "popularity": "zipf", "exponent": 0.5, "user": "u{i}"},
             "arrival": {"process": "poisson", "rate": 400}},
            {"name": "bot", "target": "shop.browse", "keys": {"user": "bot-1"},
             "arrival": {"process": "constant", "rate": bot_rate},
             "clients": clients or []}]}


def test_a_shared_store_admits_the_bot_at_its_limit_and_no_user_is_denied() -> None:
    r = run(from_dict(shop()))
    # the bot: 500/s against 20 per 1-s window, one store for both instances: 20/s
    assert r.admitted_per_s("bot") == pytest.approx(20, rel=0.02)
    assert r.outcome_rates("bot")["limited"] == pytest.approx(480 / 500, abs=0.01)
    assert r.limited_per_s("shop", "per-user") == pytest.approx(480, rel=0.02)
    # the users: Zipf 0.5 over 500, the top one sends 400 / sum(k^-0.5) = 400 / 43.3
    # = 9.2/s: P(Poisson(9.2) > 20 in a window) is about 1e-3 per second, so over 8 s
    # a denial is possible but rare; the mean user is at 0.8/s
    assert r.outcome_rates("users")["limited"] < 0.001
    assert r.summary()["traffic"]["bot"]["limited_rate"] == pytest.approx(0.96, abs=0.01)


def test_a_shadow_rule_counts_what_it_would_deny_and_refuses_nothing() -> None:
    data = shop()
    data["services"]["shop"]["rate_limit"]["rules"].append(
        {"name": "tighter", "scope": "user", "limit": 5, "window": "1s",
         "algorithm": "fixed_window", "shadow": True})
    data["traffic"] = data["traffic"][1:]  # the bot alone
    r = run(from_dict(data))
    # shadow rules see only what the enforced rules admit: the bot's 20/s, of which a
    # 5/s limit would deny 15/s; the bot still gets its 20/s
    assert r.admitted_per_s("bot") == pytest.approx(20, rel=0.02)
    inbound = r.summary()["inbound"]["shop"]
    assert inbound["shadow_denied_per_s"]["tighter"] == pytest.approx(15, rel=0.05)
    assert "tighter" not in inbound["limited_per_s"]


def test_a_store_per_instance_admits_the_limit_on_each_instance() -> None:
    # round robin: each of the 2 instances sees 250/s of the bot and admits 20/s of it
    r = run(from_dict(shop(store="instance")))
    assert r.admitted_per_s("bot") == pytest.approx(40, rel=0.02)
    r3 = run(from_dict(shop(store="instance", instances=3)))
    assert r3.admitted_per_s("bot") == pytest.approx(60, rel=0.02)


def test_hybrid_stores_syncing_on_the_engine_hold_the_fleet_wide_limit() -> None:
    # a HybridStore per instance over one shared store, each syncing every 100 ms: the
    # bot is held at the one limit, 20/s, across 4 instances (not 4 x 20)
    data = shop(store="hybrid", instances=4, duration=20)
    r = run(from_dict(data))
    assert r.admitted_per_s("bot") == pytest.approx(20, rel=0.03)
    assert r.outcome_rates("users")["limited"] < 0.001
    inbound = r.summary()["inbound"]["shop"]
    assert inbound["rate_limit_store"] == "hybrid"
    # the cold users' checks (400/s over 500 users: a key rarely comes back to the same
    # instance) may each cost a round trip; the bot's 500/s are answered locally between
    # the sync rounds (4 instances x 10 rounds/s) but for a few leases: in all below
    # 400 + 40 + 50, where a store per check would take 900
    assert 0 < inbound["backend_round_trips_per_s"] < 400 + 40 + 50
    assert from_dict(data).services["shop"]["rate_limit"]["sync_interval"] == 0.1


def test_a_client_honours_retry_after_when_configured() -> None:
    # 30/s against 20 per window; one retry, no backoff of its own (base 0)
    retry = {"attempts": 2, "base": 0, "max_delay": "2s", "jitter": "none"}
    ignore = run(from_dict(shop(bot_rate=30, clients=[{"name": "app", "retry": retry}])))
    honour = run(from_dict(shop(bot_rate=30, clients=[
        {"name": "app", "retry": {**retry, "retry_after": True}}])))
    t_ignore = ignore.summary()["traffic"]["bot"]["mean_response_s"]
    t_honour = honour.summary()["traffic"]["bot"]["mean_response_s"]
    # ignoring it, the retry is sent at once and denied in the same window: no wait
    assert t_ignore < 0.02
    # honouring it, a denied request waits until its window ends (Retry-After: uniform
    # over the window's rest, so the denied third waits about 0.5 s): the mean is well up
    assert t_honour > 0.1
    # either way the limit holds: at most 20 of every 30 per second get through
    for r in (ignore, honour):
        assert r.outcome_rates("bot")["success"] <= 20 / 30 + 0.02


def test_zipf_keys_follow_their_popularity() -> None:
    keys = Keys({"count": 1000, "popularity": "zipf", "exponent": 1.0, "user": "u{i}"},
                random.Random(1))
    harmonic = sum(1 / k for k in range(1, 1001))
    assert keys.share(1) == pytest.approx(1 / harmonic)
    n = 200_000
    draws = [keys.rank() for _ in range(n)]
    assert draws.count(1) / n == pytest.approx(1 / harmonic, rel=0.03)
    assert draws.count(10) / n == pytest.approx(0.1 / harmonic, rel=0.1)
    spec = {"count": 1000, "popularity": "zipf", "user": "u{i}", "ip": "10.0.0.{i}"}
    rank = Keys(spec, random.Random(9)).rank()
    attrs = Keys(spec, random.Random(9)).draw("GET", "/x")  # the same draw, as attributes
    assert (attrs.user, attrs.ip, attrs.method, attrs.path) == (
        f"u{rank}", f"10.0.0.{rank}", "GET", "/x")
    # ten million clients: the first 100,000 weights exact, the tail an integral
    for exponent in (1.0, 0.8):
        big = Keys({"count": 10_000_000, "popularity": "zipf", "exponent": exponent,
                    "user": "u{i}"}, random.Random(3))
        exact = sum(k ** -exponent for k in range(1, 10_000_001))
        assert big.share(1) == pytest.approx(1 / exact, rel=1e-6)
        assert big.share(5_000_000) == pytest.approx(5_000_000 ** -exponent / exact, rel=1e-6)
        ranks = [big.rank() for _ in range(n)]
        assert all(1 <= k <= 10_000_000 for k in ranks)
        assert ranks.count(1) / n == pytest.approx(big.share(1), rel=0.05)
        # the tail beyond the exact table holds its share of the draws
        tail = 1 - sum(big.share(k) for k in range(1, 100_001))
        assert sum(1 for k in ranks if k > 100_000) / n == pytest.approx(tail, rel=0.03)
    uniform = Keys({"count": 4, "user": "u{i}", "tier": "free"}, random.Random(2))
    seen = [uniform.rank() for _ in range(40_000)]
    for k in range(1, 5):
        assert seen.count(k) / 40_000 == pytest.approx(0.25, rel=0.05)
    attrs = uniform.draw("GET", "/a")
    assert attrs.tier == "free"
    assert attrs.user in {"u1", "u2", "u3", "u4"}


def shedding(limit: Any, *, cheap_rate: float = 600) -> dict[str, Any]:
    return {
        "name": "shed", "duration": 20, "seed": 4, "measure": {"start": 5, "end": 20},
        "services": {"api": {
            "instances": 1, "threads": None,
            "load_shedding": {"limit": limit, "queue_timeout": "20ms", "priorities": {
                "POST /pay*": "critical", "GET /feed*": "sheddable"}},
            "endpoints": {"pay": {"route": "POST /pay", "steps": [{"work": "100ms"}]},
                          "feed": {"route": "GET /feed", "steps": [{"work": "100ms"}]}}}},
        "traffic": [
            {"name": "pay", "target": "api.pay", "arrival": {"process": "poisson", "rate": 50}},
            {"name": "feed", "target": "api.feed",
             "arrival": {"process": "poisson", "rate": cheap_rate}}]}


def test_shedding_takes_the_sheddable_tier_and_spares_the_critical_one() -> None:
    # limit 20: critical may take all 20 slots, sheddable only while fewer than 10 are
    # taken. Demand: pay 50/s x 0.1 s = 5 slots, feed 600/s x 0.1 s = 60: feed gets at
    # most 10 - 5 = 5 slots, 50/s of its 600/s (plus what the waits let through)
    r = run(from_dict(shedding(20)))
    s = r.summary()
    shed = s["inbound"]["api"]["shedding"]["tiers"]
    assert shed["critical"]["shed"] == 0
    assert s["tiers"]["critical"]["success_rate"] == 1.0
    feed = r.outcome_rates("feed")
    assert feed["shed"] > 0.85
    assert feed["success"] * 600 <= 10 / 0.1 * 1.05  # never more than its cap's worth
    assert s["traffic"]["feed"]["tier"] == "sheddable"
    assert shed["sheddable"]["shed_per_s"] == pytest.approx(600 * feed["shed"], rel=0.05)


def test_a_standing_queue_turns_codel_on_and_a_traffic_priority_overrides_its_route() -> None:
    data = shedding(20)
    # the same feed requests, one source sent as critical (a trusted proxy's header)
    data["traffic"].append({"name": "feed-vip", "target": "api.feed", "priority": "critical",
                            "arrival": {"process": "poisson", "rate": 30}})
    r = run(from_dict(data))
    s = r.summary()
    assert s["traffic"]["feed-vip"]["tier"] == "critical"
    assert s["traffic"]["feed"]["tier"] == "sheddable"
    assert r.outcome_rates("feed-vip")["shed"] == 0.0
    assert r.outcome_rates("feed")["shed"] > 0.8
    bad = shedding(20)
    del bad["services"]["api"]["load_shedding"]
    bad["traffic"][0]["priority"] = "critical"
    with pytest.raises(ConfigError) as err:
        from_dict(bad)
    assert err.value.field == "traffic[0].priority"

    # critical work beyond the limit: 1,100/s x 0.1 s = 110 slots wanted of 100, so
    # critical requests wait (200 ms at most) and their queue stands past CoDel's 5 ms
    # target for its 100 ms interval: from then on the degraded arrivals that would
    # wait are shed at once (reason "codel"), the others when no slot can come in time
    over = shedding(100, cheap_rate=100)
    over["services"]["api"]["load_shedding"]["queue_timeout"] = "200ms"
    over["traffic"][0]["arrival"]["rate"] = 1100
    over["traffic"][1]["priority"] = "degraded"
    s = run(from_dict(over)).summary()
    stats = s["inbound"]["api"]["shedding"]
    assert stats["shed_codel"] > 0
    assert stats["shed_queue_timeout"] > 0  # critical waiters whose 200 ms ran out
    assert s["tiers"]["degraded"]["shed_rate"] == 1.0  # never a slot below its cap of 80
    assert s["tiers"]["critical"]["success_rate"] > 0.85  # about 100 / 110 of them


def test_an_adaptive_limit_follows_a_dependency_that_queues() -> None:
    data = shedding({"adaptive": {"initial": 100, "min": 5, "max": 200}}, cheap_rate=0)
    data["dependencies"] = {"db": {"latency": "10ms", "capacity": 300}}
    data["services"]["api"]["endpoints"]["pay"]["steps"] = [{"call": "db"}]
    data["traffic"] = [{"name": "pay", "target": "api.pay",
                        "arrival": {"process": "poisson", "rate": 400}}]
    r = run(from_dict(data))
    limit = r.summary()["inbound"]["api"]["shedding"]["limit_per_instance"][0]
    # 400/s into a 300/s queue: latency grows without bound, so the limit shrinks from
    # 100 towards the concurrency the db serves at no queueing (300/s x 10 ms = 3)
    assert limit < 50
    assert r.outcome_rates("pay")["shed"] > 0.1


def deferring(*, error_until: float, max_attempts: int = 10) -> dict[str, Any]:
    return {
        "name": "defer", "duration": 30, "seed": 2,
        "dependencies": {"sms": {"latency": "5ms", "error_rate": 1.0,
                                 "changes": [{"at": error_until, "error_rate": 0.0}]}},
        "queues": {"sms": {"call": "sms", "rate": 100, "concurrency": 10,
                           "max_attempts": max_attempts,
                           "backoff": {"base": "200ms", "max_delay": "1s", "jitter": 0}}},
        "services": {"app": {"threads": None, "endpoints": {"order": {"steps": [
            {"call": "sms", "policies": [{"defer": {"queue": "sms"}}]}]}}}},
        "traffic": [{"name": "orders", "target": "app.order",
                     "arrival": {"process": "constant", "rate": 50}}]}


def test_deferred_work_is_drained_after_the_outage_and_none_is_lost() -> None:
    r = run(from_dict(deferring(error_until=5)))
    q = r.summary()["queues"]["sms"]
    # every order of the first 5 s failed its SMS and was deferred: 50/s x 5 s
    assert q["deferred"] == pytest.approx(250, abs=2)
    assert r.outcome_rates("orders", 0, 5)["fallback"] == 1.0
    assert r.outcome_rates("orders", 6, 30)["success"] == 1.0
    assert q["drained"] == q["deferred"]
    assert q["dead"] == q["lost"] == q["pending_at_end"] == q["in_flight_at_end"] == 0
    assert q["peak_pending"] >= 200  # the worker's attempts failed meanwhile (backoff)
    assert q["drained_at_s"] is not None
    assert q["drained_at_s"] <= 5 + 250 / 100 + 2
    assert q["failed_attempts"] > 0


def test_jobs_that_keep_failing_go_to_the_dead_letters() -> None:
    r = run(from_dict(deferring(error_until=1000, max_attempts=2)))
    q = r.summary()["queues"]["sms"]
    assert q["drained"] == 0
    assert q["lost"] == 0
    # two failed attempts each, 0.2 s apart: all but the last second's jobs are dead
    assert q["dead"] + q["pending_at_end"] + q["in_flight_at_end"] == q["deferred"]
    assert q["dead"] >= q["deferred"] - 50 * 2


BAD: list[tuple[str, Any, str]] = [
    ("rule limit", lambda d: d["services"]["shop"]["rate_limit"]["rules"][0].update(limit=0),
     "services.shop.rate_limit.rules[0].limit"),
    ("rule scope", lambda d: d["services"]["shop"]["rate_limit"]["rules"][0].update(
        scope="planet"), "services.shop.rate_limit.rules[0].scope"),
    ("store", lambda d: d["services"]["shop"]["rate_limit"].update(store="redis"),
     "services.shop.rate_limit.store"),
    ("sync_interval", lambda d: d["services"]["shop"]["rate_limit"].update(sync_interval=1),
     "services.shop.rate_limit.sync_interval"),
    ("hybrid sync_interval", lambda d: d["services"]["shop"]["rate_limit"].update(
        store="hybrid", sync_interval="never"), "services.shop.rate_limit.sync_interval"),
    ("route", lambda d: d["services"]["shop"]["endpoints"]["browse"].update(route="/x"),
     "services.shop.endpoints.browse.route"),
    ("keys template", lambda d: d["traffic"][0]["keys"].update(user="everyone"),
     "traffic[0].keys.user"),
    ("keys nobody", lambda d: d["traffic"][1].update(keys={"tier": "free"}), "traffic[1].keys"),
    ("keys popularity", lambda d: d["traffic"][0]["keys"].update(popularity="pareto"),
     "traffic[0].keys.popularity"),
    ("retry_after", lambda d: d["traffic"][1].update(
        clients=[{"name": "app", "retry": {"retry_after": "yes"}}]),
     "traffic[1].clients[0].retry.retry_after"),
    ("shed tier", lambda d: d["services"]["shop"].update(
        load_shedding={"priorities": {"/x*": "vip"}}),
     "services.shop.load_shedding.priorities./x*"),
    ("shed pattern", lambda d: d["services"]["shop"].update(
        load_shedding={"priorities": {"x": "critical"}}), "services.shop.load_shedding.priorities"),
    ("shed shares", lambda d: d["services"]["shop"].update(
        load_shedding={"shares": {"degraded": 0.9, "critical": 0.5}}),
     "services.shop.load_shedding.shares"),
    ("shed limit", lambda d: d["services"]["shop"].update(
        load_shedding={"limit": {"adaptive": {"min": 10, "max": 5}}}),
     "services.shop.load_shedding.limit.adaptive.max"),
    ("queue_timeout", lambda d: d["services"]["shop"].update(
        load_shedding={"queue_timeout": "soon"}), "services.shop.load_shedding.queue_timeout"),
]


@pytest.mark.parametrize(("what", "change", "field"), BAD, ids=[b[0] for b in BAD])
def test_bad_inbound_fields_are_named(what: str, change: Any, field: str) -> None:
    data = shop()
    change(data)
    with pytest.raises(ConfigError) as err:
        from_dict(data)
    assert err.value.field == field, (what, str(err.value))


QUEUE_BAD: list[tuple[str, Any, str]] = [
    ("unknown queue", lambda d: d["services"]["app"]["endpoints"]["order"]["steps"][0].update(
        policies=[{"defer": {"queue": "email"}}]),
     "services.app.endpoints.order.steps[0].policies[0].defer.queue"),
    ("no queue", lambda d: d["services"]["app"]["endpoints"]["order"]["steps"][0].update(
        policies=[{"defer": {}}]),
     "services.app.endpoints.order.steps[0].policies[0].defer.queue"),
    ("call", lambda d: d["queues"]["sms"].update(call="mail"), "queues.sms.call"),
    ("rate", lambda d: d["queues"]["sms"].update(rate=0), "queues.sms.rate"),
    ("backoff", lambda d: d["queues"]["sms"].update(backoff={"base": "2s", "max_delay": "1s"}),
     "queues.sms.backoff.max_delay"),
    ("worker defers", lambda d: d["queues"]["sms"].update(policies=[{"defer": {"queue": "sms"}}]),
     "queues.sms.policies"),
]


@pytest.mark.parametrize(("what", "change", "field"), QUEUE_BAD, ids=[b[0] for b in QUEUE_BAD])
def test_bad_queue_fields_are_named(what: str, change: Any, field: str) -> None:
    data = deferring(error_until=1)
    change(data)
    with pytest.raises(ConfigError) as err:
        from_dict(data)
    assert err.value.field == field, (what, str(err.value))


@pytest.mark.parametrize("data", [shop(), deferring(error_until=3),
                                  shedding({"adaptive": {"initial": 10, "window": "200ms"}})],
                         ids=["limits", "defer", "shedding"])
def test_inbound_scenarios_round_trip(data: dict[str, Any]) -> None:
    scenario = from_dict(copy.deepcopy(data))
    again = load(dump(scenario))
    assert again == scenario
    assert from_dict(scenario.to_dict()) == scenario


def test_the_example_file_is_the_builtin_inbound_night() -> None:
    from pathlib import Path

    from stormguard.sim import salenight

    example = Path(__file__).resolve().parents[2] / "examples" / "sale-night-inbound.yaml"
    assert load(example) == salenight.scenario("inbound")


def test_the_command_shows_429s_shedding_and_queues(tmp_path: Any,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from stormguard.cli import main

    data = shop(duration=6)
    data["services"]["shop"]["load_shedding"] = {"limit": 4, "priorities": {
        "/products*": "sheddable", "POST /checkout*": "critical"}}
    data["dependencies"] = {"sms": {"latency": "5ms", "error_rate": 1.0}}
    data["queues"] = {"sms": {"call": "sms", "rate": 10}}
    data["services"]["shop"]["endpoints"]["order"] = {
        "route": "POST /checkout", "steps": [{"call": "sms", "policies": [
            {"defer": {"queue": "sms"}}]}]}
    data["traffic"].append({"name": "orders", "target": "shop.order",
                            "arrival": {"process": "constant", "rate": 5}})
    path = tmp_path / "front.yaml"
    path.write_text(dump(from_dict(data)), "utf-8")
    png = tmp_path / "front.png"
    assert main(["simulate", str(path), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "429" in text
    assert "503 shed" in text
    assert "rule per-user (shared store) denied" in text
    assert "queue sms: " in text
    assert png.stat().st_size > 10_000
    assert main(["simulate", str(path), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["traffic"]["bot"]["limited_rate"] > 0.9
    assert figures["traffic"]["users"]["shed_rate"] > 0
    assert figures["inbound"]["shop"]["shedding"]["tiers"]["sheddable"]["shed"] > 0
    assert figures["tiers"]["critical"]["traffic"] == ["orders"]
    assert figures["queues"]["sms"]["deferred"] == pytest.approx(5 * 6, abs=1)
    assert figures["queues"]["sms"]["drained"] == 0  # the provider never answers
    from stormguard.sim.report import result_panels

    r = run(from_dict(data))
    titles = [p[0] for p in result_panels(r)]
    assert any("429" in t for t in titles)
    assert any("deferred queues" in t for t in titles)


def test_a_scenario_without_the_inbound_side_takes_the_plain_path() -> None:
    # no rate limits, shedding, keys or queues: no gate, no 429 or 503 rows, no extra
    # sections in the figures (the path and the figures of the plain model)
    data = shop()
    del data["services"]["shop"]["rate_limit"]
    for t in data["traffic"]:
        del t["keys"]
    r = run(from_dict(data))
    assert r.gates == {}
    assert r.queues == {}
    s = r.summary()
    assert "inbound" not in s
    assert "tiers" not in s
    assert r.series.total("bot:limited") == 0
    assert r.outcome_rates("bot")["success"] == 1.0


def test_rules_match_by_api_key_endpoint_tier_and_ip_as_the_service_matches_them() -> None:
    data = {
        "name": "scopes", "duration": 10, "seed": 1, "measure": {"start": 1, "end": 10},
        "services": {"api": {
            "threads": None,
            "rate_limit": {"rules": [
                # API keys on the free tier: 10/s each; the pro tier is not limited
                {"name": "free-keys", "scope": "api_key", "tier": "free", "limit": 10,
                 "window": "1s", "algorithm": "fixed_window"},
                # searches, by client IP: 5/s each; other routes are not limited by it
                {"name": "search-ip", "scope": "ip", "endpoint": "GET /search*",
                 "limit": 5, "window": "1s", "algorithm": "fixed_window"}]},
            "endpoints": {"search": {"route": "GET /search", "steps": [{"work": "1ms"}]},
                          "items": {"route": "GET /items", "steps": [{"work": "1ms"}]}}}},
        "traffic": [
            {"name": "free", "target": "api.items", "keys": {"api_key": "k-free", "tier": "free"},
             "arrival": {"process": "constant", "rate": 50}},
            {"name": "pro", "target": "api.items", "keys": {"api_key": "k-pro", "tier": "pro"},
             "arrival": {"process": "constant", "rate": 50}},
            {"name": "searcher", "target": "api.search", "keys": {"ip": "10.0.0.7"},
             "arrival": {"process": "constant", "rate": 20}},
            {"name": "browser", "target": "api.items", "keys": {"ip": "10.0.0.7"},
             "arrival": {"process": "constant", "rate": 20}}]}
    r = run(from_dict(data))
    assert r.admitted_per_s("free") == pytest.approx(10, rel=0.02)
    assert r.outcome_rates("pro")["limited"] == 0.0
    assert r.admitted_per_s("searcher") == pytest.approx(5, rel=0.02)
    assert r.outcome_rates("browser")["limited"] == 0.0  # the same IP, another route
    assert r.limited_per_s("api", "free-keys") == pytest.approx(40, rel=0.02)
    assert r.limited_per_s("api", "search-ip") == pytest.approx(15, rel=0.02)
