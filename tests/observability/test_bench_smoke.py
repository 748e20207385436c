"""bench/observability.py still runs (quick sizes; its figures are not asserted)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_observability_bench_runs(monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["observability.py", "--quick"])
    runpy.run_path(str(ROOT / "bench" / "observability.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "counted + top-K" in out
    assert "SpaceSaving's top 7 are the 7 heavy keys: True" in out
