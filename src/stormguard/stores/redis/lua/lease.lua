-- Entry point of the hybrid store's leases. KEYS: one key per lease (any slots on one
-- server; one slot per call on a cluster). ARGV: now_us ('' = server TIME), the number of
-- leases, '' (unused), TTL slack in ms, then per lease 8 values: algorithm code, N, W, B,
-- want, min, and two unused ones (the prelude reads every 4th ARGV from the 5th as an
-- algorithm code; `want` lands there and is ignored).
-- A lease takes `want` units of cost from the counter, or, when fewer are free, as many
-- as are free if that is at least `min` (min 0: whatever is free, possibly nothing; the
-- hybrid store's way to charge admissions made while the backend was unreachable).
-- Nothing is taken when fewer than `min` are free; the reply then carries the wait for
-- `min` units. The same counters, in the same format, as the rate-limit script: direct
-- checks and leases on one key see each other.
-- Returns {now_us, then per lease: granted, remaining after, reset_us, retry_us}.
local now = now_us(ARGV[1])
local out = {now}
for i = 1, #KEYS do
  local j = 5 + 8 * (i - 1)
  local A = ALGOS[ARGV[j]]
  local N, W, B = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
  local want, min = tonumber(ARGV[j + 4]), tonumber(ARGV[j + 5])
  local key = KEYS[i]
  local granted = 0
  local ok, nst, rem, reset, retry, exp = A.decide(A.load(key, now, N, W), now, N, W, B,
                                                   want, true)
  if ok then
    granted = want
    A.save(key, nst, now, exp)
  else
    local g = rem
    if g > want then
      g = want
    end
    if g > 0 and g >= min then
      ok, nst, rem, reset, retry, exp = A.decide(A.load(key, now, N, W), now, N, W, B, g, true)
      if ok then
        granted = g
        A.save(key, nst, now, exp)
      end
    end
    if granted == 0 and min > 0 then
      ok, nst, rem, reset, retry, exp = A.decide(A.load(key, now, N, W), now, N, W, B, min,
                                                 false)
    end
  end
  if granted > 0 then
    retry = 0
  end
  out[#out + 1] = granted
  out[#out + 1] = rem
  out[#out + 1] = reset
  out[#out + 1] = retry
end
return out
