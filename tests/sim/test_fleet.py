"""`stormguard simulate fleet`: the 500-server fleet on the real HybridStore, small scale."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stormguard.cli import main
from stormguard.cli.simulate import BUILTIN

# a tenth of the full rate for one virtual second: about two seconds of real time
SMALL = ["--rate", "100000", "--seconds", "1"]


def test_fleet_is_a_builtin() -> None:
    assert BUILTIN["fleet"] == "stormguard.sim.regions:fleet_report"  # the fleet, its regions


def test_the_help_names_fleet_and_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(sale-night, fleet)" in out
    assert "--rate 1000000 for the full scale" in out
    for flag in ("--rate", "--seconds", "--balance {random,sticky}", "--users", "--zipf",
                 "--hot-rate", "--node-ops", "--seed"):
        assert flag in out, flag


def test_json_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png, page = tmp_path / "fleet.png", tmp_path / "fleet.html"
    assert main(["simulate", "fleet", *SMALL, "--json", "--plot", str(png),
                 "--html", str(page)]) == 0
    f = json.loads(capsys.readouterr().out)
    assert {"simulation", "servers", "regions", "rate_per_s", "seconds", "checks", "balance",
            "scale", "strategies", "key_classes"} <= set(f)
    assert (f["simulation"], f["servers"], f["regions"]) == ("fleet", 500, 3)
    assert (f["rate_per_s"], f["seconds"], f["scale"]) == (100_000, 1, 0.1)
    assert abs(f["checks"] - 100_000) <= 1  # one request per 1/rate, counted per tick
    assert set(f["strategies"]) == {"redis", "hybrid", "global"}
    redis, hybrid = f["strategies"]["redis"], f["strategies"]["hybrid"]
    assert redis["backend_ops_per_s"] == pytest.approx(100_000, rel=0.01)
    # the hybrid store's backend work is below one operation per check
    assert 0 < hybrid["backend_ops_per_s"] < 0.95 * redis["backend_ops_per_s"]
    assert hybrid["ops_cut"] > 1
    assert hybrid["round_trips_per_server_per_s"] < redis["round_trips_per_server_per_s"]
    assert set(f["key_classes"]) == {"user", "api", "bot"}
    checks = 0
    for name, kc in f["key_classes"].items():
        h, g = kc["hybrid"], kc["global"]
        assert h["checks"] == g["checks"] > 0, name  # the same requests for both
        checks += h["checks"]
        # fixed windows: the hybrid store never admits above the limit, never denies
        # a key-second whose demand was within it
        assert h["admitted_over_limit"] == 0, name
        assert h["false_denials"] == 0, name
        assert h["overshoot_rate"] in (None, 0), name
        assert 0 <= h["waited_rate"] <= 1
        assert g["waited_rate"] == 0
    assert checks == f["checks"]
    users = f["key_classes"]["user"]
    assert (users["limit_per_s"], users["keys"]) == (10, 10_000_000)
    # hot users go over their limit: that is where the GLOBAL-like strategy overshoots
    assert users["global"]["admitted_over_limit"] > 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    html = page.read_text("utf-8")
    assert "data:image/png;base64," in html
    assert "&quot;simulation&quot;: &quot;fleet&quot;" in html  # the figures, escaped
    assert 'alt="backend operations (all regions);' in html  # what the fleet plot draws


def test_text_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "fleet", *SMALL, "--balance", "sticky", "--users",
                 "100000"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("fleet: 500 servers, 3 regions, 100,000 requests/s for 1 s "
                              "virtual")
    assert "100,000 users (Zipf 1), balance sticky" in out.out
    assert re.search(r"\| HybridStore \| [\d,]+ \| [\d.]+ \| [\d.,]+ \|", out.out)
    assert re.search(r"\| GLOBAL-like \(last broadcast, no shares\) \| [\d,]+ \|", out.out)
    rows = re.findall(r"^\| (\w+) \| HybridStore \| .*", out.out, re.M)
    assert rows == ["user", "api", "bot"]
    for row in re.findall(r"^\| \w+ \| HybridStore \| .*", out.out, re.M):
        assert "| 0.00 % |" in row or "| - |" in row, row
        assert re.search(r"\| 0 of [\d,]+ \|$", row), row
    assert "scale 0.1" in out.out
    assert "simulated in" in out.err


def test_the_same_figures_as_the_package_api() -> None:
    from stormguard.sim.fleet import simulate

    a = simulate(rate=20_000, seconds=0.5, users=10_000)
    b = simulate(rate=20_000, seconds=0.5, users=10_000)
    assert a.checks == b.checks == 10_000
    fa, fb = a.figures, b.figures
    fa.pop("real_time_s"), fb.pop("real_time_s")
    assert fa == fb  # seeded: the same run twice
    assert [p[0] for p in a.panels()] == ["backend operations (all regions)",
                                          "admitted requests by key class"]


@pytest.mark.parametrize("target", ["sale-night", "scenario-file"])
def test_fleet_options_elsewhere_exit_2(target: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    if target == "scenario-file":
        path = tmp_path / "s.yaml"
        path.write_text("name: x\n", encoding="utf-8")
        target = str(path)
    assert main(["simulate", target, "--rate", "5", "--balance", "sticky"]) == 2
    assert "does not take --rate, --balance" in capsys.readouterr().err


def test_a_bad_fleet_value_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "fleet", "--rate", "0"]) == 2
    assert "fleet: rate" in capsys.readouterr().err
