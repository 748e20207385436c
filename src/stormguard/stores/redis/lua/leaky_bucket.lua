-- leaky_bucket (as a meter): state "level last_us"; level in scaled units
if USED['lb'] then ALGOS['lb'] = {
  load = getnums,
  decide = function(st, now, N, W, B, cost, consume)
    local cap = B * W
    local level = 0
    if st then
      level = st[1]
      local elapsed = now - st[2]
      if elapsed > 0 then
        -- clamp before multiplying: past this many microseconds the bucket is empty
        if elapsed >= cdiv(level, N) then
          level = 0
        else
          level = level - elapsed * N
        end
      else
        -- the clock stepped back (or stood still): no time passed, and the stored
        -- timestamp is kept, so a later call with a faster clock gets no extra drain
        now = st[2]
      end
    end
    local add = cost * W
    local allowed, retry = false, 0
    if add <= cap - level then  -- level + add <= cap
      allowed = true
      if consume then
        level = level + add
        st = {level, now}
      end
    else
      retry = cdiv(add - (cap - level), N)
    end
    local reset = cdiv(level, N)
    return allowed, st, fdiv(cap - level, W), reset, retry, now + reset
  end,
  save = putnums,
} end
