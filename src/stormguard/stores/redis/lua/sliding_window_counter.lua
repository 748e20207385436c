-- sliding_window_counter: state "window_index current previous"
if USED['swc'] then ALGOS['swc'] = {
  load = getnums,
  decide = function(st, now, N, W, B, cost, consume)
    local w = fdiv(now, W)
    local start = w * W
    local cur, prev = 0, 0
    if st then
      if st[1] >= w then
        if st[1] > w then
          -- the clock stepped back: stay in the newer window, as if now were its start
          w = st[1]
          start = w * W
          now = start
        end
        cur = st[2]
        prev = st[3]
      elseif st[1] == w - 1 then
        prev = st[2]
      end
    end
    local elapsed = now - start
    local prev_part = prev * (W - elapsed)
    local allowed, retry = false, 0
    if prev_part <= (N - cur - cost) * W then  -- prev_part + (cur + cost) * W <= N * W
      allowed = true
      if consume then
        cur = cur + cost
        st = {w, cur, prev}
      end
    else
      local free = N - cur - cost
      if free >= 0 then
        retry = (W - fdiv(free * W, prev)) - elapsed
      else
        local w2 = fdiv((N - cost) * W, cur)
        if w2 > W then
          w2 = W
        end
        retry = start + W + (W - w2) - now
      end
    end
    local remaining = fdiv(N * W - prev_part, W) - cur
    if remaining < 0 then
      remaining = 0
    end
    local reset = 0
    if cur > 0 then
      reset = start + 2 * W - now
    elseif prev > 0 then
      reset = start + W - now
    end
    return allowed, st, remaining, reset, retry, start + 2 * W
  end,
  save = putnums,
} end
