"""bench/overload.py still runs: one load point against a real uvicorn, briefly."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_overload_bench_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    # real time: two short uvicorn processes (the unloaded point and one load point)
    monkeypatch.setattr(sys, "argv", [
        "overload.py", "--configs", "adaptive", "--loads", "2", "--duration", "0.5",
        "--warmup", "0.3", "--capacity", "40", "--plot", str(tmp_path / "o.png"),
        "--json", str(tmp_path / "o.json")])
    runpy.run_path(str(ROOT / "bench" / "overload.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "LoadShedding + AdaptiveLimit" in out
    assert (tmp_path / "o.png").stat().st_size > 1000
    assert '"adaptive"' in (tmp_path / "o.json").read_text()
