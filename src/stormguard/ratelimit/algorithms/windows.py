"""Window counters over epoch-aligned windows ``[k*W, (k+1)*W)``: fixed window and the
sliding window counter (Cloudflare's estimate)."""

from __future__ import annotations

from typing import Any

from stormguard.ratelimit.algorithms.base import Algorithm, Transition, Verdict

__all__ = ["FixedWindow", "SlidingWindowCounter"]


class FixedWindow(Algorithm):
    """At most ``N`` per window. State ``(window_index, used)``."""

    __slots__ = ()
    name = "fixed_window"
    FRESH = (-1, 0)

    @property
    def magnitude(self) -> int:
        return self.N  # counts only: no product of the window with anything

    def expires_of(self, state: Any) -> int:
        return int(state[0] + 1) * self.W

    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Transition:
        W, N = self.W, self.N
        window, used = now // W, 0
        if state is not None:
            stored, count = state
            if stored > window:  # the clock stepped back: keep counting in the newer window
                window, now = stored, stored * W
            if stored == window:
                used = count
        end = (window + 1) * W
        allowed = used + cost <= N
        if allowed and consume:
            used += cost
            state = (window, used)
        return (allowed, state, N - used, end - now if used else 0,
                0 if allowed else end - now,
                now if state is None else self.expires_of(state))

    def apply(self, entry: list[Any], now: int, cost: int, consume: bool) -> Verdict:
        W: int = self.W
        N: int = self.N
        w = now // W
        used: int = 0
        sw: int = entry[1]
        if sw >= w:
            if sw > w:  # the clock stepped back: stay in the newer window
                w = sw
                now = w * W
            used = entry[2]
        # no multiplication: compiled, a product above 2**31 (any window over 35 min in µs)
        # leaves the machine-integer fast path
        end = now - now % W + W
        if used + cost <= N:
            if consume:
                used += cost
                entry[0] = end
                entry[1] = w
                entry[2] = used
            return (True, N - used, end - now if used else 0, 0)
        return (False, N - used, end - now, end - now)


class SlidingWindowCounter(Algorithm):
    """The estimate ``prev * (W - elapsed) / W + cur`` over epoch-aligned windows: admitted
    iff ``prev * (W - elapsed) + (cur + cost) * W <= N * W`` (exact integers).
    State ``(window_index, current, previous)``."""

    __slots__ = ()
    name = "sliding_window_counter"
    FRESH = (-2, 0, 0)

    def expires_of(self, state: Any) -> int:
        return int(state[0] + 2) * self.W

    def decide(self, state: Any, now: int, cost: int, consume: bool) -> Transition:
        W, N = self.W, self.N
        window = now // W
        cur = prev = 0
        if state is not None:
            stored, s_cur, s_prev = state
            if stored > window:  # the clock stepped back: keep counting in the newer window
                window, now = stored, stored * W
            if stored == window:
                cur, prev = s_cur, s_prev
            elif stored == window - 1:
                prev = s_cur
        start = window * W
        elapsed = now - start
        weight = W - elapsed  # the previous window's weight, in 1/W: it fades out linearly
        allowed = prev * weight + (cur + cost) * W <= N * W
        if allowed:
            retry = 0
        elif cur + cost <= N:
            # later in this window, once prev's weight has faded enough:
            # prev * (W - elapsed - retry) <= (N - cur - cost) * W
            retry = W - elapsed - (N - cur - cost) * W // prev
        else:
            # in the next window, where cur becomes the previous count:
            # cur * (W - elapsed') <= (N - cost) * W, elapsed' = retry - (W - elapsed)
            retry = W - elapsed + max(0, W - (N - cost) * W // cur)
        if allowed and consume:
            cur += cost
            state = (window, cur, prev)
        remaining = max(0, (N * W - prev * weight) // W - cur)
        reset = start + 2 * W - now if cur else start + W - now if prev else 0
        return (allowed, state, remaining, reset, retry,
                now if state is None else self.expires_of(state))

    def apply(self, entry: list[Any], now: int, cost: int, consume: bool) -> Verdict:
        W: int = self.W
        N: int = self.N
        w = now // W
        start = now - now % W
        sw: int = entry[1]
        if sw >= w:
            if sw > w:  # the clock stepped back: stay in the newer window
                w = sw
                start = now = w * W
            cur: int = entry[2]
            prev: int = entry[3]
        elif sw == w - 1:
            cur = 0
            prev = entry[2]
        else:
            cur = prev = 0
        elapsed = now - start
        prev_part = prev * (W - elapsed)
        if prev_part + (cur + cost) * W <= self.C:
            allowed = True
            retry = 0
            if consume:
                cur += cost
                entry[0] = start + W + W
                entry[1] = w
                entry[2] = cur
                entry[3] = prev
        else:
            allowed = False
            free = N - cur - cost
            if free >= 0:
                # still inside this window: wait until prev's weight has decayed enough
                retry = (W - (free * W) // prev) - elapsed
            else:
                # next window: cur becomes prev
                w2 = ((N - cost) * W) // cur
                w2 = min(w2, W)
                retry = start + W + (W - w2) - now
        remaining = N + (-prev_part) // W - cur  # (N * W - prev_part) // W - cur
        remaining = max(remaining, 0)
        if cur:
            reset = start + W + W - now
        elif prev:
            reset = start + W - now
        else:
            reset = 0
        return (allowed, remaining, reset, retry)
