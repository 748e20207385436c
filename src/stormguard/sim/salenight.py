"""The built-in ``sale-night`` suite: the night of the checkout and the SMS provider.

Checkout runs on 4 instances of 200 threads (800 in all) and takes 1,000 orders/s
(Poisson). An order holds its thread for 0.1 s of its own work, a payment call
(0.12 s) and an inventory call (0.08 s): 0.3 s, the arithmetic's figure. Then it
sends a confirmation SMS. The provider answers in 5 ms normally; at ``t = 5 s`` it
slows to 30 s (or, for the retry storm, fails every call in 20 ms).

Each figure is one scenario (built here as data and validated like a file), run with
the real policies. Thread figures are the busy threads the scenario *needs*: the time
average of threads in use with an unbounded pool (Little's law measured), except
where the 800-thread pool itself is the question.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stormguard.sim.model import Result, run
from stormguard.sim.report import (
    Panel,
    Report,
    busy_line,
    calls_line,
    outcome_lines,
    result_panels,
)
from stormguard.sim.scenario import Scenario, from_dict

__all__ = ["DOCUMENTS", "SaleNight", "inbound", "inbound_figures", "inbound_rows", "report",
           "scenario", "scenarios", "simulate"]

SLOWDOWN_AT = 5.0

#: The classic arithmetic (Little's law, retry multiplication), for the table and tests.
DOCUMENTS: dict[str, Any] = {
    "threads": {"available": 800, "normal": 300, "slow_dependency": 30_300,
                "with_timeout": 1_300, "breaker_open": 300},
    "retry_storm": {"calls_per_tap": 16, "two_layers_per_s": 16_000, "one_layer_per_s": 4_000,
                    "with_budget_per_s": 1_100},
    "breaker_opened_within_s": 3.0,
    "bulkhead": {"payment_success_rate": 1.0, "inventory_success_rate": 1.0},
    # the inbound night (scenario "inbound"): a bot at 500 requests/s against a per-user
    # limit of 20/s on one shared store; 1,000 users at 2.1 requests/s each at the peak
    # (never near 20); the surge at 3x sheds the sheddable tier first (its cap, 50 of the
    # 100 slots per instance, is below the 52.5 that critical and degraded work takes at
    # 3x) and never the critical one; the SMS sent while the provider is slow (300 orders/s
    # for 15 s) are deferred and all of them drained, none lost
    # (the deferrals' arithmetic depends on when each breaker closes again: it is computed
    # from the run, 150 orders/s per instance x the time from the slowdown to that)
    "inbound": {"bot_admitted_per_s": 20, "users_limited": 0, "critical_shed": 0,
                "lost": 0, "dead": 0},
}

#: the inbound night's timeline: the surge (3x) from 20 s to 60 s, the SMS provider at
#: 30 s latency from 30 s to 45 s
SURGE = (20.0, 60.0)
SMS_SLOW = (30.0, 45.0)

_BREAKER = {"circuit_breaker": {"window": 20, "failure_rate": 0.5, "open_for": "30s",
                                "half_open_calls": 3}}


def _base(name: str, duration: float, measure: tuple[float, float], *, threads: int | None,
          sms: dict[str, Any], sms_policies: list[Any], other: list[Any] | None = None,
          clients: list[Any] | None = None, description: str = "") -> dict[str, Any]:
    other = other or [[], []]
    return {
        "name": name, "description": description, "duration": duration, "seed": 11,
        "measure": {"start": measure[0], "end": measure[1]},
        "dependencies": {"payment": {"latency": "120ms"}, "inventory": {"latency": "80ms"},
                         "sms": sms},
        "services": {"checkout": {"instances": 4, "threads": threads, "endpoints": {
            "order": {"steps": [
                {"work": "100ms"},
                {"call": "payment", "policies": other[0]},
                {"call": "inventory", "policies": other[1]},
                {"call": "sms", "policies": sms_policies}]},
            "cart": {"steps": [{"work": "50ms"}]}}}},
        "traffic": [{"name": "orders", "target": "checkout.order",
                     "arrival": {"process": "poisson", "rate": 1000},
                     "clients": clients or []}],
    }


def _slow() -> dict[str, Any]:
    return {"latency": "5ms", "changes": [{"at": SLOWDOWN_AT, "latency": "30s"}]}


def _down() -> dict[str, Any]:
    return {"latency": "20ms", "error_rate": 1.0}


def scenarios() -> dict[str, dict[str, Any]]:
    """Every scenario of the suite, as scenario-file mappings."""
    s: dict[str, dict[str, Any]] = {}
    s["normal"] = _base("normal", 30, (5, 30), threads=None, sms={"latency": "5ms"},
                        sms_policies=[], description="a normal night: 1,000 orders/s")
    s["slow_dependency"] = _base(
        "slow_dependency", 80, (45, 80), threads=None, sms=_slow(), sms_policies=[],
        description="the SMS provider at 30 s, no timeout: the threads it would take")
    pool = _base("slow_dependency_800", 15, (8, 15), threads=200, sms=_slow(), sms_policies=[],
                 description="the same on the real 800 threads, with unrelated cart views")
    pool["traffic"].append({"name": "cart", "target": "checkout.cart",
                            "arrival": {"process": "poisson", "rate": 200},
                            "clients": [{"name": "app", "timeout": "3s"}]})
    s["slow_dependency_800"] = pool
    s["with_timeout"] = _base("with_timeout", 40, (10, 40), threads=None, sms=_slow(),
                              sms_policies=[{"timeout": "1s"}],
                              description="a 1 s timeout on the SMS call")
    s["breaker"] = _base("breaker", 34, (10, 34), threads=None, sms=_slow(),
                         sms_policies=[{"fallback": {"value": "queued"}}, _BREAKER,
                                       {"timeout": "1s"}],
                         description="fallback (queue the SMS), breaker, 1 s timeout")
    app_retry = [{"name": "app", "retry": {"attempts": 4, "base": "100ms", "max_delay": "1s"}}]
    retry3 = {"retry": {"attempts": 4, "base": "100ms", "max_delay": "1s"}}
    s["two_layers"] = _base("two_layers", 10, (4, 10), threads=None, sms=_down(),
                            sms_policies=[retry3], clients=app_retry,
                            description="SMS down; the app retries 3 times above checkout "
                                        "retrying 3 times")
    s["one_layer"] = _base("one_layer", 10, (4, 10), threads=None, sms=_down(),
                           sms_policies=[{"fallback": {}}, retry3],
                           description="one retry layer of 3, then the fallback")
    budget = {"retry": {"attempts": 4, "base": "100ms", "max_delay": "1s",
                        "budget": {"ratio": 0.1}}}
    s["with_budget"] = _base("with_budget", 15, (5, 15), threads=None, sms=_down(),
                             sms_policies=[{"fallback": {}}, budget],
                             description="the same with a 10 % retry budget")
    bulk = _base("bulkhead", 30, (10, 30), threads=200, sms=_slow(),
                 sms_policies=[{"fallback": {}}, {"bulkhead": {"max_concurrent": 20}}],
                 other=[[{"bulkhead": {"max_concurrent": 100}}],
                        [{"bulkhead": {"max_concurrent": 80}}]],
                 description="SMS at 30 s, bulkheads: SMS 20, payment 100, inventory 80 threads")
    s["bulkhead"] = bulk
    s["inbound"] = inbound()
    s["no_bulkhead"] = _base("no_bulkhead", 30, (10, 30), threads=200, sms=_slow(),
                             sms_policies=[{"fallback": {}}],
                             description="the same without the bulkheads")
    return s


def inbound() -> dict[str, Any]:
    """The night seen from the front door: rate limits, load shedding, deferred SMS."""
    breaker = {"circuit_breaker": {"window": 20, "failure_rate": 0.5, "open_for": "5s",
                                   "half_open_calls": 3}}

    def surge(rate: float) -> list[dict[str, Any]]:
        return [{"at": 0, "rate": rate}, {"at": SURGE[0], "rate": 3 * rate, "ramp": "2s"},
                {"at": SURGE[1], "rate": rate}]

    users = {"count": 1000, "user": "user-{i}"}
    return {
        "name": "inbound", "seed": 11, "duration": 90,
        "description": "3x surge at 20-60 s, SMS at 30 s latency from 30 to 45 s; a bot at "
                       "500 requests/s; per-user limit 20/s, tiered shedding, SMS deferred",
        "measure": {"start": 25, "end": 55},
        "dependencies": {
            "payment": {"latency": "100ms"},
            "sms": {"latency": "5ms", "changes": [{"at": SMS_SLOW[0], "latency": "30s"},
                                                 {"at": SMS_SLOW[1], "latency": "5ms"}]}},
        "queues": {"sms": {"call": "sms", "rate": 300, "concurrency": 50,
                           "policies": [breaker, {"timeout": "2s"}]}},
        "services": {"shop": {
            "instances": 2, "threads": None,
            "rate_limit": {"store": "shared", "rules": [
                {"name": "per-user", "scope": "user", "limit": 20, "window": "1s",
                 "algorithm": "fixed_window"}]},
            "load_shedding": {"limit": 100, "queue_timeout": "50ms", "priorities": {
                "POST /checkout*": "critical", "GET /products*": "degraded",
                "GET /recommendations*": "sheddable"}},
            "endpoints": {
                "order": {"route": "POST /checkout", "steps": [
                    {"work": "100ms"}, {"call": "payment"},
                    {"call": "sms", "policies": [{"defer": {"queue": "sms"}}, breaker,
                                                 {"timeout": "300ms"}]}]},
                "browse": {"route": "GET /products", "steps": [{"work": "50ms"}]},
                "recommendations": {"route": "GET /recommendations",
                                    "steps": [{"work": "100ms"}]}}}},
        "traffic": [
            {"name": "orders", "target": "shop.order", "keys": users,
             "arrival": {"process": "poisson", "rate": surge(100)}},
            {"name": "browse", "target": "shop.browse", "keys": users,
             "arrival": {"process": "poisson", "rate": surge(300)}},
            {"name": "recommendations", "target": "shop.recommendations", "keys": users,
             "arrival": {"process": "poisson", "rate": surge(300)}},
            {"name": "bot", "target": "shop.browse", "keys": {"user": "bot-1"},
             "arrival": {"process": "constant", "rate": 500}}],
    }


def inbound_figures(r: Result) -> dict[str, Any]:
    """The inbound night's figures (see ``DOCUMENTS["inbound"]``)."""
    lo, hi = r.window()
    users = ("orders", "browse", "recommendations")
    shed = r.inbound_summary()["shop"]["shedding"]["tiers"]
    tiers = r.tier_summary()
    q = r.queue_summary()["sms"]
    before = r.series.total("shed:shop:sheddable", 0, SURGE[0])
    # the arithmetic of the deferrals: every SMS call of an instance from the slowdown
    # until its breaker closes again (a probe after the recovery) is deferred, at that
    # instance's share of the orders (round robin)
    closed: dict[str, float] = {}
    for at, name, _old, new in r.transitions:
        policy, _, inst = name.partition("#")
        if policy == "sms" and inst != "-1" and new == "closed" and at >= SMS_SLOW[1]:
            closed.setdefault(inst, at)
    per_instance = 3 * 100 / r.scenario.services["shop"]["instances"]
    expected = sum(per_instance * (at - SMS_SLOW[0]) for at in closed.values())
    return {
        "bot_admitted_per_s": round(r.admitted_per_s("bot"), 2),
        "bot_limited_rate": round(r.outcome_rates("bot")["limited"], 4),
        "users_limited": sum(r.series.total(f"{t}:limited") for t in users),
        "shed_rate": {t: round(tiers[t]["shed_rate"], 4) for t in tiers},
        "shed": {t: v["shed"] for t, v in shed.items()},
        "shed_before_surge": before,
        "critical_served_rate": round(tiers["critical"]["success_rate"]
                                      + tiers["critical"]["fallback_rate"], 4),
        "deferred": q["deferred"], "deferred_arithmetic": round(expected),
        # the orders that arrived while the provider was slow (every one's SMS deferred)
        "orders_while_slow": r.series.total("orders:arrivals", *SMS_SLOW),
        "deferred_of_those": r.series.total("orders:fallback", *SMS_SLOW),
        "breakers_closed_at_s": sorted(round(at, 3) for at in closed.values()),
        "drained": q["drained"], "dead": q["dead"],
        "lost": q["lost"], "pending_at_end": q["pending_at_end"] + q["in_flight_at_end"],
        "peak_pending": q["peak_pending"], "drained_at_s": q["drained_at_s"],
        "window_s": [lo, hi]}


def inbound_rows(ib: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The inbound night's rows of the table: (figure, simulated, arithmetic, difference)."""
    doc = DOCUMENTS["inbound"]

    def diff(sim: float, ref: float) -> str:
        return f"{(sim - ref) / ref:+.1%}" if ref else ""

    return [
        ("bot admitted per s (500/s, per-user limit 20/s)", f"{ib['bot_admitted_per_s']:.1f}",
         f"{doc['bot_admitted_per_s']:.1f}",
         diff(ib["bot_admitted_per_s"], doc["bot_admitted_per_s"])),
        ("users' requests denied (2.1/s each at the peak)", f"{ib['users_limited']:,}", "0", ""),
        ("sheddable requests shed at 3x", f"{ib['shed_rate']['sheddable']:.1%}", "most",
         f"degraded: {ib['shed_rate']['degraded']:.1%}"),
        ("critical requests served at 3x", f"{ib['critical_served_rate']:.1%}", "all",
         f"shed: {ib['shed']['critical']:,}"),
        ("SMS deferred, slowdown until each breaker closes", f"{ib['deferred']:,}",
         f"{ib['deferred_arithmetic']:,}", diff(ib["deferred"], ib["deferred_arithmetic"])),
        ("SMS drained / dead / lost", f"{ib['drained']:,} / {ib['dead']:,} / {ib['lost']:,}",
         "all / 0 / 0", ""),
    ]


@dataclass
class SaleNight:
    """The suite's results and figures."""

    results: dict[str, Result]
    figures: dict[str, Any] = field(default_factory=dict)

    def table(self) -> list[tuple[str, str, str, str]]:
        """(figure, simulated, arithmetic, difference) rows."""
        f, d = self.figures, DOCUMENTS
        rows: list[tuple[str, str, str, str]] = []

        def row(label: str, sim: float, doc: float | None, fmt: str = "{:,.0f}") -> None:
            diff = "" if doc in (None, 0) else f"{(sim - doc) / doc:+.1%}"
            rows.append((label, fmt.format(sim), "" if doc is None else fmt.format(doc), diff))

        th, dth = f["threads"], d["threads"]
        row("busy threads, normal", th["normal"], dth["normal"])
        row("busy threads, SMS at 30 s", th["slow_dependency"], dth["slow_dependency"])
        row("busy threads, 1 s timeout", th["with_timeout"], dth["with_timeout"])
        row("busy threads, breaker open", th["breaker_open"], dth["breaker_open"])
        ex = f["pool_800"]
        rows.append(("800 threads all busy after the slowdown",
                     "never" if ex["exhausted_after_s"] is None
                     else f"{ex['exhausted_after_s']:.2f} s", "within 1 s", ""))
        rows.append(("cart views answered within 3 s, pool exhausted",
                     f"{ex['cart_success_rate']:.0%}", "blocked too", ""))
        rs, drs = f["retry_storm"], d["retry_storm"]
        row("SMS calls per tap, two retry layers", rs["calls_per_tap"], drs["calls_per_tap"],
            "{:.2f}")
        row("SMS calls/s, two layers", rs["two_layers_per_s"], drs["two_layers_per_s"])
        row("SMS calls/s, one layer of 3", rs["one_layer_per_s"], drs["one_layer_per_s"])
        row("SMS calls/s, 10 % budget", rs["with_budget_per_s"], drs["with_budget_per_s"])
        opened = f["breaker_opened_after_s"]
        rows.append(("breaker opened after the slowdown",
                     "never" if opened is None else f"{opened:.2f} s", "within 3 s", ""))
        b = f["bulkhead"]
        rows.append(("payment calls served, bulkheads", f"{b['payment_success_rate']:.1%}",
                     "full speed", f"without: {b['without']['payment_success_rate']:.1%}"))
        rows.append(("inventory calls served, bulkheads", f"{b['inventory_success_rate']:.1%}",
                     "full speed", f"without: {b['without']['inventory_success_rate']:.1%}"))
        if f.get("inbound") is not None:
            rows += inbound_rows(f["inbound"])
        return rows

    def panels(self) -> list[Panel]:
        """Busy threads needed, SMS calls/s in the storm, order outcomes with the breaker."""
        r = self.results
        threads = [(label, *busy_line(r[key], "checkout")) for label, key in (
            ("normal", "normal"), ("SMS at 30 s", "slow_dependency"),
            ("1 s timeout", "with_timeout"), ("breaker + fallback", "breaker"))]
        calls = [(label, *calls_line(r[key], "sms")) for label, key in (
            ("two retry layers", "two_layers"), ("one layer of 3", "one_layer"),
            ("10 % budget", "with_budget"))]
        return [("busy threads needed by checkout (the SMS provider slows at 5 s)", "threads",
                 True, threads),
                ("SMS calls/s with the provider down, 1,000 orders/s", "calls/s", False, calls),
                ("orders by outcome, breaker + fallback + 1 s timeout", "share", False,
                 outcome_lines(r["breaker"], "orders")),
                *[(f"inbound night: {title}", ylabel, log, lines)
                  for title, ylabel, log, lines in result_panels(r["inbound"])[3:]]]

    def text(self) -> str:
        rows = [("figure", "simulated", "arithmetic", "difference"), *self.table()]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = []
        for k, r in enumerate(rows):
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(r, widths, strict=True))))
            if k == 0:
                lines.append("  ".join("-" * w for w in widths))
        events = sum(r.events for r in self.results.values())
        lines.append("")
        lines.append(f"{len(self.results)} scenarios, {events:,} events in virtual time")
        return "\n".join(lines)


def _served(r: Result, dep: str, traffic: str = "orders") -> float:
    """Calls of ``dep`` answered per order that arrived, over the window (at most 1: the
    calls at the window's edges belong to orders of the next or previous bucket)."""
    lo, hi = r.window()
    ok = r.series.total(f"dep:{dep}:ok", lo, hi)
    arrived = r.series.total(f"{traffic}:arrivals", lo, hi)
    return min(1.0, ok / arrived) if arrived else 0.0


def simulate(progress: Callable[[str], None] | None = None) -> SaleNight:
    """Run the whole suite (about 350,000 simulated requests)."""
    results: dict[str, Result] = {}
    for name, data in scenarios().items():
        if progress is not None:
            progress(name)
        results[name] = run(from_dict(copy.deepcopy(data)))
    r = results
    lo, hi = r["two_layers"].window()
    taps = r["two_layers"].series.rate("orders:arrivals", lo, hi)
    two = r["two_layers"].calls_per_s("sms")
    pool = r["slow_dependency_800"]
    full = pool.first_full_at["checkout"]
    opened = r["breaker"].opened_at("sms")
    figures: dict[str, Any] = {
        "threads": {"available": pool.threads["checkout"],
                    "normal": round(r["normal"].busy_threads("checkout"), 1),
                    "slow_dependency": round(r["slow_dependency"].busy_threads("checkout"), 1),
                    "with_timeout": round(r["with_timeout"].busy_threads("checkout"), 1),
                    "breaker_open": round(r["breaker"].busy_threads("checkout"), 1)},
        "retry_storm": {"calls_per_tap": round(two / taps, 3) if taps else 0.0,
                        "two_layers_per_s": round(two, 1),
                        "one_layer_per_s": round(r["one_layer"].calls_per_s("sms"), 1),
                        "with_budget_per_s": round(r["with_budget"].calls_per_s("sms"), 1)},
        "breaker_opened_after_s": None if opened is None else round(opened - SLOWDOWN_AT, 3),
        "bulkhead": {"payment_success_rate": round(_served(r["bulkhead"], "payment"), 4),
                     "inventory_success_rate": round(_served(r["bulkhead"], "inventory"), 4),
                     "without": {
                         "payment_success_rate": round(_served(r["no_bulkhead"], "payment"), 4),
                         "inventory_success_rate": round(_served(r["no_bulkhead"],
                                                                 "inventory"), 4)}},
        "pool_800": {"exhausted_after_s": None if full is None else round(full - SLOWDOWN_AT, 3),
                     "cart_success_rate": round(pool.outcome_rates("cart")["success"], 4),
                     "orders_queued_mean": round(pool.queued["checkout"].mean(*pool.window()),
                                                 1)},
        "inbound": inbound_figures(r["inbound"]),
        "arithmetic": DOCUMENTS,
    }
    return SaleNight(results=results, figures=figures)


def scenario(name: str) -> Scenario:
    """One scenario of the suite, validated."""
    return from_dict(copy.deepcopy(scenarios()[name]))


def report() -> Report:
    """The suite as ``stormguard simulate sale-night`` shows it."""
    sn = simulate()
    return Report(title="stormguard simulate sale-night", text=sn.text(), figures=sn.figures,
                  panels=sn.panels(),
                  scenarios={name: r.scenario.description for name, r in sn.results.items()})
