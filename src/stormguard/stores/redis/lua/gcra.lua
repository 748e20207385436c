-- gcra: the theoretical arrival time scaled by N (tat_us * N) would exceed 2^53, so it is
-- stored as "tat_us remainder" (tat_scaled = tat_us * N + remainder, 0 <= remainder < N)
-- and all arithmetic is done on the debt relative to now, which stays below B * W
-- (unless the clock stepped back: then a denial is computed from the debt's parts).
if USED['gcra'] then ALGOS['gcra'] = {
  load = getnums,
  decide = function(st, now, N, W, B, cost, consume)
    local tol = B * W
    local need = cost * W
    -- debt = d * N + r: how far the TAT is ahead of now. After a clock stepped back far
    -- (or a client behind the one that wrote the state), d * N can pass 2^53, so the
    -- debt is only formed once it is known to be at most tol
    local d, r = 0, 0
    if st and st[1] >= now then
      d = st[1] - now
      r = st[2]
    end
    if d <= fdiv(tol - need - r, N) then  -- debt + need <= tol
      local debt = d * N + r
      if consume then
        debt = debt + need
        local q = fdiv(debt, N)
        st = {now + q, debt - q * N}
      end
      local reset = cdiv(debt, N)
      return true, st, fdiv(tol - debt, W), reset, 0, now + reset
    end
    -- denied: the same formulas, from the parts
    local retry = d + cdiv(need - tol + r, N)  -- ceil((debt + need - tol) / N)
    local reset = d + cdiv(r, N)  -- ceil(debt / N)
    local dq = fdiv(d, W)
    local remaining = fdiv(tol - r - (d - dq * W) * N, W) - dq * N  -- floor((tol - debt) / W)
    if remaining < 0 then
      -- a clock far behind the state: never below zero (and a large negative value,
      -- whose low digits a double may lose when limit x window >= 2^53, never shows)
      remaining = 0
    end
    return false, st, remaining, reset, retry, now + reset
  end,
  save = putnums,
} end
