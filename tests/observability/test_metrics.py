"""One metrics schema: Prometheus (read back with prometheus-client's text parser) and
OpenTelemetry (opentelemetry-sdk's InMemoryMetricReader) report the same series, for
components created before and after the exporters were enabled."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stormguard import (
    Bulkhead,
    BulkheadFull,
    CircuitBreaker,
    CircuitOpen,
    ConfigError,
    DeadlineExceeded,
    Fallback,
    RateLimiter,
    Retry,
    RetryBudget,
    RetryBudgetExhausted,
    Rule,
    Timeout,
    observability,
)
from stormguard.observability import metrics
from stormguard.ratelimit.rules import RuleSet, check_plan
from stormguard.testing import FakeClock

ROOT = Path(__file__).resolve().parents[2]

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def prom(registry: CollectorRegistry) -> Series:
    """Every sample of the registry, parsed back from the text exposition."""
    out: Series = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name.startswith("stormguard_") and not s.name.endswith("_created"):
                out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def otel(reader: InMemoryMetricReader) -> Series:
    out: Series = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    attrs = frozenset((k, str(v)) for k, v in p.attributes.items())
                    out[(m.name, attrs)] = float(p.value)
    return out


def value(series: Series, metric: str, /, **labels: str) -> float:
    return series[(metric, frozenset(labels.items()))]


def sms_breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker(window=4, min_calls=3, failure_rate=0.6, open_for=10, name="sms",
                          clock=clock)


def fail() -> None:
    raise OSError("provider down")


def test_breaker_state_and_outcomes_in_both_exporters() -> None:
    clock = FakeClock()
    breaker = sms_breaker(clock)
    registry = CollectorRegistry()
    observability.enable_prometheus(registry)
    reader = InMemoryMetricReader()
    observability.enable_opentelemetry(MeterProvider(metric_readers=[reader]))
    breaker.call(lambda: "ok")
    for _ in range(2):
        with pytest.raises(OSError):
            breaker.call(fail)
    with pytest.raises(CircuitOpen):
        breaker.call(lambda: "never")
    p = prom(registry)
    assert value(p, "stormguard_breaker_state", name="sms", state="open") == 1
    assert value(p, "stormguard_breaker_state", name="sms", state="closed") == 0
    assert value(p, "stormguard_breaker_calls_total", name="sms", outcome="success") == 1
    assert value(p, "stormguard_breaker_calls_total", name="sms", outcome="failure") == 2
    assert value(p, "stormguard_breaker_calls_total", name="sms", outcome="rejected") == 1
    t = ("stormguard_breaker_transitions_total", frozenset(
        {("name", "sms"), ("from", "closed"), ("to", "open")}))
    assert p[t] >= 1
    o = otel(reader)
    # the same series under the same names (OpenTelemetry's counters carry no _total)
    for (name, labels), v in p.items():
        if (name.endswith("_total") and name[:-6] in metrics.SCHEMA) or name in metrics.SCHEMA:
            base = name[:-6] if name.endswith("_total") else name
            assert o[(base, labels)] == v, (name, labels)
    clock.advance(10)
    breaker.call(lambda: "probe")
    p = prom(registry)
    assert value(p, "stormguard_breaker_state", name="sms", state="half_open") == 1


def test_policies_report_their_events() -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    observability.enable_prometheus(registry)
    before = prom(registry)

    def delta(metric: str, /, **labels: str) -> float:
        key = (metric, frozenset(labels.items()))
        return prom(registry).get(key, 0.0) - before.get(key, 0.0)

    retry = Retry(attempts=3, base=0.1, jitter="none", name="checkout-retry", clock=clock,
                  retry_on=OSError)
    with pytest.raises(OSError):
        retry.call(fail)
    assert delta("stormguard_retries_total", name="checkout-retry") == 2
    assert delta("stormguard_retry_gave_up_total", name="checkout-retry",
                 reason="attempts") == 1

    budget = RetryBudget(ratio=0.0, min_per_second=0, clock=clock)
    budgeted = Retry(attempts=3, base=0.1, jitter="none", budget=budget, name="budgeted",
                     clock=clock, retry_on=OSError)
    with pytest.raises(RetryBudgetExhausted):
        budgeted.call(fail)
    assert delta("stormguard_retry_budget_exhausted_total", name="budgeted") == 1

    bulkhead = Bulkhead(1, name="payment", clock=clock)
    gate, inside = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        gate.wait(10)

    t = threading.Thread(target=bulkhead.call, args=(hold,))
    t.start()
    inside.wait(10)
    assert value(prom(registry), "stormguard_bulkhead_in_flight", name="payment") == 1
    with pytest.raises(BulkheadFull):
        bulkhead.call(lambda: None)
    gate.set()
    t.join(10)
    assert delta("stormguard_bulkhead_rejected_total", name="payment") == 1
    assert value(prom(registry), "stormguard_bulkhead_in_flight", name="payment") == 0
    assert value(prom(registry), "stormguard_bulkhead_capacity", name="payment") == 1

    timeout = Timeout(1.0, name="sms-timeout", clock=clock)

    async def slow() -> None:
        await asyncio.sleep(5)  # virtual time: the clock's event loop jumps

    with pytest.raises(DeadlineExceeded):
        clock.run(timeout.acall(slow))
    assert delta("stormguard_timeouts_total", name="sms-timeout", kind="attempt") == 1

    fallback = Fallback(lambda exc: "cached", name="menu", clock=clock)
    assert fallback.call(fail) == "cached"
    assert delta("stormguard_fallbacks_total", name="menu") == 1


def test_limiter_decisions_by_rule_and_result_never_keys() -> None:
    registry = CollectorRegistry()
    observability.enable_prometheus(registry)
    limiter = RateLimiter("memory://", name="api")
    login = Rule.parse("3/minute", name="login")
    for i in range(10_000):  # 10,000 distinct keys: no key ever becomes a label
        limiter.hit(f"user:{i % 2000}", login)
    p = prom(registry)
    mine = {k: v for k, v in p.items() if ("name", "api") in k[1]}
    assert value(p, "stormguard_limiter_decisions_total", name="api", rule="login",
                 result="allowed") == 6000
    assert value(p, "stormguard_limiter_decisions_total", name="api", rule="login",
                 result="denied") == 4000
    assert len(mine) == 2
    label_values = {v for _, labels in p for _, v in labels}
    assert not any(v.startswith("user:") for v in label_values)


def test_shadow_denials_are_counted_as_shadow_denied() -> None:
    metrics.enable()
    limiter = RateLimiter("memory://", name="rules")
    rules = RuleSet.coerce([
        {"name": "enforced", "scope": "user", "limit": 100, "window": 60},
        {"name": "dry", "scope": "user", "limit": 1, "window": 60, "shadow": True},
    ])
    from stormguard.ratelimit.rules import RequestAttrs

    attrs = RequestAttrs("u1", None, None, None, None, None)
    for _ in range(3):
        r = check_plan(limiter, rules.plan(attrs))
        assert r.allowed
    counts = limiter.decision_counts()
    assert counts[("enforced", "allowed")] == 3
    assert counts[("dry", "allowed")] == 1
    assert counts[("dry", "shadow_denied")] == 2
    assert counts.get(("dry", "denied"), 0) == 0


def test_counts_are_exact_under_threads() -> None:
    """8 threads checking at once through one instrumented limiter and one breaker:
    every decision and every outcome is counted (a lost update would show)."""
    metrics.enable()
    limiter = RateLimiter("memory://", name="threads", top_keys=50)
    breaker = CircuitBreaker(window=1000, failure_rate=1.0, name="threads-breaker")
    rule = Rule.parse("500/minute", name="r")
    n, threads = 2000, 8
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        start.wait()
        for i in range(n):
            limiter.hit(f"k{i % 7}", rule)
            breaker.call(lambda: None)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    counts = limiter.decision_counts()
    assert counts[("r", "allowed")] == 7 * 500
    assert counts[("r", "allowed")] + counts[("r", "denied")] == n * threads
    assert breaker.machine.outcomes() == (n * threads, 0, 0)
    assert limiter.top is not None
    assert sum(t.count for t in limiter.top.top(50)) == counts[("r", "denied")]


def test_components_created_before_and_after_enabling_report() -> None:
    """A fresh interpreter: a breaker and a limiter built before the exporters are
    enabled (on their defaults: prometheus-client's registry, the global meter provider),
    another pair after; all four report, to both exporters."""
    script = textwrap.dedent("""
        import json
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from prometheus_client import REGISTRY, generate_latest
        from stormguard import CircuitBreaker, RateLimiter, Rule, observability
        rule = Rule.parse("1/minute", name="r")
        early_b, early_l = CircuitBreaker(name="early"), RateLimiter(name="early")
        from opentelemetry import metrics as otel
        observability.enable_prometheus()  # prometheus-client's default registry
        reader = InMemoryMetricReader()
        otel.set_meter_provider(MeterProvider(metric_readers=[reader]))
        observability.enable_opentelemetry()  # the global meter provider
        late_b, late_l = CircuitBreaker(name="late"), RateLimiter(name="late")
        for b in (early_b, late_b):
            b.force_open()
        for lim in (early_l, late_l):
            lim.hit("k", rule); lim.hit("k", rule)
        text = generate_latest(REGISTRY).decode()
        names = []
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    names += [(m.name, dict(p.attributes), p.value) for p in m.data.data_points]
        print(json.dumps({"prom": text, "otel": names}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=True, cwd=ROOT)
    got = json.loads(out.stdout)
    for name in ("early", "late"):
        assert f'stormguard_breaker_state{{name="{name}",state="open"}} 1.0' in got["prom"]
        assert (f'stormguard_limiter_decisions_total{{name="{name}",result="denied",'
                f'rule="r"}} 1.0') in got["prom"]
        assert ["stormguard_breaker_state", {"name": name, "state": "open"}, 1.0] \
            in got["otel"]
        assert ["stormguard_limiter_decisions", {"name": name, "rule": "r",
                                                 "result": "denied"}, 1] in got["otel"]


def test_enabling_twice_is_harmless_and_bad_arguments_are_named() -> None:
    registry = CollectorRegistry()
    a = observability.enable_prometheus(registry)
    assert observability.enable_prometheus(registry) is a
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    assert observability.enable_opentelemetry(provider) is \
        observability.enable_opentelemetry(provider)
    with pytest.raises(TypeError, match="registry"):
        observability.enable_prometheus("default")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="meter_provider"):
        observability.enable_opentelemetry(42)
    with pytest.raises(ConfigError, match="top_keys"):
        RateLimiter(top_keys=0)
    with pytest.raises(ConfigError, match="name"):
        RateLimiter(name="")


def test_schema_is_documented_in_one_table() -> None:
    doc = (ROOT / "docs" / "observability.md").read_text(encoding="utf-8")
    for name, spec in metrics.SCHEMA.items():
        shown = f"`{name}_total`" if spec.kind == "counter" else f"`{name}`"
        assert shown in doc, name
    # every metric's labels are names from configuration or fixed sets: never a key
    for spec in metrics.SCHEMA.values():
        assert "key" not in spec.labels


class _Component:
    """Stands for a component built alongside, with the ``stats()`` its branch defines
    (the same keys and value types), to hold the mapping to the schema."""

    def __init__(self, name: str, kind: str, stats: dict[str, object]) -> None:
        self.name, self._stats = name, stats
        metrics.track(self, kind)

    def stats(self) -> dict[str, object]:
        return self._stats


def test_planned_components_are_mapped_to_their_stats() -> None:
    registry = CollectorRegistry()
    observability.enable_prometheus(registry)
    parts = [
        _Component("sms-pace", "shaper", {"waiting": 3, "departed": 10, "waited": 4,
                                          "rejected": 2, "paused_for": 0.0}),
        _Component("emails", "queue", {"pending": 5, "in_flight": 1, "dead": 2}),
    ]
    p = prom(registry)
    assert value(p, "stormguard_shaper_queue_depth", name="sms-pace") == 3
    assert value(p, "stormguard_shaper_waits_total", name="sms-pace") == 4
    assert value(p, "stormguard_shaper_rejected_total", name="sms-pace") == 2
    assert value(p, "stormguard_queue_pending", name="emails") == 5
    assert value(p, "stormguard_queue_dead", name="emails") == 2
    del parts


def test_a_component_that_fails_to_answer_hides_only_itself(
        caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        name = "broken-queue"

        def stats(self) -> dict[str, int]:
            raise OSError("queue store down")

    broken = Broken()
    metrics.track(broken, "queue")
    ok = _Component("fine-queue", "queue", {"pending": 1, "in_flight": 0, "dead": 0})
    snap = metrics.snapshot()
    assert snap["stormguard_queue_pending"][("fine-queue",)] == 1
    assert ("broken-queue",) not in snap["stormguard_queue_pending"]
    assert "broken-queue" in caplog.text
    del broken, ok


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from([0, 1, 2]),
                          st.booleans()), max_size=60))
def test_decision_counts_tally_the_answers(calls: list[tuple[str, int, bool]]) -> None:
    """Whatever the mix of keys, rules, hit and hit_all: the counts are the tally of the
    decisions the limiter returned (by the binding rule's name)."""
    metrics.enable()
    limiter = RateLimiter("memory://", name="tally")
    rules = [Rule.parse("2/minute", name="small"), Rule.parse("3/minute", name="mid"),
             Rule.parse("5/minute", name="big")]
    tally: dict[tuple[str, str], int] = {}
    for key, i, several in calls:
        d = (limiter.hit_all(key, rules[i:]) if several else limiter.hit(key, rules[i]))
        assert d.rule is not None
        k = (str(d.rule.name), "allowed" if d.allowed else "denied")
        tally[k] = tally.get(k, 0) + 1
    assert limiter.decision_counts() == tally


def test_async_limiter_counts_and_keeps_top_keys() -> None:
    metrics.enable()
    clock = FakeClock()
    from stormguard import AsyncRateLimiter, MemoryStore

    limiter = AsyncRateLimiter(MemoryStore(clock=clock), name="async", top_keys=10)
    rule = Rule.parse("1/minute", name="r")
    rules = [rule, Rule.parse("10/minute", name="r10")]

    async def run() -> None:
        for _ in range(3):
            await limiter.hit("k1", rule)
        for _ in range(2):
            await limiter.hit_all("k2", rules)

    clock.run(run())
    assert limiter.decision_counts() == {("r", "allowed"): 2, ("r", "denied"): 3}
    assert limiter.top is not None
    assert [(t.key, t.count) for t in limiter.top.top(5)] == [("k1", 2), ("k2", 1)]


@pytest.mark.slow
def test_redis_store_round_trips_errors_and_breaker_state() -> None:
    """A real redis-server: round trips counted; SIGKILLed, the limiter's degraded answers
    show as store errors and the store's breaker as open."""
    from tests.redis_servers import start_redis

    server = start_redis()
    try:
        registry = CollectorRegistry()
        observability.enable_prometheus(registry)
        limiter = RateLimiter(server.url, name="redis-limiter", timeout=0.2,
                              breaker_threshold=2, breaker_cooldown=30)
        store_name = limiter.store_name
        assert store_name == f"redis:127.0.0.1:{server.port}"
        rule = Rule.parse("100/minute", name="api")
        for _ in range(5):
            assert not limiter.hit("k", rule).degraded
        p = prom(registry)
        assert value(p, "stormguard_store_round_trips_total", name=store_name) >= 5
        assert value(p, "stormguard_store_breaker_state", name=store_name,
                     breaker=store_name, state="closed") == 1
        server.stop()
        for _ in range(4):
            assert limiter.hit("k", rule).degraded
        p = prom(registry)
        assert value(p, "stormguard_store_errors_total", name=store_name) == 4
        assert value(p, "stormguard_limiter_decisions_total", name="redis-limiter",
                     rule="api", result="degraded") == 4
        assert value(p, "stormguard_store_breaker_state", name=store_name,
                     breaker=store_name, state="open") == 1
        t = ("stormguard_breaker_transitions_total", frozenset(
            {("name", store_name), ("from", "closed"), ("to", "open")}))
        assert p[t] == 1
        limiter.close()
    finally:
        server.stop()


def test_the_service_client_reports_its_breaker() -> None:
    """``ServiceStore`` to a port nothing listens on (a real refused connection): its
    breaker opens and reports, state and transition, under ``service:host:port``."""
    from stormguard import StorageError
    from stormguard.client import ServiceStore
    from tests.redis_servers import free_port

    registry = CollectorRegistry()
    observability.enable_prometheus(registry)
    port = free_port()
    store = ServiceStore(f"http://127.0.0.1:{port}", timeout=0.5, breaker_threshold=2,
                         breaker_cooldown=30)
    limiter = RateLimiter(store, name="via-service")
    rule = Rule.parse("10/minute", name="api")
    for _ in range(3):
        assert limiter.hit("k", rule).degraded
    name = f"service:127.0.0.1:{port}"
    p = prom(registry)
    assert value(p, "stormguard_store_breaker_state", name=name, breaker=name,
                 state="open") == 1
    assert value(p, "stormguard_store_errors_total", name=name) == 3
    assert p[("stormguard_breaker_transitions_total",
              frozenset({("name", name), ("from", "closed"), ("to", "open")}))] == 1
    assert ("stormguard_store_round_trips_total", frozenset({("name", name)})) not in p
    with pytest.raises(StorageError):
        store.hit("k", rule)
    store.close()


def test_each_opentelemetry_collection_reads_current_values() -> None:
    reader = InMemoryMetricReader()
    observability.enable_opentelemetry(MeterProvider(metric_readers=[reader]))
    limiter = RateLimiter("memory://", name="fresh")
    rule = Rule.parse("1/minute", name="r")
    seen = []
    for _ in range(3):  # collections back to back: each sees the hit made just before
        limiter.hit("k", rule)
        o = otel(reader)
        seen.append(o.get(("stormguard_limiter_decisions", frozenset(
            {("name", "fresh"), ("rule", "r"), ("result", "denied")})), 0.0))
    assert seen == [0.0, 1.0, 2.0]


_REGISTRY = CollectorRegistry()
_READER = InMemoryMetricReader()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(["ok", "fail", "hit", "hit_other", "force", "reset"]),
                max_size=40))
def test_both_exporters_always_report_the_same_series(ops: list[str]) -> None:
    """Whatever happened, Prometheus and OpenTelemetry hold the same series with the same
    values (OpenTelemetry's counter names without ``_total``)."""
    gc.collect()  # the breakers of earlier examples (a reference cycle) go now, not between
    observability.enable_prometheus(_REGISTRY)
    if not _PROVIDERS:
        _PROVIDERS.append(MeterProvider(metric_readers=[_READER]))
    observability.enable_opentelemetry(_PROVIDERS[0])
    clock = FakeClock()
    breaker = CircuitBreaker(window=4, min_calls=2, open_for=5, name="prop-breaker",
                             clock=clock)
    limiter = RateLimiter("memory://", name="prop-limiter")
    rules = [Rule.parse("3/minute", name="a"), Rule.parse("1/minute", name="b")]
    for op in ops:
        if op in ("ok", "fail"):
            with contextlib.suppress(OSError, CircuitOpen):
                breaker.call(fail if op == "fail" else (lambda: None))
        elif op == "hit":
            limiter.hit("k", rules[0])
        elif op == "hit_other":
            limiter.hit_all("k", rules)
        elif op == "force":
            breaker.force_open()
        else:
            breaker.reset()
        clock.advance(1)
    p = {(n[:-6] if n.endswith("_total") else n, labels): v
         for (n, labels), v in prom(_REGISTRY).items()}
    assert p == otel(_READER)
    del breaker, limiter


_PROVIDERS: list[MeterProvider] = []


def test_overload_protection_reports() -> None:
    """A real Shedder at its limit, a ConcurrencyLimit and a client-side throttle: limit,
    in flight, sheds by tier, rejections and probability, once each (a ConcurrencyLimit's
    shedder is the one registered)."""
    import random

    from stormguard import Shed, Throttled
    from stormguard.overload import Shedder
    from stormguard.overload.shedder import CRITICAL, SHEDDABLE
    from stormguard.resilience.concurrency import ConcurrencyLimit
    from stormguard.resilience.throttle import AdaptiveThrottle

    registry = CollectorRegistry()
    observability.enable_prometheus(registry)
    clock = FakeClock()
    shedder = Shedder(2, queue_timeout=0, name="api-shedder", clock=clock)
    tickets = [shedder.try_acquire(CRITICAL), shedder.try_acquire(CRITICAL)]
    shed = [shedder.try_acquire(SHEDDABLE) for _ in range(3)]
    assert all(isinstance(x, Shed) for x in shed)
    limit = ConcurrencyLimit(5, name="db-limit", clock=clock)
    throttle = AdaptiveThrottle(k=1.0, window=60, rng=random.Random(7), name="upstream",
                                on=OSError, clock=clock)
    throttled = 0
    for _ in range(200):
        try:
            throttle.call(fail)
        except Throttled:
            throttled += 1
        except OSError:
            pass
    p = prom(registry)
    stats = shedder.stats()
    assert value(p, "stormguard_concurrency_limit_in_flight", name="api-shedder") == 2
    assert value(p, "stormguard_adaptive_limit", name="api-shedder") == 2
    assert value(p, "stormguard_shed_total", name="api-shedder", tier="sheddable") == \
        stats["shed"]["sheddable"] > 0
    # 5, not 10: the ConcurrencyLimit's shedder is registered, the policy is not as well
    assert value(p, "stormguard_adaptive_limit", name="db-limit") == 5
    assert throttled > 0
    assert value(p, "stormguard_throttled_total", name="upstream") == throttled
    assert value(p, "stormguard_throttle_probability", name="upstream") == \
        pytest.approx(throttle.stats()["probability"])
    for t in tickets:
        shedder.release(t)  # type: ignore[arg-type]
    del limit


def test_a_hybrid_store_reports_its_syncs() -> None:
    from stormguard.stores.hybrid import HybridStore

    registry = CollectorRegistry()
    observability.enable_prometheus(registry)
    clock = FakeClock()
    store = HybridStore.from_url("hybrid+memory://", clock=clock, sync_interval=None,
                                 name="edge-hybrid")
    limiter = RateLimiter(store, name="edge")
    rule = Rule.parse("1000/minute", name="api")
    for _ in range(20):
        limiter.hit("k", rule)
    store.sync()
    stats = store.stats()
    p = prom(registry)
    assert value(p, "stormguard_hybrid_syncs_total", name="edge-hybrid") == stats["syncs"] >= 1
    assert value(p, "stormguard_hybrid_local_decisions_total", name="edge-hybrid") == \
        stats["local_decisions"]
    assert value(p, "stormguard_hybrid_degraded", name="edge-hybrid") == 0
    store.close()


def test_a_real_shaper_reports_its_queue_waits_and_rejections() -> None:
    """A Shaper on a FakeClock: 3 calls at 10/s with max_wait 0.15 s: the first leaves at
    once, the second waits 0.1 s, the third would wait 0.2 s and is rejected."""
    from stormguard import Shaper, ShaperFull

    registry = CollectorRegistry()
    observability.enable_prometheus(registry)
    clock = FakeClock()
    shaper = Shaper(rate=10, per=1.0, max_wait=0.15, name="sms-provider", clock=clock)

    async def burst() -> list[object]:
        async def one() -> str:
            return "sent"
        return await asyncio.gather(*(shaper.acall(one) for _ in range(3)),
                                    return_exceptions=True)

    results = clock.run(burst())
    assert results[:2] == ["sent", "sent"]
    assert isinstance(results[2], ShaperFull)
    p = prom(registry)
    assert value(p, "stormguard_shaper_waits_total", name="sms-provider") == 1
    assert value(p, "stormguard_shaper_rejected_total", name="sms-provider") == 1
    assert value(p, "stormguard_shaper_queue_depth", name="sms-provider") == 0


def test_a_real_deferred_queue_reports_pending_and_dead(tmp_path: Path) -> None:
    """A SQLite queue: 3 jobs deferred, one of an unknown task drained to the dead
    letters; the gauges read the queue's own stats() at each scrape."""
    from stormguard import DeferredQueue

    registry = CollectorRegistry()
    observability.enable_prometheus(registry)
    q = DeferredQueue(f"sqlite:///{tmp_path / 'q.db'}", name="sms")
    for i in range(3):
        q.defer("send_sms", {"order": i})
    q.defer("no_such_task", {})
    p = prom(registry)
    assert value(p, "stormguard_queue_pending", name="sms") == 4
    worker = q.worker({"send_sms": lambda order: None}, concurrency=1)
    worker.drain(timeout=10.0)
    p = prom(registry)
    assert value(p, "stormguard_queue_pending", name="sms") == 0
    assert value(p, "stormguard_queue_dead", name="sms") == 1
    assert value(p, "stormguard_queue_in_flight", name="sms") == 0
    assert q.stats() == {"pending": 0, "in_flight": 0, "dead": 1}
