"""bench/overload.py still runs: one load point against a real uvicorn, briefly."""

from __future__ import annotations

import runpy
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_overload_bench_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    # real time: short uvicorn processes (the calibration, the GIL table at one switch
    # interval, the unloaded point and one load point)
    monkeypatch.setattr(sys, "argv", [
        "overload.py", "--configs", "adaptive", "--loads", "2", "--duration", "0.5",
        "--warmup", "0.3", "--unloaded-seconds", "0.5", "--capacity", "40",
        "--plot", str(tmp_path / "o.png"),
        "--json", str(tmp_path / "o.json"), "--gil", "0.001", "--switch-cost", "0.0001"])
    runpy.run_path(str(ROOT / "bench" / "overload.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "LoadShedding + AdaptiveLimit" in out
    assert "a shed 503" in out  # the server's CPU per request, measured
    assert "4 busy" in out  # the GIL hand-off table, one switch interval
    assert "4 conn" in out  # the handlers' throughput at a switch interval
    assert "where the time goes" in out
    assert "measured / floor" in out  # the physical limit beside the measured figure
    assert (tmp_path / "o.png").stat().st_size > 1000
    assert '"adaptive"' in (tmp_path / "o.json").read_text()
    assert '"reasons"' in (tmp_path / "o.json").read_text()  # the 503s per tier and reason


@pytest.mark.slow
def test_overload_bench_measures_the_loops_gil_wait(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # real time: one short uvicorn process, observed by perf trace when it is installed
    monkeypatch.setattr(sys, "argv", [
        "overload.py", "--gil-waits", "uvloop", "--gil", "0.0001", "--repeats", "1"])
    runpy.run_path(str(ROOT / "bench" / "overload.py"), run_name="__main__")
    out = capsys.readouterr().out
    skipped = "perf not found" in out or "perf trace saw nothing" in out
    assert skipped == (shutil.which("perf") is None) or "perf trace saw nothing" in out
    if not skipped:
        row = next(line for line in out.splitlines() if line.strip().startswith("uvloop"))
        assert float(row.split("|")[1].split()[0]) > 0  # the loop thread did wait for it


def test_switch_interval_bench_runs(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    before = sys.getswitchinterval()
    monkeypatch.setattr(sys, "argv", ["switch_interval.py", "--pairs", "2", "--units", "200",
                                      "--threads", "2"])
    try:
        runpy.run_path(str(ROOT / "bench" / "switch_interval.py"), run_name="__main__")
    finally:
        sys.setswitchinterval(before)
    out = capsys.readouterr().out
    assert "2 thread(s), 0.1 ms against 5 ms: CPU ratio median" in out
