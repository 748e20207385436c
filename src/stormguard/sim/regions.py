"""Three regions, one global limit: the regions of the fleet, on the discrete-event engine.

Regions us, eu, ap; one-way delays us-eu 50 ms, us-ap 75 ms, eu-ap 60 ms (round trips
100-150 ms). One key, a global limit of ``limit`` per 1 s window (fixed window, so
"admitted per window" is exact); the offered load is twice the limit, evenly spaced:

* phase 1 (0-35 %): 80/10/10 of it in us/eu/ap (its first 3 windows, while the regions
  first meet, are left out of the figures); phase 2 (35-60 %): 10/10/80;
* phase 3 (60-85 %): ap partitioned (no link to or from it); phase 4: healed, 10/10/80.

Strategies, each on its own copy of the same arrivals:

* ``centralised``: one counter in us; every check from eu or ap crosses the link (the
  round trip is added to the check); partitioned, ap's checks time out (0.5 s) and are
  admitted (fail-open: what the global total then does; a fail-closed limiter would
  deny all of them instead);
* ``per-region``: each region enforces the full limit on its own (the N x limit that
  per-region or per-data-center counting gives);
* ``static``: the real :class:`~stormguard.RegionalStore` with ``split="static"``, equal
  thirds;
* ``demand``: the real :class:`~stormguard.RegionalStore` with ``split="demand"``, a
  sync every second at a phase of its own per region (0.1 s apart), one more half-way
  while a raise is pending (as its background sync does), lease 3 s, min_share 0.05;
  its reports travel the links with their delay (a write to a cut link fails).

Reported per strategy: the latency a check adds (mean, p99), the global admitted per
window as a fraction of the limit in each phase (mean, min, max), the windows after the
shift until the total is back within 5 % of the limit for good, and the share of the
limit left unused in windows where some region's users were denied.

:func:`convergence` measures the demand split alone: the shift from 80/10/10 to
10/10/80, at ten offsets of the shift within the sync interval, for the regions syncing
at the same instant and staggered (a third of an interval apart, in either order), with
and without the hurried half-interval syncs; the figure is the time from the shift
until the shares in force serve the new demand within 5 % of the limit, in sync
intervals.
"""

from __future__ import annotations

import inspect
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stormguard._core.errors import StorageError
from stormguard.ratelimit.rule import Rule
from stormguard.sim.engine import Engine
from stormguard.stores.memory import MemoryStore
from stormguard.stores.regional import Board, MemoryBoard, RegionalStore

if TYPE_CHECKING:
    from stormguard.sim.report import Panel, Report

__all__ = ["ALIGNMENTS", "FLEET_REGIONS", "ONE_WAY", "REGIONS", "STRATEGIES", "Convergence",
           "Regions", "Scenario", "convergence", "fleet_report", "simulate"]

REGIONS = ("us", "eu", "ap")
ONE_WAY = {frozenset(("us", "eu")): 0.050, frozenset(("us", "ap")): 0.075,
           frozenset(("eu", "ap")): 0.060}
STRATEGIES = ("centralised", "per-region", "static", "demand")
PHASES = ("80/10/10", "10/10/80", "partition", "healed")
SYNC = 1.0  # the demand split's sync interval, seconds (the window is 1 s)
#: sync phases within the interval (fractions of it), per alignment
ALIGNMENTS: dict[str, dict[str, float]] = {
    "same instant": {"us": 0.0, "eu": 0.0, "ap": 0.0},
    "staggered us, eu, ap": {"us": 0.0, "eu": 1 / 3, "ap": 2 / 3},
    "staggered ap, eu, us": {"ap": 0.0, "eu": 1 / 3, "us": 2 / 3},
}
BEFORE = {"us": 0.8, "eu": 0.1, "ap": 0.1}
AFTER = {"us": 0.1, "eu": 0.1, "ap": 0.8}


def delay(a: str, b: str) -> float:
    """The one-way delay between two regions (0 within one)."""
    return 0.0 if a == b else ONE_WAY[frozenset((a, b))]


class Link(Board):
    """Region a's view of region b's board: a write lands after the link's one-way delay;
    a cut link fails the write (as a timeout would); a read is in b's region."""

    def __init__(self, eng: Engine, inbox: MemoryBoard, seconds: float,
                 cut: Callable[[], bool]) -> None:
        self.eng, self.inbox, self.seconds, self.cut = eng, inbox, seconds, cut

    def write(self, sender: str, payload: bytes, ttl: float) -> None:
        if self.cut():
            raise StorageError("link cut")
        if self.seconds <= 0:
            self.inbox.write(sender, payload, ttl)
        else:
            self.eng.call_later(self.seconds, self.inbox.write, sender, payload, ttl)

    def read(self) -> dict[str, bytes]:
        return self.inbox.read()


def demand_regions(eng: Engine, split: str, phases: dict[str, float], *,
                   cut: Callable[[str, str], bool] = lambda a, b: False, hurry: bool = True,
                   on_sync: Callable[[], None] | None = None) -> dict[str, RegionalStore]:
    """Three RegionalStores over MemoryStores on ``eng``'s clock, their reports over
    :class:`Link` boards; with ``split="demand"`` each syncs every :data:`SYNC` at
    ``phases[region]`` (a fraction of the interval), and once more half-way while a
    raise is pending (``hurry``), as the background sync does."""
    clock = eng.clock
    locals_ = {r: MemoryStore(clock=clock) for r in REGIONS}
    inbox = {r: MemoryBoard(clock) for r in REGIONS}
    stores: dict[str, RegionalStore] = {}
    def link_cut(a: str, b: str) -> Callable[[], bool]:
        return lambda: a != b and cut(a, b)

    for a in REGIONS:
        boards: dict[str, Board] = {b: Link(eng, inbox[b], delay(a, b), link_cut(a, b))
                                    for b in REGIONS}
        stores[a] = RegionalStore(region=a, stores=locals_, split=split, clock=clock,
                                  sync_interval=None, lease=3.0, min_share=0.05,
                                  boards=boards)
    if split != "demand":
        return stores

    def regular(store: RegionalStore) -> None:
        store.sync()
        if on_sync is not None:
            on_sync()

    def half(store: RegionalStore) -> None:
        if store.half_sync() and on_sync is not None:
            on_sync()

    def poll(store: RegionalStore) -> None:
        if store.poll() and on_sync is not None:
            on_sync()

    for r, s in stores.items():
        first = eng.now + 0.5 + phases[r] * SYNC
        eng.every(SYNC, regular, s, start=first)
        if hurry:
            eng.every(SYNC, half, s, start=first + SYNC / 2)
            eng.every(SYNC / 2, poll, s, start=first + SYNC / 4)
    return stores


@dataclass(frozen=True)
class Scenario:
    """The run: ``duration`` virtual seconds, a global limit of ``limit`` per second."""

    duration: float = 60.0
    limit: int = 1000

    @property
    def t_shift(self) -> float:  # whole seconds: a phase starts with a window
        return float(round(0.35 * self.duration))

    @property
    def t_cut(self) -> float:
        return float(round(0.60 * self.duration))

    @property
    def t_heal(self) -> float:
        return float(round(0.85 * self.duration))

    def mix(self, t: float) -> dict[str, float]:
        return BEFORE if t < self.t_shift else AFTER

    def cut(self, t: float) -> bool:
        return self.t_cut <= t < self.t_heal

    def phase(self, t: float) -> str:
        if t < self.t_shift:
            return PHASES[0]
        if t < self.t_cut:
            return PHASES[1]
        return PHASES[2] if t < self.t_heal else PHASES[3]


@dataclass
class Outcome:
    """One strategy's run: the tallies per window and the latency added per check."""

    strategy: str
    admitted: dict[int, dict[str, int]]
    denied: dict[int, dict[str, int]]
    added: list[float]  # seconds added to each check
    shares: list[tuple[float, dict[str, float]]] = field(default_factory=list)

    def per_phase(self, sc: Scenario) -> dict[str, list[float]]:
        out: dict[str, list[float]] = defaultdict(list)
        for w in self.windows(sc):
            out[sc.phase(w + 0.5)].append(self.total(w) / sc.limit)
        return out

    def windows(self, sc: Scenario) -> list[int]:
        """The whole windows of the run after the first three (the regions meeting)."""
        return [w for w in range(3, int(sc.duration)) if w in self.admitted or w in self.denied]

    def total(self, w: int) -> int:
        return sum(self.admitted[w].values())

    def back(self, sc: Scenario) -> int | None:
        """Windows after the shift until the total is within 5 % of the limit for good
        (until the partition)."""
        shift, cut = int(sc.t_shift), int(sc.t_cut)
        after = [w for w in self.windows(sc) if shift <= w < cut]
        for w in after:
            if all(abs(self.total(v) / sc.limit - 1) <= 0.05 for v in after if v >= w):
                return w - shift
        return None

    def unused(self, sc: Scenario) -> float:
        """The mean share of the limit left unused in windows where someone was denied."""
        gaps = [max(0.0, 1 - self.total(w) / sc.limit) for w in self.windows(sc)
                if any(self.denied[w].values())]
        return sum(gaps) / max(1, len(gaps))

    def ap_in_partition(self, sc: Scenario) -> float:
        cut = [self.admitted[w]["ap"] / sc.limit for w in self.windows(sc)
               if sc.phase(w + 0.5) == "partition"]
        return sum(cut) / max(1, len(cut))

    def latency(self) -> tuple[float, float]:
        """(mean, p99) of the latency added per check, seconds."""
        added = sorted(self.added)
        return sum(added) / max(1, len(added)), added[int(len(added) * 0.99)] if added else 0.0

    def figures(self, sc: Scenario) -> dict[str, Any]:
        mean, p99 = self.latency()
        phases = {p: {"mean": sum(v) / len(v), "min": min(v), "max": max(v)}
                  for p, v in self.per_phase(sc).items() if v}
        return {"added_latency_ms": {"mean": mean * 1e3, "p99": p99 * 1e3},
                "admitted_per_window_over_limit": phases, "back_within_5pct_windows":
                self.back(sc), "unused_while_denied": self.unused(sc),
                "ap_share_in_partition": self.ap_in_partition(sc), "checks": len(self.added)}


def run(strategy: str, sc: Scenario) -> Outcome:
    """One strategy on the scenario's arrivals (see the module docstring)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: one of {', '.join(STRATEGIES)} (got {strategy!r})")
    eng = Engine()
    clock = eng.clock
    t0 = eng.now
    rule = Rule(sc.limit, 1, algorithm="fixed_window")
    out = Outcome(strategy, defaultdict(lambda: defaultdict(int)),
                  defaultdict(lambda: defaultdict(int)), [])
    w0 = math.floor(clock.wall())

    def count(region: str, ok: bool) -> None:
        (out.admitted if ok else out.denied)[math.floor(clock.wall()) - w0][region] += 1

    check: Callable[[str], None]
    if strategy == "centralised":
        central = MemoryStore(clock=clock)

        def check(region: str) -> None:
            if region != "us" and sc.cut(eng.now - t0):
                out.added.append(0.5)  # a timeout, then fail-open
                count(region, True)
                return
            out.added.append(2 * delay(region, "us"))
            eng.call_later(delay(region, "us"),
                           lambda: count(region, central.hit("k", rule).allowed))
    elif strategy == "per-region":
        own = {r: MemoryStore(clock=clock) for r in REGIONS}

        def check(region: str) -> None:
            out.added.append(0.0)
            count(region, own[region].hit("k", rule).allowed)
    else:
        split = "static" if strategy == "static" else "demand"
        phases = {r: 0.1 * i for i, r in enumerate(REGIONS)}  # 0.1 s apart

        def record() -> None:
            out.shares.append((eng.now - t0, {r: s.shares("k", rule)[r]
                                              for r, s in stores.items()}))

        stores = demand_regions(
            eng, split, phases, on_sync=record,
            cut=lambda a, b: "ap" in (a, b) and sc.cut(eng.now - t0))

        def check(region: str) -> None:
            out.added.append(0.0)
            count(region, stores[region].hit("k", rule).allowed)

    offered = 2 * sc.limit  # per second, all regions together

    def arrive(region: str) -> None:
        t = eng.now - t0
        if t >= sc.duration:
            return
        check(region)
        eng.call_later(1.0 / (offered * sc.mix(t)[region]), arrive, region)

    for i, r in enumerate(REGIONS):
        eng.call_later(0.0001 * i, arrive, r)
    eng.run(until=t0 + sc.duration + 1.0)
    return out


@dataclass
class Convergence:
    """Intervals from the shift until the shares serve the new demand within 5 %, per
    alignment and shift offset, with and without the hurried syncs."""

    offsets: list[float]
    intervals: dict[str, dict[str, list[float]]]  # mode -> alignment -> per offset

    def worst(self, mode: str, alignment: str) -> float:
        return max(self.intervals[mode][alignment])

    def mean(self, mode: str, alignment: str) -> float:
        v = self.intervals[mode][alignment]
        return sum(v) / len(v)

    @property
    def figures(self) -> dict[str, Any]:
        return {"offsets": self.offsets, "intervals": self.intervals,
                "worst": {m: {a: self.worst(m, a) for a in ALIGNMENTS}
                          for m in self.intervals}}

    def text(self) -> str:
        modes = list(self.intervals)
        lines = ["| sync alignment | " + " | ".join(
                     f"{m}: worst / mean (intervals)" for m in modes) + " |",
                 "|---|" + "---:|" * len(modes)]
        for a in ALIGNMENTS:
            cells = [f"{self.worst(m, a):.2f} / {self.mean(m, a):.2f}" for m in modes]
            lines.append(f"| {a} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def converge_once(phases: dict[str, float], offset: float, *, hurry: bool = True,
                  limit: int = 200, before: float = 8.0, after: float = 6.0) -> float:
    """One shift: 80/10/10 of twice ``limit`` for ``before`` seconds (plus ``offset`` of
    an interval), then 10/10/80 for ``after``; the intervals from the shift until the
    shares in force serve the new demand within 5 % of the limit
    (``sum(min(share, demand)) >= 0.95``) for good (``inf``: never)."""
    eng = Engine()
    t0 = eng.now
    rule = Rule(limit, 1, algorithm="fixed_window")
    shift = t0 + 0.5 + before + offset * SYNC
    end = shift + after
    timeline: list[tuple[float, dict[str, float]]] = []

    def record() -> None:
        timeline.append((eng.now, {r: s.shares("k", rule)[r] for r, s in stores.items()}))

    stores = demand_regions(eng, "demand", phases, hurry=hurry, on_sync=record)

    def arrive(region: str) -> None:
        if eng.now >= end:
            return
        stores[region].hit("k", rule)
        mix = BEFORE if eng.now < shift else AFTER
        eng.call_later(1.0 / (2 * limit * mix[region]), arrive, region)

    for i, r in enumerate(REGIONS):
        eng.call_later(0.0001 * i, arrive, r)
    eng.run(until=end)
    demand = {r: 2 * AFTER[r] for r in REGIONS}
    good: float | None = None
    for t, shares in timeline:
        if t < shift:
            continue
        if sum(min(shares[r], demand[r]) for r in REGIONS) >= 0.95 - 1e-9:
            good = t if good is None else good
        else:
            good = None
    return math.inf if good is None else (good - shift) / SYNC


def convergence(offsets: int = 10, *, limit: int = 200) -> Convergence:
    """:func:`converge_once` at ``offsets`` offsets of the shift within the interval,
    for every alignment, with the hurried syncs and with regular syncs only."""
    points = [(i + 0.5) / offsets for i in range(offsets)]
    modes = {"hurried syncs": True, "regular syncs only": False}
    intervals = {m: {a: [converge_once(ph, o, hurry=h, limit=limit) for o in points]
                     for a, ph in ALIGNMENTS.items()}
                 for m, h in modes.items()}
    return Convergence(points, intervals)


@dataclass
class Regions:
    """A run of the four strategies (and, if measured, the convergence sweep)."""

    scenario: Scenario
    outcomes: dict[str, Outcome]
    conv: Convergence | None = None

    @property
    def figures(self) -> dict[str, Any]:
        sc = self.scenario
        out: dict[str, Any] = {
            "simulation": "regions", "regions": list(REGIONS),
            "one_way_delay_ms": {"-".join(sorted(k)): v * 1e3 for k, v in ONE_WAY.items()},
            "limit_per_s": sc.limit, "offered": "2x the limit", "seconds": sc.duration,
            "shift_at_s": sc.t_shift, "partition_s": [sc.t_cut, sc.t_heal],
            "strategies": {n: o.figures(sc) for n, o in self.outcomes.items()}}
        if self.conv is not None:
            out["convergence_intervals"] = self.conv.figures
        return out

    def text(self) -> str:
        sc = self.scenario
        lines = [
            f"regions: us, eu, ap, one-way delays 50/75/60 ms; one key, limit {sc.limit}/s, "
            f"offered 2x; {sc.duration:g} s virtual: 80/10/10, shift to 10/10/80 at "
            f"{sc.t_shift:g} s, ap cut off {sc.t_cut:g}-{sc.t_heal:g} s, healed",
            "",
            "| strategy | added ms per check: mean / p99 | " + " | ".join(
                f"{p}: admitted/limit mean / min / max" for p in PHASES)
            + " | windows back within 5 % | unused while denied |",
            "|---|---:|" + "---:|" * len(PHASES) + "---:|---:|"]
        for name, o in self.outcomes.items():
            mean, p99 = o.latency()
            phases = o.per_phase(sc)
            cells = [f"{sum(v) / len(v):.2f} / {min(v):.2f} / {max(v):.2f}"
                     if (v := phases.get(p)) else "-" for p in PHASES]
            back = o.back(sc)
            lines.append(f"| {name} | {mean * 1e3:.1f} / {p99 * 1e3:.0f} | "
                         + " | ".join(cells)
                         + f" | {'-' if back is None else back} | {o.unused(sc):.1%} |")
        if "demand" in self.outcomes and "static" in self.outcomes:
            d, s = self.outcomes["demand"], self.outcomes["static"]
            dp, sp = d.per_phase(sc), s.per_phase(sc)

            def mean_of(v: list[float]) -> float:
                return sum(v) / len(v) if v else math.nan

            lines += ["", f"demand vs static, global admitted/limit: "
                      f"{mean_of(dp[PHASES[0]]):.2f} vs {mean_of(sp[PHASES[0]]):.2f} before "
                      f"the shift, {mean_of(dp[PHASES[1]]):.2f} vs {mean_of(sp[PHASES[1]]):.2f}"
                      f" after; in the partition demand at most "
                      f"{max(dp[PHASES[2]] or [math.nan]):.2f} (ap keeps "
                      f"{d.ap_in_partition(sc):.2f} of the limit)"]
        if self.conv is not None:
            lines += ["", "demand split, from the shift until the shares in force serve the "
                      f"new demand within 5 % (sync intervals of 1 s; {len(self.conv.offsets)}"
                      " offsets of the shift in the interval):", "", self.conv.text()]
        return "\n".join(lines)

    def panels(self) -> list[Panel]:
        """The global admitted per window over the limit, per strategy; the demand split's
        shares in force per region."""
        sc = self.scenario
        lines = []
        for name, o in self.outcomes.items():
            ws = o.windows(sc)
            lines.append((name, [w + 0.5 for w in ws], [o.total(w) / sc.limit for w in ws]))
        panels: list[Panel] = [("regions: global admitted per window / limit",
                                "admitted / limit", False, lines)]
        d = self.outcomes.get("demand")
        if d is not None and d.shares:
            xs = [t for t, _ in d.shares]
            panels.append(("regions: demand split, share in force", "share of the limit",
                           False, [(r, xs, [s[r] for _, s in d.shares]) for r in REGIONS]))
        return panels


def simulate(*, duration: float = 60.0, limit: int = 1000, measure_convergence: bool = False,
             offsets: int = 10) -> Regions:
    """The four strategies on one scenario (and the convergence sweep if asked)."""
    if duration < 20 or limit < 20:
        raise ValueError("regions: duration must be at least 20 s and limit at least 20")
    sc = Scenario(duration, limit)
    outcomes = {s: run(s, sc) for s in STRATEGIES}
    conv = convergence(offsets) if measure_convergence else None
    return Regions(sc, outcomes, conv)


#: The regions part of ``stormguard simulate fleet``: a short run (a few seconds of real
#: time); bench/regions.py and bench/fleet.py run the full one (60 s, limit 1000).
FLEET_REGIONS: dict[str, Any] = {"duration": 30.0, "limit": 300,
                                 "measure_convergence": True, "offsets": 4}


def fleet_report(*, regions: bool = True, **options: Any) -> Report:
    """``stormguard simulate fleet``: the fleet (:func:`stormguard.sim.fleet.report`, with
    ``options``), then, unless ``regions=False``, its three regions under one global
    limit (:func:`simulate` with :data:`FLEET_REGIONS`): the regions table after the
    fleet's tables, its figures under ``"regional"``, its panels after the fleet's."""
    from stormguard.sim import fleet

    base = fleet.report(**options)
    if not regions:
        return base
    reg = simulate(**FLEET_REGIONS)
    base.text = base.text + "\n\n" + reg.text()
    base.figures = {**base.figures, "regional": reg.figures}
    base.panels = [*base.panels, *reg.panels()]
    base.scenarios = {**base.scenarios, "regions": (
        "3 regions (one-way delays 50/75/60 ms), one key under one global limit: a "
        "central counter, a copy per region, the real RegionalStore split statically "
        "and by demand, through a demand shift and a partition")}
    return base


def _fleet_signature() -> inspect.Signature:
    """The fleet report's keyword arguments and ``regions``: the command line refuses an
    option a simulation does not take by its signature, and the fleet's options are
    its own (another module's)."""
    from stormguard.sim import fleet

    params = [p for p in inspect.signature(fleet.report).parameters.values()
              if p.kind is inspect.Parameter.KEYWORD_ONLY]
    regions = inspect.Parameter("regions", inspect.Parameter.KEYWORD_ONLY, default=True,
                                annotation="bool")
    return inspect.Signature([*params, regions])


fleet_report.__signature__ = _fleet_signature()  # type: ignore[attr-defined]
