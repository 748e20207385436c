"""``stormguard simulate NAME|FILE [--plot PNG] [--html HTML] [--json]``.

``NAME`` is a built-in scenario (``sale-night``); anything else is a scenario file
(YAML or JSON, see ``stormguard simulate --schema``). The text table goes to standard
output, or the figures as one JSON object with ``--json``. Exit 0, or 2 for a bad
scenario (the message names the field).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["BUILTIN", "add_parser", "run"]

#: Built-in simulations: name -> "module:function" answering a ``stormguard.sim.report.Report``
#: (imported only when asked for). Another simulation on the same engine adds its line.
BUILTIN: dict[str, str] = {
    "sale-night": "stormguard.sim.salenight:report",
}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "simulate", help="capacity planning: run a scenario on the real policies in virtual time",
        description="Run a discrete-event simulation in virtual time with the real stormguard "
        "policies: the built-in 'sale-night' (its figures beside the Little's-law and retry "
        "arithmetic) or a scenario file (YAML; --schema prints its JSON Schema).")
    p.add_argument("scenario", nargs="?",
                   help=f"a built-in simulation ({', '.join(BUILTIN)}) or a scenario file")
    p.add_argument("--plot", metavar="PNG", help="write busy threads, calls/s and outcomes "
                   "over time as a PNG")
    p.add_argument("--html", metavar="HTML", help="write one self-contained HTML report")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    p.add_argument("--schema", action="store_true", help="print the scenario JSON Schema")
    return p


def run(args: argparse.Namespace) -> int:
    from stormguard._core.errors import ConfigError
    from stormguard.sim import report
    from stormguard.sim.scenario import load, schema

    if args.schema:
        print(json.dumps(schema(), indent=2))
        return 0
    if not args.scenario:
        print(f"stormguard simulate: error: give a scenario: {', '.join(BUILTIN)} or a file "
              "(--schema prints the file format)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    title: str
    figures: dict[str, Any]
    scenarios: dict[str, str]
    if args.scenario in BUILTIN:
        import importlib

        module, _, func = BUILTIN[args.scenario].partition(":")
        built: report.Report = getattr(importlib.import_module(module), func)()
        title, text, figures = built.title, built.text, built.figures
        panels, scenarios = built.panels, built.scenarios
    else:
        from stormguard.sim.model import run as run_scenario

        try:
            scenario = load(Path(args.scenario))
            result = run_scenario(scenario)
        except ConfigError as exc:
            print(f"stormguard simulate: {args.scenario}: {exc}", file=sys.stderr)
            return 2
        text, figures = report.result_text(result), result.summary()
        panels = report.result_panels(result)
        title = f"stormguard simulate {scenario.name}"
        scenarios = {scenario.name: scenario.description}
    elapsed = time.perf_counter() - started
    try:
        png = None
        if args.plot or args.html:
            png = report.png_bytes(panels, title)
        if args.plot:
            Path(args.plot).write_bytes(png or b"")
        if args.html:
            Path(args.html).write_text(report.html_report(title, text, figures, png, scenarios),
                                       "utf-8")
    except OSError as exc:
        print(f"stormguard simulate: cannot write {exc.filename}: {exc.strerror}",
              file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(figures))
    else:
        print(text)
        print(f"simulated in {elapsed:.1f} s of real time", file=sys.stderr)
    return 0
