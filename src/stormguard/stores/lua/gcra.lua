-- gcra: the theoretical arrival time scaled by N (tat_us * N) would exceed 2^53, so it is
-- stored as "tat_us remainder" (tat_scaled = tat_us * N + remainder, 0 <= remainder < N)
-- and all arithmetic is done on the debt relative to now, which stays below B * W.
ALGOS['gcra'] = function() return {
  load = getnums,
  decide = function(st, now, N, W, B, cost, consume)
    local tol = B * W
    local debt = 0
    if st and st[1] >= now then
      debt = (st[1] - now) * N + st[2]
    end
    local need = cost * W
    local allowed, retry = false, 0
    if need <= tol - debt then  -- debt + need <= tol, without the larger sum
      local nd = debt + need
      allowed = true
      if consume then
        debt = nd
        local q = fdiv(nd, N)
        st = {now + q, nd - q * N}
      end
    else
      retry = cdiv(need - (tol - debt), N)
    end
    local reset = cdiv(debt, N)
    return allowed, st, fdiv(tol - debt, W), reset, retry, now + reset
  end,
  save = putnums,
} end
