"""bench/gateways.py still runs (tiny sizes; not timed). It starts its own processes."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gateways_benchmark(monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "bench" / "gateways.py"
    monkeypatch.setattr(sys, "argv", [str(path), "--duration", "0.3", "--rounds", "1",
                                      "--streams", "4", "--in-process", "200",
                                      "--warmup", "0.1"])
    runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    assert out.count("| grpc/") == 2
    assert "| http/v1/check" in out
    assert "ShouldRateLimit / HTTP /v1/check:" in out
