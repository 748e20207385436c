"""Property: the breaker agrees with a plain reference model on random call sequences."""

from __future__ import annotations

import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import CircuitBreaker, CircuitOpen
from stormguard.testing import FakeClock


class Model:
    """The documented semantics, written the obvious way (sequential calls only)."""

    def __init__(self, window: int, rate: float, min_calls: int, open_for: float,
                 trials: int) -> None:
        self.window, self.rate, self.min_calls = window, rate, min_calls
        self.open_for, self.trials = open_for, trials
        self.state = "closed"
        self.outcomes: list[bool] = []  # True = failed
        self.open_until = 0.0
        self.trial_ok = 0

    def call(self, now: float, fails: bool) -> bool:
        """Whether the call was admitted; updates the state."""
        if self.state == "open":
            if now < self.open_until:
                return False
            self.state, self.trial_ok = "half_open", 0
        if self.state == "half_open":
            if fails:
                self.state, self.open_until = "open", now + self.open_for
            else:
                self.trial_ok += 1
                if self.trial_ok == self.trials:
                    self.state, self.outcomes = "closed", []
            return True
        self.outcomes = [*self.outcomes, fails][-self.window:]
        n = len(self.outcomes)
        if n >= self.min_calls and sum(self.outcomes) / n >= self.rate:
            self.state, self.open_until = "open", now + self.open_for
        return True


steps = st.lists(st.one_of(st.booleans(), st.floats(0.5, 20.0)), max_size=120)


@settings(max_examples=150, deadline=None)
@given(window=st.integers(1, 8), rate=st.sampled_from([0.25, 0.5, 0.75, 1.0]),
       min_frac=st.floats(0.0, 1.0), trials=st.integers(1, 3), steps=steps)
def test_breaker_matches_the_model(window: int, rate: float, min_frac: float, trials: int,
                                   steps: list[bool | float]) -> None:
    min_calls = max(1, round(window * min_frac))
    clock = FakeClock()
    breaker = CircuitBreaker(window=window, failure_rate=rate, min_calls=min_calls,
                             open_for=10.0, half_open_calls=trials, clock=clock)
    model = Model(window, rate, min_calls, 10.0, trials)
    calls = 0

    def dependency(fails: bool) -> None:
        nonlocal calls
        calls += 1
        if fails:
            raise ConnectionError

    for step in steps:
        if isinstance(step, float):
            clock.advance(step)
            continue
        before = calls
        with contextlib.suppress(CircuitOpen, ConnectionError):
            breaker.call(dependency, step)
        admitted = model.call(clock.monotonic(), step)
        assert (calls - before == 1) == admitted
        assert breaker.state == model.state, (step, model.outcomes)
