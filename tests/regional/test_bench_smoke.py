"""bench/regions.py still runs (the quick scenario: 24 s of virtual time, ~1 s of wall)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_regions_simulation(monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["bench/regions.py", "--quick"])
    runpy.run_path(str(ROOT / "bench" / "regions.py"), run_name="__main__")
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in ("centralised", "per-region", "static",
                                                    "demand")}
    assert set(rows) == {"centralised", "per-region", "static", "demand"}
    # the regional strategies add nothing to a check; the centralised one a round trip
    assert float(rows["demand"][1]) == 0.0
    assert float(rows["centralised"][1]) >= 100.0
    # every window of the demand split stays within the limit, in every phase
    for cell in rows["demand"][3:7]:
        assert float(cell.split("/")[2]) <= 1.0 + 1e-9
    # before the shift it is exact; the static split leaves a quarter unused
    assert rows["demand"][3].split("/")[0] == "1.00"
    assert float(rows["static"][3].split("/")[0]) < 0.8
    # centralised fail-open in a partition overshoots; per-region copies always do
    assert float(rows["centralised"][5].split("/")[2]) > 1.5
    assert float(rows["per-region"][3].split("/")[0]) > 1.3
