"""Reports of a run: a text table, a PNG (matplotlib), one self-contained HTML file.

The plot has three panels over virtual time: busy threads, dependency calls per
second, and the share of requests answered with success / fallback / error. The HTML
report inlines the PNG (base64) and the figures: no script, stylesheet or font is
fetched, it opens offline.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stormguard.sim.model import OUTCOMES, Result

__all__ = ["Panel", "Report", "html_report", "plot", "result_panels", "result_text"]

# (title, y label, log scale, lines: (label, xs, ys))
Panel = tuple[str, str, bool, list[tuple[str, list[float], list[float]]]]


@dataclass
class Report:
    """What ``stormguard simulate NAME`` prints and draws for a built-in simulation."""

    title: str
    text: str
    figures: dict[str, Any]
    panels: list[Panel]
    scenarios: dict[str, str] = field(default_factory=dict)  # name -> description


def _xs(r: Result) -> list[float]:
    n = int(r.duration / r.resolution)
    return [(i + 0.5) * r.resolution for i in range(n)]


def busy_line(r: Result, service: str) -> tuple[list[float], list[float]]:
    xs = _xs(r)
    area = r.busy[service].area
    return xs, [area[i] / r.resolution for i in range(len(xs))]


def calls_line(r: Result, dependency: str) -> tuple[list[float], list[float]]:
    xs = _xs(r)
    row = r.series.counts.get(f"calls:{dependency}", [0] * (len(xs) + 1))
    return xs, [row[i] / r.resolution for i in range(len(xs))]


def outcome_lines(r: Result, traffic: str) -> list[tuple[str, list[float], list[float]]]:
    xs = _xs(r)
    rows = {o: r.series.counts.get(f"{traffic}:{o}", [0] * (len(xs) + 1)) for o in OUTCOMES}
    out = []
    for o, row in rows.items():
        if o in ("limited", "shed") and not any(row):
            continue  # no rate limit or shedder answered this traffic: no line
        ys = []
        for i in range(len(xs)):
            total = sum(rows[k][i] for k in rows)
            ys.append(row[i] / total if total else 0.0)
        out.append((f"{traffic} {o}", xs, ys))
    return out


def result_panels(r: Result) -> list[Panel]:
    """The three panels for one scenario's run."""
    threads: list[tuple[str, list[float], list[float]]] = []
    for svc in r.busy:
        xs, ys = busy_line(r, svc)
        threads.append((f"{svc} busy", xs, ys))
        if r.threads[svc] is not None:
            threads.append((f"{svc} available", xs, [float(r.threads[svc] or 0)] * len(xs)))
    calls = [(dep, *calls_line(r, dep)) for dep in r.scenario.dependencies]
    outcomes = [line for t in r.scenario.traffic for line in outcome_lines(r, t["name"])]
    panels: list[Panel] = [("busy threads", "threads", False, threads),
                           ("dependency calls", "calls/s", False, calls),
                           ("requests by outcome (by arrival time)", "share", False, outcomes)]
    if r.gates:
        xs = _xs(r)
        refused: list[tuple[str, list[float], list[float]]] = []
        for name, gates in r.gates.items():
            for tag, label in ([(f"limited:{name}:{rule.name}", f"{name} 429 {rule.name}")
                                for rule in (gates[0].rules or ())]
                               + [(f"shed:{name}:{t}", f"{name} 503 shed {t}")
                                  for t in ("critical", "degraded", "sheddable")]):
                row = r.series.counts.get(tag)
                if row is not None and any(row):
                    refused.append((label, xs, [row[i] / r.resolution for i in range(len(xs))]))
        panels.append(("refused at the entry: rate limited (429) and shed (503)", "requests/s",
                       False, refused))
    if r.queues:
        xs = _xs(r)
        depth = []
        for name in r.queues:
            row = r.queue_depth(name)
            depth.append((f"{name} not done (pending or in flight)", xs,
                          [float(row[i]) for i in range(len(xs))]))
            drained = r.series.counts.get(f"queue:{name}:drained", [])
            depth.append((f"{name} drained/s", xs,
                          [drained[i] / r.resolution for i in range(len(xs))]))
        panels.append(("deferred queues: jobs not done yet, and drained per second", "jobs",
                       False, depth))
    return panels


def plot(panels: Sequence[Panel], path: str | Path, title: str) -> None:
    """Write the panels as one PNG (matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.2 * len(panels)))
    if len(panels) == 1:
        axes = [axes]
    for ax, (ptitle, ylabel, log, lines) in zip(axes, panels, strict=True):
        for label, xs, ys in lines:
            ax.plot(xs, ys, label=label, linewidth=1.4)
        if log:
            ax.set_yscale("symlog", linthresh=100)
        ax.set_title(ptitle, fontsize=10, loc="left")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if lines:
            ax.legend(fontsize=8, loc="best", ncol=2)
    for ax in axes:
        ax.set_xlabel("virtual time (s)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def html_report(title: str, text: str, figures: dict[str, Any], png: bytes | None,
                scenarios: dict[str, str] | None = None, alt: str | None = None) -> str:
    """One self-contained HTML page: the table, the plot inlined, the figures as JSON."""
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:system-ui,sans-serif;max-width:70em;margin:2em auto;"
        "padding:0 1em;color:#222}pre{background:#f6f6f6;padding:1em;overflow-x:auto}"
        "img{max-width:100%}</style>",
        "</head><body>", f"<h1>{html.escape(title)}</h1>",
        "<h2>Figures</h2>", f"<pre>{html.escape(text)}</pre>"]
    if png is not None:
        data = base64.b64encode(png).decode("ascii")
        parts += ["<h2>Over virtual time</h2>",
                  f'<img alt="{html.escape(alt or "the simulation over virtual time")}" '
                  f'src="data:image/png;base64,{data}">']
    if scenarios:
        parts.append("<h2>Scenarios</h2>")
        for name, desc in scenarios.items():
            parts.append(f"<p><b>{html.escape(name)}</b>: {html.escape(desc)}</p>")
    parts += ["<h2>JSON</h2>",
              f'<pre id="figures">{html.escape(json.dumps(figures, indent=2))}</pre>',
              "</body></html>"]
    return "\n".join(parts) + "\n"


def png_bytes(panels: Sequence[Panel], title: str) -> bytes:
    buf = io.BytesIO()
    plot(panels, buf, title)  # type: ignore[arg-type]
    return buf.getvalue()


def result_text(r: Result) -> str:
    """A text table of one run's summary."""
    s = r.summary()
    lo, hi = s["window_s"]
    lines = [f"scenario {s['scenario']}: {s['duration_s']:g} s of virtual time, figures "
             f"averaged over {lo:g}-{hi:g} s, {s['events']:,} events", ""]
    lines.append(f"{'service':<16}{'threads':>10}{'busy (mean)':>14}{'busy (peak)':>13}"
                 f"{'queued':>10}{'all busy at':>13}")
    for name, v in s["services"].items():
        avail = "unbounded" if v["threads_available"] is None else f"{v['threads_available']:,}"
        full = "-" if v["all_threads_busy_at_s"] is None else f"{v['all_threads_busy_at_s']:.2f} s"
        lines.append(f"{name:<16}{avail:>10}{v['busy_threads_mean']:>14,.1f}"
                     f"{v['busy_threads_peak']:>13,}{v['queued_mean']:>10,.1f}{full:>13}")
    lines += ["", f"{'dependency':<16}{'calls/s':>12}{'errors/s':>12}{'abandoned/s':>13}"]
    for name, d in s["dependencies"].items():
        lines.append(f"{name:<16}{d['calls_per_s']:>12,.1f}{d['errors_per_s']:>12,.1f}"
                     f"{d['abandoned_per_s']:>13,.1f}")
    inbound = "inbound" in s
    extra = f"{'429':>8}{'503 shed':>10}" if inbound else ""
    lines += ["", f"{'traffic':<16}{'arrivals/s':>12}{'success':>10}{'fallback':>10}"
                  f"{'error':>8}{extra}{'mean response':>15}"]
    for name, t in s["traffic"].items():
        mean = "-" if t["mean_response_s"] is None else f"{t['mean_response_s']:.3f} s"
        cols = f"{t['limited_rate']:>8.1%}{t['shed_rate']:>10.1%}" if inbound else ""
        lines.append(f"{name:<16}{t['arrivals_per_s']:>12,.1f}{t['success_rate']:>10.1%}"
                     f"{t['fallback_rate']:>10.1%}{t['error_rate']:>8.1%}{cols}{mean:>15}")
    lines += _inbound_text(s)
    opened = [tr for tr in s["breaker_transitions"] if tr["to"] == "open"]
    if opened:
        lines += ["", f"first breaker to open: {opened[0]['policy']} at {opened[0]['at_s']:.2f} s"]
    return "\n".join(lines)


def _inbound_text(s: dict[str, Any]) -> list[str]:
    """The rate limits, shedding per tier and deferred queues of a summary, as text."""
    lines: list[str] = []
    for name, entry in s.get("inbound", {}).items():
        for rule, per_s in entry.get("limited_per_s", {}).items():
            lines += ["", f"{name}: rule {rule} ({entry['rate_limit_store']} store) denied "
                          f"{per_s:,.1f} requests/s (429)"]
        for rule, per_s in entry.get("shadow_denied_per_s", {}).items():
            lines += ["", f"{name}: shadow rule {rule} would have denied {per_s:,.1f} "
                          "requests/s (not refused)"]
        shed = entry.get("shedding")
        if shed is not None:
            lines += ["", f"{'tier':<16}{'admitted':>10}{'shed':>10}{'shed rate':>11}"
                          f"{'shed/s':>10}   ({name}, limit per instance at the end: "
                          f"{', '.join(map(str, shed['limit_per_instance']))})"]
            for tier, t in shed["tiers"].items():
                lines.append(f"{tier:<16}{t['admitted']:>10,}{t['shed']:>10,}"
                             f"{t['shed_rate']:>11.1%}{t['shed_per_s']:>10,.1f}")
    if s.get("tiers"):
        lines += ["", f"{'tier':<16}{'requests':>10}{'success':>10}{'fallback':>10}"
                      f"{'429':>8}{'503 shed':>10}{'error':>8}{'mean response':>15}"]
        for tier, t in s["tiers"].items():
            mean = "-" if t["mean_response_s"] is None else f"{t['mean_response_s']:.3f} s"
            lines.append(f"{tier:<16}{t['requests']:>10,}{t['success_rate']:>10.1%}"
                         f"{t['fallback_rate']:>10.1%}{t['limited_rate']:>8.1%}"
                         f"{t['shed_rate']:>10.1%}{t['error_rate']:>8.1%}{mean:>15}")
    for name, q in s.get("queues", {}).items():
        drained = "-" if q["drained_at_s"] is None else f"{q['drained_at_s']:g} s"
        lines += ["", f"queue {name}: {q['deferred']:,} deferred, {q['drained']:,} drained "
                      f"(empty from {drained}), peak {q['peak_pending']:,} pending; at the end "
                      f"{q['pending_at_end']:,} pending, {q['in_flight_at_end']:,} in flight, "
                      f"{q['dead']:,} dead, {q['lost']:,} lost"]
    return lines
