"""``stormguard simulate NAME|FILE [--plot PNG] [--html HTML] [--json]``.

``NAME`` is a built-in simulation (``sale-night``; ``fleet``, which takes ``--rate``,
``--seconds``, ``--balance`` and the other options of its group); anything else is a
scenario file (YAML or JSON, see ``stormguard simulate --schema``). The text table goes
to standard output, or the figures as one JSON object with ``--json``. Exit 0, or 2 for
a bad scenario (the message names the field) or an option the simulation does not take.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stormguard.sim.report import Report

__all__ = ["BUILTIN", "add_parser", "run"]

#: Built-in simulations: name -> "module:function" answering a ``stormguard.sim.report.Report``
#: (imported only when asked for). Another simulation on the same engine adds its line.
BUILTIN: dict[str, str] = {
    "sale-night": "stormguard.sim.salenight:report",
    "fleet": "stormguard.sim.regions:fleet_report",  # the fleet, then its three regions
}

#: Options a built-in may take: its ``report`` function's keyword argument of the same
#: name (``--hot-rate`` -> ``hot_rate``). Given to a simulation without it: exit 2.
OPTIONS: dict[str, tuple[type, str]] = {
    "rate": (float, "requests per second in all (fleet: 100000 by default; 1000000 is "
             "the full scale, about a minute)"),
    "seconds": (float, "virtual seconds to run (fleet: 2)"),
    "balance": (str, "the load balancer: random (any server of the key's region) or "
                "sticky (consistent hashing) (fleet: random)"),
    "users": (int, "distinct users (fleet: 10000000)"),
    "zipf": (float, "the exponent of the users' Zipf popularity (fleet: 1.0)"),
    "hot_rate": (float, "HybridStore's hot_rate (fleet: 0)"),
    "cold_allowance": (int, "HybridStore's cold_allowance (fleet: 0, every unit leased "
                       "first; 1: one unit per key, server and window admitted first)"),
    "node_ops": (float, "script runs per second one Redis node sustains (fleet: 117000)"),
    "seed": (int, "the seed of the random draws (fleet: 7)"),
    "regions": (bool, "fleet: also run its 3 regions under one global limit (centralised, "
                "static and demand split; on by default, --no-regions leaves them out)"),
}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "simulate", help="capacity planning: run a scenario on the real policies in virtual time",
        description="Run a discrete-event simulation in virtual time with the real stormguard "
        "policies: the built-in 'sale-night' (its figures beside the Little's-law and retry "
        "arithmetic), the built-in 'fleet' (500 servers in 3 regions, each check a hit on "
        "the real HybridStore; a tenth of the full 1,000,000 requests/s by default, "
        "--rate 1000000 for the full scale) or a scenario file (YAML; --schema prints its "
        "JSON Schema).")
    p.add_argument("scenario", nargs="?",
                   help=f"a built-in simulation ({', '.join(BUILTIN)}) or a scenario file")
    p.add_argument("--plot", metavar="PNG", help="write the series over virtual time as a "
                   "PNG (a scenario: busy threads, calls/s, outcomes; fleet: backend "
                   "operations/s, admissions/s)")
    p.add_argument("--html", metavar="HTML", help="write one self-contained HTML report")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    p.add_argument("--schema", action="store_true", help="print the scenario JSON Schema")
    group = p.add_argument_group("options of the built-in fleet simulation")
    for name, (kind, text) in OPTIONS.items():
        flag = "--" + name.replace("_", "-")
        if name == "balance":
            group.add_argument(flag, choices=("random", "sticky"), default=None, help=text)
        elif kind is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                               help=text)
        else:
            group.add_argument(flag, type=kind, default=None, metavar=name.upper(), help=text)
    return p


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The simulation options given on the command line (not the defaults)."""
    return {name: getattr(args, name) for name in OPTIONS
            if getattr(args, name, None) is not None}


def _refuse(scenario: str, given: dict[str, Any], takes: set[str]) -> bool:
    wrong = [n for n in given if n not in takes]
    if wrong:
        flags = ", ".join("--" + n.replace("_", "-") for n in wrong)
        print(f"stormguard simulate: {scenario}: does not take {flags}", file=sys.stderr)
        return True
    return False


def _builtin(name: str, given: dict[str, Any]) -> Report | None:
    """Run the built-in ``name`` with the options ``given`` (None: refused, said why)."""
    import importlib

    module, _, func = BUILTIN[name].partition(":")
    make = getattr(importlib.import_module(module), func)
    if _refuse(name, given, set(inspect.signature(make).parameters)):
        return None
    try:
        built: Report = make(**given)
    except ValueError as exc:
        print(f"stormguard simulate: {name}: {exc}", file=sys.stderr)
        return None
    return built


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
    given = _options(args)
    started = time.perf_counter()
    title: str
    figures: dict[str, Any]
    scenarios: dict[str, str]
    if args.scenario in BUILTIN:
        built = _builtin(args.scenario, given)
        if built is None:
            return 2
        title, text, figures = built.title, built.text, built.figures
        panels, scenarios = built.panels, built.scenarios
    else:
        from stormguard.sim.model import run as run_scenario

        if _refuse(args.scenario, given, set()):
            return 2
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
            alt = "; ".join(panel[0] for panel in panels)  # what each panel draws
            Path(args.html).write_text(report.html_report(title, text, figures, png, scenarios,
                                                          alt), "utf-8")
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
