-- Entry point of a reservation (mirrors Algorithm.reserve in
-- stormguard/ratelimit/algorithms/buckets.py): the earliest time at >= now at which `cost`
-- is admitted on one key, and with `book` the state after that hit *at* `at`.
-- Load it after prelude.lua and the algorithm files of the bucket family, in place of
-- main.lua: prelude.lua, token_bucket.lua, gcra.lua, leaky_bucket.lua, reserve.lua.
-- The state is the algorithm's own (same key, same layout as main.lua's), so hits and
-- reservations on one key see each other.
-- KEYS[1]: the key.
-- ARGV: now_us ('' = server TIME), cost, book ('1' or '0'), TTL slack in ms,
--       algorithm code (tb, gcra or lb), N (limit), W (window us), B (capacity),
--       max_wait_us (the prelude's USED loop also sees ARGV[9]: a number, never a code).
-- Returns {ok, at_us, now_us}: ok = 1 when at_us - now <= max_wait_us (then booked if
-- book); at_us is the earliest admitted time either way; now_us the time it judged at
-- (the server's TIME unless the client sent its own).
local now = now_us(ARGV[1])
local cost = tonumber(ARGV[2])
local book = ARGV[3] == '1'
local code = ARGV[5]
local A = ALGOS[code]
if A == nil or (code ~= 'tb' and code ~= 'gcra' and code ~= 'lb') then
  return redis.error_reply('stormguard: no reservation for algorithm ' .. tostring(code))
end
local N, W, B = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local max_wait = tonumber(ARGV[9])
local st = A.load(KEYS[1], now, N, W)
-- decide judges a request at the time it answers for: `now`, or (token and leaky bucket)
-- the state's later timestamp after a booking or a clock that stepped back. It returns
-- expires = judged + reset and a retry measured from `judged`: the earliest admitted
-- time is judged + retry (and `now` itself when the request is admitted now).
local ok, _, _, reset, retry, exp = A.decide(st, now, N, W, B, cost, false)
local at = now
if not ok then
  at = exp - reset + retry
end
if at - now > max_wait then
  return {0, at, now}
end
if book then
  local admitted, nst, _, _, _, nexp = A.decide(st, at, N, W, B, cost, true)
  if not admitted then  -- cannot happen: the slot is exact
    return redis.error_reply('stormguard: reservation slot not admitted')
  end
  A.save(KEYS[1], nst, now, nexp)  -- the TTL counts from now
end
return {1, at, now}
