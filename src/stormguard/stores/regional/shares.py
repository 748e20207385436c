"""The share arithmetic of :class:`RegionalStore`: water-filling, partitions, limits.

Pure functions on floats (fractions of the global limit) and integers (the limits each
region enforces); no I/O, no clock. Every region runs the same functions on the demand
reports it holds, so regions that hold the same reports compute the same shares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["enforced_share", "local_limit", "plan_shares", "waterfill"]


def waterfill(demand: Sequence[float], total: float = 1.0, floor: float = 0.0,
              prior: Sequence[float] | None = None) -> list[float]:
    """Split ``total`` among regions by their ``demand`` (in units of the global limit).

    Every region gets at least ``floor`` (lowered to ``total / n`` when ``n`` floors do
    not fit) and the shares sum to ``total``:

    * overload (the demands, each raised to the floor, do not fit): max-min fair
      water-filling, ``share = max(floor, min(demand, level))`` with the one ``level``
      that makes the sum ``total``: small demands are met in full, the large ones are
      cut to the same level, nobody is cut below someone who is served more;
    * underload: every demand is met (``max(floor, demand)``) and what is left is
      shared in proportion to demand, so each region has headroom in proportion to its
      traffic. When nobody has any demand the shares are ``prior`` scaled to ``total``
      (equal when omitted, floors first if a prior share is below the floor).
    """
    n = len(demand)
    if n == 0:
        return []
    floor = min(floor, total / n)
    if sum(demand) <= 0 and prior is not None and sum(prior) > 0:
        psum = sum(prior)
        split = [total * p / psum for p in prior]
        if min(split) >= floor:
            return split  # nobody asks: the prior as it is (the static weights)
    need = [max(floor, d) for d in demand]
    if sum(need) >= total:
        order = sorted(range(n), key=lambda i: demand[i], reverse=True)
        level = floor
        rest = sum(need)
        for k in range(1, n + 1):
            # the k largest demands are cut to `level`, the others keep max(floor, demand)
            rest -= need[order[k - 1]]
            level = (total - rest) / k
            below = demand[order[k]] if k < n else float("-inf")
            if level >= below:
                break
        shares = [max(floor, min(d, level)) for d in demand]
    else:
        left = total - sum(need)
        weights = list(demand) if sum(demand) > 0 else (
            list(prior) if prior is not None and sum(prior) > 0 else [1.0] * n)
        wsum = sum(weights)
        shares = [need[i] + left * weights[i] / wsum for i in range(n)]
    # one correction for the rounding of the sums: the shares add up to `total`
    err = sum(shares) - total
    if err:
        big = max(range(n), key=lambda i: shares[i])
        shares[big] = max(0.0, shares[big] - err)
    return shares


def plan_shares(regions: Sequence[str], demand: Mapping[str, float], fresh: set[str],
                last: Mapping[str, float] | None, weights: Mapping[str, float],
                min_share: float) -> dict[str, float]:
    """The share of every region as one region computes it.

    ``fresh`` are the regions whose reports are recent (this region included); the
    others are stale (silent for longer than the lease): they keep the share ``last``
    gave them (their static weight when there is none), and the fresh regions water-fill
    what is left. So whatever a stale region still admits was already set aside.
    """
    stale = [r for r in regions if r not in fresh]
    frozen = {r: (last[r] if last is not None and r in last else weights[r]) for r in stale}
    live = [r for r in regions if r in fresh]
    total = max(0.0, 1.0 - sum(frozen.values()))
    split = waterfill([demand.get(r, 0.0) for r in live], total, min_share,
                      [weights[r] for r in live])
    out = dict(frozen)
    out.update(zip(live, split, strict=True))
    return {r: out[r] for r in regions}


def enforced_share(computed: float, previous: float | None, weight: float,
                   isolated: bool) -> float:
    """The share a region enforces after a sync.

    * ``isolated`` (it heard from no peer within the lease): the smaller of its last
      share and its static weight, so the isolated regions together never exceed the
      weights, which sum to 1.
    * otherwise a decrease applies at once and an increase waits:
      ``min(computed, previous)``, ``previous`` being the share in force (the static
      weight for a key seen for the first time). The store raises later, to a claim its
      peers have acknowledged.
    """
    if isolated:
        return min(previous if previous is not None else weight, weight)
    return min(computed, previous if previous is not None else weight)


def local_limit(limit: int, share: float) -> int:
    """The limit a region enforces for ``share`` of ``limit``: rounded down (so the
    regions' limits never add up to more than ``limit``), at least 1 (a rule needs a
    positive limit: a region whose share is below one unit admits one per window)."""
    return max(1, int(limit * share + 1e-9))
