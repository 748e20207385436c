-- Entry point of a shaper's booking (stormguard.Shaper with store=): reserve.lua's
-- reservation, plus a pause that every process sharing the shaper sees.
-- Load it after prelude.lua, the bucket algorithms and reservation.lua, in place of main.lua.
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
local judged = now
if paused > now then
  judged = paused
end
local ok, at = reserve(KEYS[1], now, judged)
if ok == nil then
  return at  -- the error reply
end
return {ok, at, now, paused}
