-- token_bucket: state "level last_us"; level in scaled tokens (one token = W units)
if USED['tb'] then ALGOS['tb'] = {
  load = getnums,
  decide = function(st, now, N, W, B, cost, consume)
    local cap = B * W
    local level = cap
    if st then
      level = st[1]
      local elapsed = now - st[2]
      if elapsed > 0 then
        -- clamp before multiplying: past this many microseconds the bucket is full
        if elapsed >= cdiv(cap - level, N) then
          level = cap
        else
          level = level + elapsed * N
        end
      else
        -- the clock stepped back (or stood still): no time passed, and the stored
        -- timestamp is kept, so a later call with a faster clock gets no extra refill
        now = st[2]
      end
    end
    local need = cost * W
    local allowed, retry = false, 0
    if level >= need then
      allowed = true
      if consume then
        level = level - need
        st = {level, now}
      end
    else
      retry = cdiv(need - level, N)
    end
    local reset = cdiv(cap - level, N)
    return allowed, st, fdiv(level, W), reset, retry, now + reset
  end,
  save = putnums,
} end
