"""`stormguard simulate FILE`: text, --json, --plot, --html, --schema, bad scenarios."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stormguard.cli import main

SCENARIO = """\
name: cli-night
description: a small night for the command line
duration: 12
measure: {start: 4, end: 12}
dependencies:
  sms:
    latency: 5ms
    changes: [{at: 3, latency: 30s}]
services:
  checkout:
    instances: 2
    threads: 100
    endpoints:
      order:
        steps:
          - work: 100ms
          - call: sms
            policies:
              - fallback: {}
              - circuit_breaker: {window: 20, failure_rate: 0.5, open_for: 30s}
              - timeout: 500ms
traffic:
  - name: orders
    target: checkout.order
    arrival: {process: poisson, rate: 200}
    clients: [{name: app, timeout: 3s}]
"""


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "night.yaml"
    path.write_text(SCENARIO, encoding="utf-8")
    return path


def test_text_table(scenario_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(scenario_file)]) == 0
    out = capsys.readouterr()
    assert "scenario cli-night" in out.out
    row = next(line for line in out.out.splitlines() if line.startswith("checkout"))
    # 200 orders/s x 0.1 s of work = 20 busy threads of 200, once the breaker is open
    assert row.split()[1] == "200"
    assert float(row.split()[2]) == pytest.approx(20, rel=0.1)
    assert "first breaker to open: sms#" in out.out
    assert "simulated in" in out.err


def test_json_plot_and_html(scenario_file: Path, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    png, page = tmp_path / "n.png", tmp_path / "n.html"
    assert main(["simulate", str(scenario_file), "--json", "--plot", str(png),
                 "--html", str(page)]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["scenario"] == "cli-night"
    svc = figures["services"]["checkout"]
    assert svc["threads_available"] == 200
    assert svc["busy_threads_mean"] == pytest.approx(20, rel=0.1)
    orders = figures["traffic"]["orders"]
    assert orders["fallback_rate"] == pytest.approx(1.0, abs=0.01)
    assert orders["arrivals_per_s"] == pytest.approx(200, rel=0.1)
    opened = [t for t in figures["breaker_transitions"] if t["to"] == "open"]
    assert opened
    # 3 s + the 0.5 s timeout, then 10 timeouts (half the 20-call window) at 100/s each
    assert 3.5 <= opened[0]["at_s"] <= 3.7
    assert png.read_bytes()[:4] == b"\x89PNG"
    html = page.read_text("utf-8")
    assert "data:image/png;base64," in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "a small night for the command line" in html


def test_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"].startswith("stormguard simulate")


@pytest.mark.parametrize(("text", "field"), [
    (SCENARIO.replace("rate: 200", "rate: lots"), "traffic[0].arrival.rate"),
    (SCENARIO.replace("timeout: 500ms", "timeout: soon"),
     "services.checkout.endpoints.order.steps[1].policies[2].timeout"),
    (SCENARIO.replace("call: sms", "call: mail"),
     "services.checkout.endpoints.order.steps[1].call"),
])
def test_a_bad_scenario_exits_2_naming_the_field(tmp_path: Path, text: str, field: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: {field}:" in err


def test_missing_file_and_missing_argument(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot be read" in capsys.readouterr().err
    assert main(["simulate"]) == 2
    assert "give a scenario" in capsys.readouterr().err


def test_unwritable_output_exits_2(scenario_file: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(scenario_file), "--plot",
                 str(tmp_path / "no" / "such" / "dir.png")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_the_shipped_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "simulate-checkout.yaml"
    assert main(["simulate", str(example), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["scenario"] == "checkout-night"
    orders, cart = figures["traffic"]["orders"], figures["traffic"]["cart"]
    # the SMS slowdown costs no order: the breaker and the bulkhead keep checkout going
    assert orders["error_rate"] < 0.01
    assert orders["fallback_rate"] > 0.3
    assert cart["success_rate"] > 0.99
    busy = figures["services"]["checkout"]
    assert busy["busy_threads_peak"] < busy["threads_available"]
