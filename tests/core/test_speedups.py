"""The compiled hot path (mypyc) and the pure-Python one decide identically, and the
compiled one is used only when it was built from the sources in the tree."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stormguard.ratelimit.algorithms as algorithms
from stormguard import _speedups
from tests.core.replay import replay
from tests.core.util import ALGORITHMS

ROOT = Path(__file__).resolve().parents[2]


ALGORITHM_MODULES = tuple(m for m in _speedups.COMPILED_MODULES
                          if m.startswith("stormguard.ratelimit.algorithms"))


def load_pure_algorithms() -> ModuleType:
    """``stormguard.ratelimit.algorithms`` (the package and its modules) from the .py files,
    whether or not compiled ones are in use: imported afresh through the source-only
    finder, then the modules in use are put back (the pure ones keep each other)."""
    saved = {name: sys.modules.pop(name) for name in ALGORITHM_MODULES if name in sys.modules}
    finder = _speedups._SourceOnlyFinder(ALGORITHM_MODULES)
    sys.meta_path.insert(0, finder)
    try:
        module = importlib.import_module("stormguard.ratelimit.algorithms")
    finally:
        sys.meta_path.remove(finder)
        for name in ALGORITHM_MODULES:
            sys.modules.pop(name, None)
        sys.modules.update(saved)
        for name, mod in saved.items():  # the import also rebound the parent's attribute
            parent, _, child = name.rpartition(".")
            setattr(sys.modules[parent], child, mod)
    return module


PURE = load_pure_algorithms()


def test_status_is_reported() -> None:
    assert _speedups.STATUS.startswith(("compiled", "pure Python ("))
    assert _speedups.compiled() == _speedups.STATUS.startswith("compiled")
    for name in _speedups.COMPILED_MODULES:
        origin = importlib.import_module(name).__file__ or ""
        assert origin.endswith(".py") != _speedups.compiled(), (origin, _speedups.STATUS)
    assert PURE is not algorithms
    assert sys.modules["stormguard.ratelimit.algorithms"] is algorithms
    assert sys.modules["stormguard.ratelimit"].algorithms is algorithms
    for cls in PURE.ALGORITHMS.values():
        module = getattr(PURE, cls.__module__.rpartition(".")[2])
        assert module is not sys.modules[cls.__module__]
        assert (module.__file__ or "").endswith(".py"), module
        assert cls is not algorithms.ALGORITHMS[cls.name]


steps = st.lists(
    st.tuples(
        st.integers(-2_000_000, 70_000_000),  # clock step in µs; negative = clock stepped back
        st.integers(1, 4),  # cost (clipped to the capacity)
        st.booleans(),  # consume
    ),
    min_size=1, max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(algo=st.sampled_from(ALGORITHMS), limit=st.sampled_from([1, 2, 3, 10, 997, 10**6]),
       window_us=st.sampled_from([1_000, 500_000, 1_000_000, 60_000_000, 604_800_000_000]),
       burst=st.integers(1, 30), trace=steps, start=st.integers(0, 2**50))
def test_compiled_and_pure_algorithms_agree(algo: str, limit: int, window_us: int, burst: int,
                                            trace: list[tuple[int, int, bool]],
                                            start: int) -> None:
    fast = algorithms.ALGORITHMS[algo](limit, window_us, burst)
    pure = PURE.ALGORITHMS[algo](limit, window_us, burst)
    fast_entry, pure_entry = fast.fresh(), pure.fresh()
    state: Any = None
    now = start
    for step, cost, consume in trace:
        now += step
        c = min(cost, fast.B)
        got = fast.apply(fast_entry, now, c, consume)
        want = pure.apply(pure_entry, now, c, consume)
        assert got == want
        assert fast_entry == pure_entry
        assert fast.decide(None, now, c, consume) == pure.decide(None, now, c, consume)
        decided = fast.decide(state, now, c, consume)
        assert decided == pure.decide(state, now, c, consume)
        if fast.reservable:
            wait = step % 3_000_000
            assert fast.reserve(state, now, c, wait, consume) == \
                pure.reserve(state, now, c, wait, consume)
        state = decided[1]


def random_cases(seed: int, count: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    cases = []
    for _ in range(count):
        rules = []
        for _ in range(rnd.randint(1, 3)):
            algo = rnd.choice(ALGORITHMS)
            burst = rnd.choice([None, rnd.randint(1, 20)]) if algo in (
                "token_bucket", "gcra", "leaky_bucket") else None
            rules.append([rnd.choice([1, 3, 10, 100]), rnd.choice([0.5, 1, 60, 3600]),
                          algo, burst])
        now = 1_700_000_000_000_000 + rnd.randint(0, 10**12)
        ops = []
        for _ in range(rnd.randint(1, 80)):
            now += rnd.choice([0, 0, 1, 999, 250_000, 1_000_000, 61_000_000, -500_000])
            ops.append([rnd.choice(["hit", "hit", "hit", "peek", "hit_all", "reset"]),
                        rnd.choice(["a", "b", "c", "ü\u200d", "{x}"]), rnd.randint(1, 3),
                        now, rnd.randint(0, 2)])
        cases.append({"rules": rules, "max_keys": rnd.choice([1, 2, 5, 100_000]), "ops": ops})
    return cases


def test_pure_python_store_decides_like_this_process() -> None:
    """Whole traces (hit, peek, hit_all, reset, eviction, a clock stepping back) replayed
    in a child process forced to pure Python give the Decisions this process gives."""
    cases = random_cases(seed=20261130, count=400)
    env = {**os.environ, "STORMGUARD_PURE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    child = subprocess.run([sys.executable, str(ROOT / "tests/core/replay.py")],
                           input=json.dumps(cases), capture_output=True, text=True,
                           env=env, check=True, timeout=120)
    theirs = json.loads(child.stdout)
    ours = json.loads(json.dumps([replay(case) for case in cases]))
    assert len(theirs) == len(ours) == len(cases)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a == b, f"case {i}: {cases[i]}"
    allowed = sum(1 for out in ours for d in out if d is not None and d[0])
    denied = sum(1 for out in ours for d in out if d is not None and not d[0])
    evicted = sum(out[-1][-1] for out in ours if out and out[-1] is not None)
    assert allowed > 1000
    assert denied > 1000
    assert evicted > 100


_SIM = """
import json, sys
import stormguard._speedups as sp, stormguard.sim.model as m
from stormguard.sim.salenight import scenarios
from stormguard.sim.scenario import from_dict
out = {}
for name in ("slow_dependency", "breaker", "bulkhead", "with_budget"):
    data = scenarios()[name]
    data["duration"] = 12
    data["measure"] = {"start": 2, "end": 12}
    r = m.run(from_dict(data))
    out[name] = {"counts": r.series.counts, "events": r.events,
                 "busy": {k: [g.area, g.peak] for k, g in r.busy.items()},
                 "transitions": r.transitions}
print(json.dumps({"status": sp.STATUS, "file": m.__file__, "out": out}, sort_keys=True))
"""


def test_pure_python_simulator_runs_like_this_process() -> None:
    """Four sale-night scenarios (slow dependency, breaker, bulkhead, retry budget) give
    the same counts, levels, breaker transitions and events in a child running what this
    process runs (the compiled simulator on the compiled build) and in a child forced to
    pure Python."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    runs = []
    for pure in ("1", os.environ.get("STORMGUARD_PURE", "")):
        child = subprocess.run([sys.executable, "-c", _SIM], capture_output=True, text=True,
                               env={**env, "STORMGUARD_PURE": pure}, check=True, timeout=300)
        runs.append(json.loads(child.stdout))
    pure_run, this_run = runs
    assert pure_run["file"].endswith("model.py")
    assert this_run["file"].endswith(".py") != _speedups.compiled(), this_run
    assert this_run["out"] == pure_run["out"]
    counts = this_run["out"]["bulkhead"]["counts"]
    assert sum(counts["orders:success"]) > 1000  # the runs did work
    assert this_run["out"]["breaker"]["transitions"]  # and the breaker opened


def test_child_process_really_runs_pure_python() -> None:
    env = {**os.environ, "STORMGUARD_PURE": "1", "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-c", "import stormguard._speedups as s, "
         "stormguard.ratelimit.algorithms as a, stormguard.stores.memory as m; "
         "print(s.STATUS); print(a.__file__); print(m.__file__)"],
        capture_output=True, text=True, env=env, check=True, timeout=60).stdout.splitlines()
    assert out[1].endswith("__init__.py"), out
    assert out[2].endswith("memory.py"), out
    assert out[0].startswith("pure Python"), out


# -- the choice itself, on a copy of the package layout ------------------------------
def make_tree(tmp_path: Path, *, compiled: bool, manifest: bool = True) -> Path:
    pkg = tmp_path / "stormguard"
    for module in _speedups.COMPILED_MODULES:
        src = _speedups.source_path(module)
        dst = pkg.joinpath(*module.split(".")[1:])
        dst = dst / "__init__.py" if src.name == "__init__.py" else dst.with_suffix(".py")
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(src.read_bytes())
        if compiled:
            (dst.with_suffix("").parent / (dst.stem + ".cpython-311-x86_64-linux-gnu.so")
             ).write_bytes(b"")
    if compiled:
        (tmp_path / f"{_speedups.GROUP_LIBRARY}.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    if manifest:
        import hashlib

        (pkg / _speedups.MANIFEST).write_text(json.dumps({
            m: hashlib.sha256(_speedups.source_path(m).read_bytes()).hexdigest()
            for m in _speedups.COMPILED_MODULES}))
    return pkg


@pytest.fixture
def linux_suffix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_speedups, "EXTENSION_SUFFIXES", [".cpython-311-x86_64-linux-gnu.so"])
    monkeypatch.delenv("STORMGUARD_PURE", raising=False)


@pytest.mark.usefixtures("linux_suffix")
def test_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _speedups._decide(make_tree(tmp_path / "none", compiled=False)) == (
        "pure Python (not compiled at install)", False)
    good = make_tree(tmp_path / "good", compiled=True)
    assert _speedups._decide(good) == ("compiled (mypyc)", False)

    monkeypatch.setenv("STORMGUARD_PURE", "1")
    assert _speedups._decide(good) == ("pure Python (STORMGUARD_PURE is set)", True)
    monkeypatch.setenv("STORMGUARD_PURE", "0")
    assert _speedups._decide(good)[0] == "compiled (mypyc)"

    edited = make_tree(tmp_path / "edited", compiled=True)
    memory = edited / "stores" / "memory.py"
    memory.write_text(memory.read_text() + "\n# an edit\n")
    status, bypass = _speedups._decide(edited)
    assert bypass
    assert "stormguard.stores.memory changed since it was compiled" in status

    no_manifest = make_tree(tmp_path / "nomanifest", compiled=True, manifest=False)
    assert _speedups._decide(no_manifest)[1] is True

    no_group = make_tree(tmp_path / "nogroup", compiled=True)
    next(no_group.parent.glob(f"{_speedups.GROUP_LIBRARY}*")).unlink()
    assert _speedups._decide(no_group) == (
        f"pure Python ({_speedups.GROUP_LIBRARY} is missing)", True)

    bad_manifest = make_tree(tmp_path / "badmanifest", compiled=True)
    (bad_manifest / _speedups.MANIFEST).write_text("[1, 2]")
    assert _speedups._decide(bad_manifest) == (
        f"pure Python ({_speedups.MANIFEST} is not a mapping)", True)

    no_sources = make_tree(tmp_path / "nosources", compiled=True)
    for py in no_sources.rglob("*.py"):
        py.unlink()  # a build that ships only the compiled modules
    assert _speedups._decide(no_sources) == ("compiled (mypyc)", False)

    one_missing = make_tree(tmp_path / "one", compiled=True)
    next((one_missing / "stores").glob("memory*.so")).unlink()
    assert _speedups._decide(one_missing) == (
        "pure Python (stormguard.stores.memory is not compiled)", True)


def test_source_only_finder_prefers_the_py_file(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text("X = 1\n")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        (pkg / f"mod{suffix}").write_bytes(b"not a real extension")
    finder = _speedups._SourceOnlyFinder(["pkg.mod"])
    spec = finder.find_spec("pkg.mod", [str(pkg)])
    assert spec is not None
    assert spec.origin == str(pkg / "mod.py")
    assert finder.find_spec("pkg.other", [str(pkg)]) is None
    assert finder.find_spec("pkg.mod", None) is None
    normal = importlib.machinery.PathFinder.find_spec("pkg.mod", [str(pkg)])
    assert normal is not None
    assert normal.origin != str(pkg / "mod.py")


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_rules_survive_pickle_and_copy(algo: str) -> None:
    """Compiled classes are not picklable by default: a Rule sent to a worker process
    or deep-copied must still decide like the original."""
    import copy
    import pickle

    from stormguard import MemoryStore, RateLimiter, Rule
    from stormguard.testing import FakeClock

    burst = 7 if algo in ("token_bucket", "gcra", "leaky_bucket") else None
    rule = Rule(5, 10, algorithm=algo, burst=burst)
    for clone in (pickle.loads(pickle.dumps(rule)), copy.deepcopy(rule), copy.copy(rule)):
        assert clone == rule
        assert type(clone._algo) is type(rule._algo)
        assert (clone._algo.N, clone._algo.W, clone._algo.B) == (
            rule._algo.N, rule._algo.W, rule._algo.B)
        a, b = RateLimiter(MemoryStore(clock=FakeClock())), \
            RateLimiter(MemoryStore(clock=FakeClock()))
        got = [a.hit("k", clone) for _ in range(9)]
        want = [b.hit("k", rule) for _ in range(9)]
        assert [d[:5] for d in got] == [d[:5] for d in want]
        assert all(d.rule == clone for d in got)
        assert pickle.loads(pickle.dumps(got[-1])) == got[-1]


SUBCLASS = """
import sys
if "block" in sys.argv:
    sys.modules["mypy_extensions"] = None  # as if it were not installed
from stormguard import MemoryStore, RateLimiter, Rule, _speedups

class Counting(MemoryStore):
    calls = 0

    def hit(self, key, rule, cost=1):
        self.calls += 1
        return super().hit(key, rule, cost)

store = Counting()
limiter = RateLimiter(store)
rule = Rule.parse("2/minute")
print(_speedups.STATUS)
print([limiter.hit("k", rule).allowed for _ in range(3)], store.calls, len(store))
"""


@pytest.mark.parametrize("argv", [[], ["block"]])
def test_memory_store_can_be_subclassed(argv: list[str]) -> None:
    """Compiled classes refuse Python subclasses unless marked; MemoryStore is marked,
    and the mark needs no mypy_extensions at run time."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", SUBCLASS, *argv], capture_output=True,
                         text=True, env=env, check=True, timeout=60).stdout.splitlines()
    assert out[0] == _speedups.STATUS
    assert out[1] == "[True, True, False] 3 1"


CLOCK_SUBCLASS = """
import sys
if "block" in sys.argv:
    sys.modules["mypy_extensions"] = None  # as if it were not installed
from stormguard import _speedups
from stormguard.testing import FakeClock
import stormguard.testing.clock as module

class Stepping(FakeClock):
    '''A user's clock: every read moves it on by a millisecond.'''

    reads = 0

    def monotonic(self):
        self.reads += 1
        self.advance(0.001)
        return super().monotonic()

clock = Stepping(monotonic_start=0.0)
clock.label = "mine"  # a Python subclass keeps its instance dictionary
print(_speedups.STATUS)
print(module.__file__.endswith(".py"), [round(clock.monotonic(), 3) for _ in range(3)],
      clock.reads, clock.label, isinstance(clock, FakeClock))
"""


@pytest.mark.parametrize("argv", [[], ["block"]])
def test_fake_clock_can_be_subclassed(argv: list[str]) -> None:
    """FakeClock is compiled with the hot path (the simulator's clock is its compiled
    subclass); a Python subclass still overrides its methods and keeps attributes of its
    own, with or without mypy_extensions at run time."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", CLOCK_SUBCLASS, *argv], capture_output=True,
                         text=True, env=env, check=True, timeout=60).stdout.splitlines()
    assert out[0] == _speedups.STATUS
    assert out[1] == f"{not _speedups.compiled()} [0.001, 0.002, 0.003] 3 mine True"
