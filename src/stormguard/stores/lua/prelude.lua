-- stormguard: shared prelude of the rate-limit script.
-- Mirrors stormguard/algorithms/__init__.py exactly. Lua numbers are doubles, exact
-- for integers below 2^53: every intermediate value here is kept below that bound
-- (the store rejects rules that could exceed it), and every division is corrected
-- to the exact floor.

local function fdiv(a, b)  -- floor(a / b), exact for integers, b > 0
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

local function cdiv(a, b)  -- ceil(a / b)
  return -fdiv(-a, b)
end

local function fmt(x)
  return string.format('%.0f', x)
end

-- a state stored as two or three space separated integers in one string key
local function getnums(key)
  local v = redis.call('GET', key)
  if not v then
    return nil
  end
  local a, b, c = string.match(v, '^(%S+) (%S+) ?(%S*)$')
  return {tonumber(a), tonumber(b), tonumber(c)}
end

-- milliseconds until exp (microseconds), rounded up: the key lives until the state
-- it holds is indistinguishable from a fresh key, and not longer (plus the slack
-- given in ARGV[4]: 0 with server time, the tolerated clock skew with client time)
local TTL_SLACK_MS = tonumber(ARGV[4])
local function ttl_ms(exp, now)
  local ms = cdiv(exp - now, 1000) + TTL_SLACK_MS
  if ms < 1 then
    ms = 1
  end
  return ms
end

local function putnums(key, t, now, exp)
  local text = fmt(t[1]) .. ' ' .. fmt(t[2])
  if t[3] then
    text = text .. ' ' .. fmt(t[3])
  end
  redis.call('SET', key, text, 'PX', ttl_ms(exp, now))
end

-- ALGOS[code]() builds the algorithm's functions (on demand, so a call creates only the
-- closures it uses):
-- load(key, now, N, W) -> state | nil
-- decide(state, now, N, W, B, cost, consume) -> allowed, new_state, remaining, reset, retry, expires_at
-- save(key, new_state, now, expires_at)
local ALGOS = {}
