-- fixed_window: state "window_index used"
ALGOS['fw'] = function() return {
  load = getnums,
  decide = function(st, now, N, W, B, cost, consume)
    local w = fdiv(now, W)
    local used = 0
    if st and st[1] == w then
      used = st[2]
    end
    local e = (w + 1) * W
    if used + cost <= N then
      if consume then
        used = used + cost
        st = {w, used}
      end
      local reset = 0
      if used > 0 then
        reset = e - now
      end
      return true, st, N - used, reset, 0, e
    end
    return false, st, N - used, e - now, e - now, e
  end,
  save = putnums,
} end
