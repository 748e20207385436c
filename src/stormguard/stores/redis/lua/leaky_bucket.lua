-- leaky_bucket (as a meter): state "level last_us"; level in scaled units
-- the level at now (drained, clamped to 0) and the time it counts from: the stored
-- timestamp when the clock stepped back or stood still (no time passed, and a later call
-- with a faster clock gets no extra drain); the rate-limit check and the hybrid store's
-- forced add (lease.lua) share it
local function lb_level(st, now, N)
  if not st then return 0, now end
  local elapsed = now - st[2]
  if elapsed <= 0 then return st[1], st[2] end
  -- clamp before multiplying: past this many microseconds the bucket is empty
  if elapsed >= cdiv(st[1], N) then return 0, now end
  return st[1] - elapsed * N, now
end
if USED['lb'] then ALGOS['lb'] = {
  load = getnums,
  decide = function(st, now, N, W, B, cost, consume)
    local cap = B * W
    local level
    level, now = lb_level(st, now, N)
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
