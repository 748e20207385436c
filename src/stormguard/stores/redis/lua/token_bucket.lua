-- token_bucket: state "level last_us"; level in scaled tokens (one token = W units)
-- the level at now (refilled, clamped to cap) and the time it counts from: the stored
-- timestamp when the clock stepped back or stood still (no time passed, and a later call
-- with a faster clock gets no extra refill); the rate-limit check and the hybrid store's
-- forced add (lease.lua) share it
local function tb_level(st, now, N, cap)
  if not st then return cap, now end
  local elapsed = now - st[2]
  if elapsed <= 0 then return st[1], st[2] end
  -- clamp before multiplying: past this many microseconds the bucket is full
  if elapsed >= cdiv(cap - st[1], N) then return cap, now end
  return st[1] + elapsed * N, now
end
if USED['tb'] then ALGOS['tb'] = {
  load = getnums,
  decide = function(st, now, N, W, B, cost, consume)
    local cap = B * W
    local level
    level, now = tb_level(st, now, N, cap)
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
