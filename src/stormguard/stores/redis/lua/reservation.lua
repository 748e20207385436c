-- The reservation shared by reserve.lua and shaper.lua (mirrors Algorithm.reserve in
-- stormguard/ratelimit/algorithms/buckets.py). Load it after prelude.lua and the algorithm
-- files of the bucket family, before the entry point that calls it.
-- ARGV: now_us ('' = server TIME), cost, book ('1' or '0'), TTL slack in ms, algorithm
-- code (tb, gcra or lb), N (limit), W (window us), B (capacity), max_wait_us.
-- reserve(key, now, judged): the earliest time at >= judged at which `cost` is admitted on
-- `key` (judged is now, or later when nobody may depart before it: a shaper's pause); with
-- `book`, and at - now <= max_wait_us, the state after that hit *at* `at` is saved (its
-- TTL counting from now). Returns ok (1 or 0), at; or nil and an error reply.
local function reserve(key, now, judged)
  local cost = tonumber(ARGV[2])
  local book = ARGV[3] == '1'
  local code = ARGV[5]
  local A = ALGOS[code]
  if A == nil or (code ~= 'tb' and code ~= 'gcra' and code ~= 'lb') then
    return nil, redis.error_reply('stormguard: no reservation for algorithm ' .. tostring(code))
  end
  local N, W, B = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
  local max_wait = tonumber(ARGV[9])
  local st = A.load(key, judged, N, W)
  -- decide judges a request at the time it answers for: `judged`, or (token and leaky
  -- bucket) the state's later timestamp after a booking or a clock that stepped back. It
  -- returns expires = judged + reset and a retry measured from `judged`: the earliest
  -- admitted time is judged + retry (and `judged` itself when admitted then).
  local ok, _, _, reset, retry, exp = A.decide(st, judged, N, W, B, cost, false)
  local at = judged
  if not ok then
    at = exp - reset + retry
  end
  if at - now > max_wait then
    return 0, at
  end
  if book then
    local admitted, nst, _, _, _, nexp = A.decide(st, at, N, W, B, cost, true)
    if not admitted then  -- cannot happen: the slot is exact
      return nil, redis.error_reply('stormguard: reservation slot not admitted')
    end
    A.save(key, nst, now, nexp)  -- the TTL counts from now
  end
  return 1, at
end
