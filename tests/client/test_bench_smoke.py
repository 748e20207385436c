"""bench/client.py still runs (tiny sizes; not timed). It starts its own serve process."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_client_benchmark(monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "bench" / "client.py"
    monkeypatch.setattr(sys, "argv", [str(path), "--n", "64", "--rounds", "1",
                                      "--concurrency", "1", "8"])
    runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    assert "asyncio x8: ServiceStore" in out
    assert out.count("x\n") == 6  # six rows, each with its ratio
