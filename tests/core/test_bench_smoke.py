"""The benchmark scripts and the demo still run (tiny sizes; not timed)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_script(path: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(path), *argv])
    runpy.run_path(str(path), run_name="__main__")


def test_accuracy_harness(monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> None:
    run_script(ROOT / "bench" / "accuracy.py", ["--sources", "150", "--duration", "120"],
               monkeypatch)
    out = capsys.readouterr().out
    assert "sliding_window_counter" in out
    fixed = out.split("fixed_window (")[1]
    all_row = next(line for line in fixed.splitlines() if line.startswith("all"))
    # a fixed window never denies what the exact window would admit
    cells = all_row.split()
    assert cells[3] == "0.0000%"  # wrongly denied
    assert cells[-4] == "0"  # under-limit sources ever denied


def test_memory_benchmark(monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> None:
    import gc

    for peer in ("limits", "throttled", "pyrate_limiter"):  # the [bench] extra
        pytest.importorskip(peer)
    try:
        run_script(ROOT / "bench" / "memory.py",
                   ["-n", "300", "--repeats", "1", "--keys", "50",
                    "--algorithms", "fixed_window,gcra"], monkeypatch)
    finally:
        gc.unfreeze()  # the script froze the test session's objects
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith(("fixed_window", "gcra"))]
    assert len(rows) == 8


def test_instruction_count_benchmark(monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The process it measures runs (the valgrind driver itself takes a minute: not here)."""
    for path in ("allowed", "denied"):
        run_script(ROOT / "bench" / "instructions.py", ["--child", "gcra", path, "50"],
                   monkeypatch)
        assert capsys.readouterr().out.startswith(("compiled", "pure Python"))


def test_demo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from stormguard.demo import main

    main()
    out = capsys.readouterr().out
    assert "500 requests at once: 10 admitted" in out
    assert "Retry-After: 1" in out
