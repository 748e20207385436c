-- Entry point of a shaper's booking (stormguard.Shaper with store=): reserve.lua's
-- reservation, plus a pause that every process sharing the shaper sees.
-- Load it after prelude.lua and the bucket algorithms, in place of main.lua.
-- KEYS[1]: the bucket key (the same state as reserve.lua's); KEYS[2]: the pause key (same
-- hash tag), holding the time before which nobody departs, in microseconds.
-- ARGV: as reserve.lua (now_us or '', cost, book, TTL slack ms, code, N, W, B, max_wait_us),
--       then ARGV[10]: '' to book, or a pause length in microseconds.
-- Returns {ok, at_us, now_us, paused_until_us}. A booking is judged at
-- max(now, paused_until): no slot is ever given before the pause ends. A pause keeps the
-- later of the stored and the asked end and answers {0, paused_until, now, paused_until}.
local now = now_us(ARGV[1])
local paused = tonumber(redis.call('GET', KEYS[2]) or '0')
if ARGV[10] ~= '' then
  local u = now + tonumber(ARGV[10])
  if u > paused then
    paused = u
    redis.call('SET', KEYS[2], fmt(u), 'PX', ttl_ms(u, now))
  end
  return {0, paused, now, paused}
end
local cost = tonumber(ARGV[2])
local book = ARGV[3] == '1'
local code = ARGV[5]
local A = ALGOS[code]
if A == nil or (code ~= 'tb' and code ~= 'gcra' and code ~= 'lb') then
  return redis.error_reply('stormguard: no reservation for algorithm ' .. tostring(code))
end
local N, W, B = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local max_wait = tonumber(ARGV[9])
local judged = now
if paused > now then
  judged = paused
end
local st = A.load(KEYS[1], judged, N, W)
local ok, _, _, reset, retry, exp = A.decide(st, judged, N, W, B, cost, false)
local at = judged
if not ok then
  at = exp - reset + retry
end
if at - now > max_wait then
  return {0, at, now, paused}
end
if book then
  local admitted, nst, _, _, _, nexp = A.decide(st, at, N, W, B, cost, true)
  if not admitted then  -- cannot happen: the slot is exact
    return redis.error_reply('stormguard: shaper slot not admitted')
  end
  A.save(KEYS[1], nst, now, nexp)  -- the TTL counts from now
end
return {1, at, now, paused}
