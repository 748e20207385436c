-- fixed_window: state "window_index used" (and units appended: fwstate in the prelude)
if USED['fw'] then ALGOS['fw'] = {
  load = function(key)
    local v = redis.call('GET', key)
    if not v then
      return nil
    end
    return fwstate(v)
  end,
  decide = function(st, now, N, W, B, cost, consume)
    local w = fdiv(now, W)
    local used = 0
    if st and st[1] >= w then
      if st[1] > w then
        -- the clock stepped back (or this client's clock is behind the one that wrote
        -- the state): stay in the newer window, as if now were its start
        w = st[1]
        now = w * W
      end
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
    local left = N - used  -- (past the limit only by the hybrid store's forced adds)
    if left < 0 then
      left = 0
    end
    return false, st, left, e - now, e - now, e
  end,
  save = putnums,
} end
