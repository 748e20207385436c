"""The fleet simulation with native forced adds against every forced add in the script:
the same requests, the native path cheaper in Redis time, no false denials either way (the
bound itself: tests/hybrid/test_cold.py)."""

from __future__ import annotations

from stormguard.sim.fleet import hybrid_parts, simulate


def test_native_adds_cost_less_redis_time_than_script_adds() -> None:
    runs = {native: simulate(rate=20_000, seconds=2.0, users=20_000, cold_allowance=1,
                             native_adds=native) for native in (True, False)}
    native, script = runs[True], runs[False]
    assert native.kinds["native_new"] > 0
    assert script.kinds["native_new"] == script.kinds["native_present"] == 0
    parts_n = hybrid_parts(native.kinds, native.costs)
    parts_s = hybrid_parts(script.kinds, script.costs)
    adds_n = parts_n["forced adds"] + parts_n["native adds"]
    assert adds_n < parts_s["forced adds"]
    assert native.checks == script.checks  # the same requests
    for run in runs.values():
        for name, t in run.tallies["hybrid"].items():
            assert t.false_denials == 0, name
