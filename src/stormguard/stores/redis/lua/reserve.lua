-- Entry point of a reservation (mirrors Algorithm.reserve in
-- stormguard/ratelimit/algorithms/buckets.py): the earliest time at >= now at which `cost`
-- is admitted on one key, and with `book` the state after that hit *at* `at`.
-- Load it after prelude.lua, the algorithm files of the bucket family and reservation.lua,
-- in place of main.lua: prelude.lua, token_bucket.lua, gcra.lua, leaky_bucket.lua,
-- reservation.lua, reserve.lua.
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
local ok, at = reserve(KEYS[1], now, now)
if ok == nil then
  return at  -- the error reply
end
return {ok, at, now}
