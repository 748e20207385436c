"""The regions in the simulation: stormguard.sim.regions (the real RegionalStore on the
discrete-event engine, virtual time), ``stormguard simulate fleet`` and the bench
scripts that print it. Short deterministic runs: every figure here is exact and
repeatable."""

from __future__ import annotations

import json
import math
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest

from stormguard.cli import main
from stormguard.sim import regions as sim_regions
from stormguard.sim.regions import ALIGNMENTS, Regions, convergence, simulate

ROOT = Path(__file__).resolve().parents[2]
SMALL_FLEET = ["--rate", "20000", "--seconds", "0.5"]
SMALL_REGIONS: dict[str, Any] = {"duration": 24.0, "limit": 100,
                                 "measure_convergence": True, "offsets": 2}


@pytest.fixture(scope="module")
def run() -> Regions:
    return simulate(duration=24.0, limit=300)


def test_the_strategies_side_by_side(run: Regions) -> None:
    sc, out = run.scenario, run.outcomes
    assert list(out) == ["centralised", "per-region", "static", "demand"]
    # added latency per check: a cross-region round trip (100-150 ms) for 2/3 of the
    # centralised checks; nothing for the regional strategies
    mean, p99 = out["centralised"].latency()
    assert mean >= 0.09
    assert p99 >= 0.1
    for name in ("per-region", "static", "demand"):
        assert out[name].latency() == (0.0, 0.0)
    demand = out["demand"]
    phases = demand.per_phase(sc)
    # the demand split: exact before the shift, back within 5 % within 3 windows of it
    # (the share figures of each sync alignment are in the convergence test) and at
    # most the limit in every window of every phase, the partition included
    assert all(abs(v - 1) <= 1e-9 for v in phases["80/10/10"])
    back = demand.back(sc)
    assert back is not None
    assert back <= 3
    shift, cut = int(sc.t_shift), int(sc.t_cut)
    for w in demand.windows(sc):
        assert demand.total(w) <= sc.limit, w
        if shift + 3 <= w < cut:
            assert abs(demand.total(w) / sc.limit - 1) <= 0.05, w
    # the partition: at most the limit; ap keeps its share while its peers' reports are
    # within the lease (3 s), then enforces at most its weight (a third), alone
    assert max(phases["partition"]) <= 1.0
    alone = [w for w in demand.windows(sc) if sc.t_cut + 4 <= w < sc.t_heal]
    assert alone
    assert all(demand.admitted[w]["ap"] <= sc.limit // 3 for w in alone)
    assert demand.admitted[int(sc.t_cut)]["ap"] == 0.6 * sc.limit
    # static: equal thirds, a region with more demand than its third is denied while
    # another's third sits unused: (100 + 60 + 60) / 300 admitted
    static = out["static"]
    used = (sc.limit // 3 + 2 * sc.limit * 0.2) / sc.limit
    assert all(abs(v - used) <= 0.01 for v in static.per_phase(sc)["80/10/10"])
    assert abs(static.unused(sc) - (1 - used)) <= 0.01
    assert demand.unused(sc) < static.unused(sc) / 2
    # centralised fails open in the partition; copies per region admit 1.4x always
    assert max(out["centralised"].per_phase(sc)["partition"]) > 1.5
    assert all(abs(v - 1.4) <= 0.01 for v in out["per-region"].per_phase(sc)["80/10/10"])


def test_the_run_is_deterministic(run: Regions) -> None:
    again = simulate(duration=24.0, limit=300)
    assert again.figures == run.figures
    assert run.figures["strategies"]["demand"]["back_within_5pct_windows"] == run.outcomes[
        "demand"].back(run.scenario)


def test_convergence_within_three_intervals_in_every_alignment() -> None:
    """The shift 80/10/10 -> 10/10/80 at offsets of the sync interval, in every sync
    alignment: the shares in force serve the new demand within 5 % of the limit within
    3 intervals with the hurried syncs; regular syncs only take longer."""
    conv = convergence(offsets=4, limit=100)
    for alignment in ALIGNMENTS:
        worst = conv.worst("hurried syncs", alignment)
        assert math.isfinite(worst)
        assert worst <= 3.0, (alignment, conv.intervals)
        assert worst < conv.worst("regular syncs only", alignment)
    assert conv.worst("regular syncs only", "same instant") > 4.0
    assert "| same instant |" in conv.text()


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError, match="duration"):
        simulate(duration=5)
    with pytest.raises(ValueError, match="strategy"):
        sim_regions.run("sharded", sim_regions.Scenario())


def test_simulate_fleet_prints_the_regions_after_the_fleet(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sim_regions, "FLEET_REGIONS", SMALL_REGIONS)
    assert main(["simulate", "fleet", *SMALL_FLEET]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fleet: 500 servers")
    fleet_end, regions_at = out.index("ops cut vs every check on Redis"), out.index(
        "regions: us, eu, ap")
    assert fleet_end < regions_at
    for name in ("centralised", "per-region", "static", "demand"):
        assert f"\n| {name} | " in out[regions_at:], name
    assert "| staggered ap, eu, us |" in out[regions_at:]
    # the figures, the plot and the page carry the regions too
    png, page = tmp_path / "f.png", tmp_path / "f.html"
    assert main(["simulate", "fleet", *SMALL_FLEET, "--json", "--plot", str(png),
                 "--html", str(page)]) == 0
    f = json.loads(capsys.readouterr().out)
    assert f["simulation"] == "fleet"
    assert f["regional"]["simulation"] == "regions"
    assert set(f["regional"]["strategies"]) == {"centralised", "per-region", "static",
                                                "demand"}
    assert f["regional"]["strategies"]["demand"]["back_within_5pct_windows"] <= 3
    assert set(f["regional"]["convergence_intervals"]["worst"]) == {
        "hurried syncs", "regular syncs only"}
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "regions: global admitted per window / limit" in page.read_text("utf-8")
    # --no-regions: the fleet alone
    assert main(["simulate", "fleet", *SMALL_FLEET, "--no-regions", "--json"]) == 0
    assert "regional" not in json.loads(capsys.readouterr().out)
    assert main(["simulate", "sale-night", "--regions"]) == 2
    assert "does not take --regions" in capsys.readouterr().err


def test_the_bench_scripts_print_the_regions(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["bench/regions.py", "--quick"])
    runpy.run_path(str(ROOT / "bench" / "regions.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "| demand | 0.0 / 0 |" in out
    assert "RegionalStore.hit over it" in out
    # bench/fleet.py: the fleet's tables, then the regions' (a short run here)
    full = sim_regions.simulate
    calls: list[dict[str, Any]] = []

    def short(**options: Any) -> Regions:
        calls.append(options)
        return full(**{**options, **SMALL_REGIONS})

    monkeypatch.setattr(sim_regions, "simulate", short)
    monkeypatch.setattr(sys, "argv", ["bench/fleet.py", *SMALL_FLEET, "--users", "10000"])
    runpy.run_path(str(ROOT / "bench" / "fleet.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert out.index("| HybridStore |") < out.index("regions: us, eu, ap")
    assert calls == [{"measure_convergence": True}]
