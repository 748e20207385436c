"""bench/sim.py still runs (two virtual seconds; not timed)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_sim_benchmark_runs(monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("simpy")  # the [bench] extra
    path = ROOT / "bench" / "sim.py"
    monkeypatch.setattr(sys, "argv", [str(path), "--seconds", "2", "--rate", "500"])
    runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split("|")[1].strip() for r in rows[1:]] == ["simpy", "engine", "tasks", "model",
                                                            "inbound"]
    # the runs served the same Poisson arrivals (the model's own seed differs)
    counts = [int(r.split("|")[2].strip().replace(",", "")) for r in rows[1:]]
    assert counts[0] == counts[1] == counts[2]
    assert abs(counts[3] - counts[0]) < 0.1 * counts[0]
    # behind the front door nothing is refused (100/s per user, 1,000 slots): every order
    # is served, as in the model
    assert counts[4] == counts[3]
    assert "one virtual hour" in out
    assert "inbound (rate limit + shedder on every order)" in out
