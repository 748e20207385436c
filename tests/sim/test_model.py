"""The capacity model: arrivals, Little's law, queues, errors, changes, policies, clients."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard.sim.model import Result, run
from stormguard.sim.scenario import from_dict


def scenario(*, duration: float = 10, measure: tuple[float, float] | None = None,
             deps: dict[str, Any] | None = None, steps: list[Any] | None = None,
             threads: int | None = None, instances: int = 1, rate: Any = 100,
             process: str = "constant", clients: list[Any] | None = None,
             queue_limit: int | None = None, seed: int = 1) -> Result:
    data: dict[str, Any] = {
        "name": "t", "duration": duration, "seed": seed,
        "dependencies": deps or {},
        "services": {"svc": {"instances": instances, "threads": threads,
                             "queue_limit": queue_limit,
                             "endpoints": {"ep": {"steps": steps or [{"work": 0.1}]}}}},
        "traffic": [{"name": "req", "target": "svc.ep",
                     "arrival": {"process": process, "rate": rate},
                     "clients": clients or []}]}
    if measure is not None:
        data["measure"] = {"start": measure[0], "end": measure[1]}
    return run(from_dict(data))


@settings(max_examples=12, deadline=None)
@given(rate=st.integers(20, 400), work=st.floats(0.05, 1.0), instances=st.integers(1, 4))
def test_busy_threads_follow_littles_law(rate: int, work: float, instances: int) -> None:
    """Measured (the time average of threads in use), not assumed: rate x time each."""
    r = scenario(duration=8, measure=(3, 8), rate=rate, steps=[{"work": work}],
                 instances=instances)
    assert r.busy_threads("svc") == pytest.approx(rate * work, rel=0.02)
    assert r.outcome_rates("req")["success"] == 1.0


def test_constant_arrivals_are_exact_and_poisson_ones_are_poisson() -> None:
    r = scenario(duration=10, rate=100)
    assert r.series.total("req:arrivals") in (999, 1000)
    counts = []
    for seed in range(5):
        p = scenario(duration=10, rate=100, process="poisson", seed=seed)
        counts.append(p.series.total("req:arrivals"))
    # mean 1,000, standard deviation ~32: every run within 4 sigma, and they differ
    assert all(870 <= c <= 1130 for c in counts), counts
    assert len(set(counts)) > 1


def test_rate_schedules_ramp_and_spike() -> None:
    r = scenario(duration=20, rate=[{"at": 0, "rate": 0}, {"at": 10, "rate": 100, "ramp": 10}])
    assert r.series.total("req:arrivals", 0, 10) == 0
    assert r.series.total("req:arrivals", 10, 20) == pytest.approx(500, rel=0.03)
    assert r.series.total("req:arrivals", 18, 20) == pytest.approx(180, abs=2)  # (80+100)/2 x 2
    s = scenario(duration=10, rate=[{"at": 0, "rate": 10}, {"at": 5, "rate": 1000, "for": 1}])
    assert s.series.total("req:arrivals", 5, 6) == pytest.approx(1000, rel=0.02)
    assert s.series.total("req:arrivals", 7, 10) == pytest.approx(30, abs=2)


def test_a_dependency_over_capacity_gets_slower_and_serves_at_capacity() -> None:
    r = scenario(duration=10, rate=200, deps={"p": {"latency": "10ms", "capacity": 100}},
                 steps=[{"call": "p"}])
    # it answers 100 calls/s, however many come; the queue (and the wait) grows
    served = [r.series.total("dep:p:ok", t, t + 1) for t in range(2, 9)]
    assert all(95 <= n <= 101 for n in served), served
    lat = r.series.counts["req:latency_us"]
    done = r.series.counts["req:success"]
    means = [lat[t] / done[t] for t in range(5) if done[t]]
    assert means == sorted(means)  # every second's arrivals wait longer than the last's
    assert means[-1] > 3e6  # arrivals of t=4 wait > 3 s (400 calls ahead, 100/s)


def test_abandoned_calls_still_take_the_providers_turns() -> None:
    """A caller that gives up does not give the provider its turn back."""
    r = scenario(duration=10, rate=200, deps={"p": {"latency": "10ms", "capacity": 100}},
                 steps=[{"call": "p", "policies": [{"timeout": "500ms"}]}])
    calls = r.series.total("calls:p", 5, 10)
    answered = r.series.total("dep:p:ok", 5, 10)
    assert calls == pytest.approx(1000, rel=0.02)
    assert answered == 0  # the queue is already longer than anyone waits
    assert r.series.total("dep:p:timeout", 5, 10) == pytest.approx(1000, rel=0.02)


def test_error_rate_and_changes_over_time() -> None:
    r = scenario(duration=20, rate=200, process="poisson",
                 deps={"p": {"latency": "50ms", "error_rate": 0.3,
                             "changes": [{"at": 10, "latency": "200ms", "error_rate": 0.0}]}},
                 steps=[{"call": "p"}])
    calls = r.series.total("calls:p", 1, 9)
    errors = r.series.total("dep:p:error", 1, 9)
    assert errors / calls == pytest.approx(0.3, abs=0.03)
    assert r.series.total("dep:p:error", 11, 20) == 0
    assert r.busy_threads("svc", 2, 9) == pytest.approx(200 * 0.05, rel=0.08)
    assert r.busy_threads("svc", 12, 20) == pytest.approx(200 * 0.2, rel=0.08)
    assert r.outcome_rates("req", 1, 9)["error"] == pytest.approx(0.3, abs=0.03)


def test_latency_distributions_have_their_means() -> None:
    for spec, mean in [({"dist": "exponential", "mean": 0.2}, 0.2),
                       ({"dist": "uniform", "low": 0.1, "high": 0.3}, 0.2),
                       # mean of a lognormal: median x exp(sigma^2 / 2), sigma from p99
                       ({"dist": "lognormal", "median": 0.15, "p99": 0.6},
                        0.15 * math.exp((math.log(4) / 2.3263479) ** 2 / 2))]:
        r = scenario(duration=12, measure=(2, 12), rate=500, process="poisson",
                     deps={"p": {"latency": spec}}, steps=[{"call": "p"}])
        assert r.busy_threads("svc") == pytest.approx(500 * mean, rel=0.06), spec


def test_a_bulkhead_bounds_concurrent_calls_per_instance() -> None:
    r = scenario(duration=5, rate=100, instances=2, deps={"p": {"latency": "10s"}},
                 steps=[{"call": "p", "policies": [{"fallback": {}},
                                                   {"bulkhead": {"max_concurrent": 5}}]}])
    # no call ends within 5 s: exactly 5 per instance ever got in, the rest fell back
    assert r.series.total("calls:p") == 10
    assert r.outcome_rates("req", 1, 5)["fallback"] == 1.0


def test_a_thread_pool_with_a_queue_limit_refuses_the_rest() -> None:
    r = scenario(duration=10, rate=10, threads=1, queue_limit=0, steps=[{"work": 1.0}])
    served = r.series.total("req:success")
    refused = r.series.total("req:error")
    assert served in (9, 10)
    # the one being served at the end is neither
    assert served + refused == r.series.total("req:arrivals") - 1
    assert r.first_full_at["svc"] == pytest.approx(0.1)


def test_client_layers_retry_and_give_up_at_their_timeout() -> None:
    # the server fails every call: the app's 3 attempts each reach it once
    r = scenario(duration=10, rate=50, deps={"p": {"latency": "10ms", "error_rate": 1.0}},
                 steps=[{"call": "p"}],
                 clients=[{"name": "app", "retry": {"attempts": 3, "base": "100ms"}}])
    lo, hi = 2, 8
    assert r.series.total("calls:p", lo, hi) / r.series.total("req:arrivals", lo, hi) == \
        pytest.approx(3.0, rel=0.02)
    assert r.outcome_rates("req", lo, hi)["error"] == 1.0
    # a slow server: the app waits 3 s in all, then gives up, the server works on
    s = scenario(duration=10, rate=10, deps={"p": {"latency": "10s"}}, steps=[{"call": "p"}],
                 clients=[{"name": "app", "timeout": "3s"}])
    assert s.series.total("req:latency_us", 0, 5) == pytest.approx(
        s.series.total("req:error", 0, 5) * 3e6, rel=1e-6)
    # ... and the server works on: each request holds its thread 10 s, abandoned or not
    # (10/s x t threads busy at t < 10 s: a mean of 75 over 5-10 s)
    assert s.busy_threads("svc", 5, 10) == pytest.approx(75, rel=0.03)


def test_two_client_layers_multiply() -> None:
    """An app retrying 3 times above a gateway retrying 2 times: 3 x 2 server calls."""
    r = scenario(duration=10, rate=20, deps={"p": {"latency": "5ms", "error_rate": 1.0}},
                 steps=[{"call": "p"}],
                 clients=[{"name": "app", "retry": {"attempts": 3, "base": "50ms"}},
                          {"name": "gateway", "retry": {"attempts": 2, "base": "10ms"}}])
    assert r.series.total("calls:p", 2, 8) / r.series.total("req:arrivals", 2, 8) == \
        pytest.approx(6.0, rel=0.02)


@settings(max_examples=6, deadline=None)
@given(slow_at=st.floats(2.0, 6.0), timeout=st.floats(0.2, 2.0))
def test_the_breaker_opens_once_the_first_timeouts_come_back(slow_at: float,
                                                              timeout: float) -> None:
    r = scenario(duration=slow_at + timeout + 2, rate=500,
                 deps={"p": {"latency": "5ms", "changes": [{"at": slow_at, "latency": "30s"}]}},
                 steps=[{"call": "p", "policies": [
                     {"fallback": {}},
                     {"circuit_breaker": {"window": 20, "failure_rate": 0.5, "open_for": 30}},
                     {"timeout": timeout}]}])
    opened = r.opened_at("p")
    assert opened is not None
    # the first slow calls time out `timeout` after the slowdown; 10 of them open it
    assert slow_at + timeout <= opened <= slow_at + timeout + 0.05


def test_the_same_seed_gives_the_same_run() -> None:
    kw: dict[str, Any] = {"duration": 5, "rate": 100, "process": "poisson",
                          "deps": {"p": {"latency": {"dist": "exponential", "mean": 0.1},
                                         "error_rate": 0.2}},
                          "steps": [{"call": "p", "policies": [{"retry": {"attempts": 3}}]}]}
    a, b, c = scenario(**kw), scenario(**kw), scenario(**kw, seed=2)
    assert a.summary() == b.summary()
    assert a.summary() != c.summary()


@settings(max_examples=8, deadline=None)
@given(capacity=st.integers(20, 300), rate=st.integers(10, 600))
def test_a_dependency_never_serves_more_than_its_capacity(capacity: int, rate: int) -> None:
    r = scenario(duration=6, rate=rate, process="poisson",
                 deps={"p": {"latency": "20ms", "capacity": capacity}}, steps=[{"call": "p"}])
    served = r.series.counts["dep:p:ok"][:6]
    # one turn every 1/capacity s: at most capacity (+1 at a bucket edge) per second
    assert max(served) <= capacity + 1, served
    if rate < capacity * 0.8:  # under capacity every call is answered in about 20 ms
        mean = r.series.total("req:latency_us", 1, 5) / r.series.total("req:success", 1, 5)
        assert mean < 0.02e6 + 1e6 / capacity * 5


def test_runs_are_the_same_in_every_process() -> None:
    """Deterministic across interpreters (string hashing differs per process): the
    documented figures are what every machine prints."""
    import json
    import os
    import subprocess
    import sys

    code = ("import json; from stormguard.sim import salenight; from stormguard.sim.model "
            "import run; print(json.dumps(run(salenight.scenario('with_budget')).summary()))")
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=120, check=True)
        outs.append(json.loads(done.stdout))
    assert outs[0] == outs[1]
    assert outs[0]["dependencies"]["sms"]["calls_per_s"] > 1000


def test_requests_still_in_flight_end_with_the_run() -> None:
    """A run that ends with requests waiting (a 10 s dependency, 5 s run) ends them: no
    suspended task outlives it, and the figures are those of the run."""
    import gc

    import greenlet

    def suspended() -> int:
        gc.collect()
        # type(), not isinstance(): some objects of other tests (Django's lazy settings
        # proxies) evaluate themselves when asked for their __class__
        return sum(1 for o in gc.get_objects()
                   if type(o) is greenlet.greenlet and o and not o.dead
                   and o is not greenlet.getcurrent())

    before = suspended()
    r = scenario(duration=5, rate=100, threads=10, deps={"p": {"latency": "10s"}},
                 steps=[{"call": "p", "policies": [{"timeout": "8s"}]}])
    assert r.busy_threads("svc", 1, 5) == 10.0  # every thread held, the rest queued
    assert r.queued["svc"].value > 300
    assert suspended() == before  # ~500 requests were waiting when the run ended


def test_a_fixed_concurrency_limit_sheds_beyond_it() -> None:
    r = scenario(duration=5, rate=100, instances=2, deps={"p": {"latency": "10s"}},
                 steps=[{"call": "p", "policies": [{"fallback": {}},
                                                   {"concurrency_limit": {"limit": 4}}]}])
    assert r.series.total("calls:p") == 8  # 4 per instance got in; the rest were shed
    assert r.outcome_rates("req", 1, 5)["fallback"] == 1.0


def test_an_adaptive_concurrency_limit_shrinks_when_latency_queues() -> None:
    """A provider of 100 calls/s offered 200/s: its latency grows with its queue, and
    the adaptive limit sheds calls instead of queueing them all."""
    kw: dict[str, Any] = {"duration": 20, "measure": (10, 20), "rate": 200,
                          "process": "poisson"}
    dep = {"p": {"latency": "20ms", "capacity": 100}}
    plain = scenario(**kw, deps=dep, steps=[{"call": "p", "policies": [{"fallback": {}}]}])
    limited = scenario(**kw, deps=dep, steps=[{"call": "p", "policies": [
        {"fallback": {}}, {"concurrency_limit": {"adaptive": {"initial": 20, "max": 200}}}]}])
    assert plain.outcome_rates("req")["fallback"] == 0.0

    def answered(r: Result) -> float:  # of the requests that arrived in 10-20 s
        done = sum(r.series.total(f"req:{o}", 10, 20) for o in ("success", "fallback", "error"))
        return done / r.series.total("req:arrivals", 10, 20)

    # without the limit, the queue only grows: most requests of 10-20 s are still waiting
    # at 20 s; with it, every request is answered (served, or shed at once)
    assert answered(plain) < 0.5
    assert answered(limited) > 0.99
    assert limited.outcome_rates("req")["fallback"] > 0.3
    assert limited.outcome_rates("req")["success"] > 0.3


def test_adaptive_throttle_stops_sending_to_a_rejecting_dependency() -> None:
    r = scenario(duration=30, measure=(15, 30), rate=200,
                 deps={"p": {"latency": "5ms", "error_rate": 1.0}},
                 steps=[{"call": "p", "policies": [{"fallback": {}},
                                                   {"adaptive_throttle": {"k": 2}}]}])
    # every call fails: the throttle rejects most of them locally, without sending them
    assert r.calls_per_s("p") < 0.2 * 200
    assert r.outcome_rates("req")["fallback"] == 1.0


def test_new_policies_validate_their_options() -> None:
    from stormguard import ConfigError

    def bad(policy: dict[str, Any]) -> ConfigError:
        with pytest.raises(ConfigError) as info:
            scenario(deps={"p": {"latency": "5ms"}},
                     steps=[{"call": "p", "policies": [policy]}])
        return info.value

    where = "services.svc.endpoints.ep.steps[0].policies[0]"
    assert bad({"concurrency_limit": {"limit": 0}}).field == f"{where}.concurrency_limit.limit"
    assert bad({"concurrency_limit": {"adaptive": {"min": 5, "max": 2}}}).field == \
        f"{where}.concurrency_limit.adaptive.max"
    assert bad({"concurrency_limit": {"max_wait": 1}}).field == \
        f"{where}.concurrency_limit.max_wait"
    assert bad({"adaptive_throttle": {"k": 0.5}}).field == f"{where}.adaptive_throttle.k"


def test_a_shaper_paces_calls_to_its_rate_and_rejects_past_max_wait() -> None:
    """300 requests/s through a real Shaper of 100/s per instance (max_wait 50 ms): the
    dependency sees at most 100 calls/s, the rest fall back at once (ShaperFull)."""
    r = scenario(duration=20, measure=(5, 20), rate=300,
                 deps={"p": {"latency": "5ms"}},
                 steps=[{"call": "p", "policies": [
                     {"fallback": {}}, {"shaper": {"rate": 100, "max_wait": "50ms"}}]}])
    assert 97 <= r.calls_per_s("p") <= 100.5
    rates = r.outcome_rates("req")
    assert rates["fallback"] == pytest.approx(2 / 3, abs=0.03)
    two = scenario(duration=20, measure=(5, 20), rate=300, instances=2,
                   deps={"p": {"latency": "5ms"}},
                   steps=[{"call": "p", "policies": [
                       {"fallback": {}}, {"shaper": {"rate": 100, "max_wait": "50ms"}}]}])
    assert 194 <= two.calls_per_s("p") <= 201  # one pace per instance
    from stormguard import ConfigError

    with pytest.raises(ConfigError) as info:
        scenario(deps={"p": {"latency": "5ms"}},
                 steps=[{"call": "p", "policies": [{"shaper": {"per": "1s"}}]}])
    assert info.value.field == "services.svc.endpoints.ep.steps[0].policies[0].shaper.rate"
