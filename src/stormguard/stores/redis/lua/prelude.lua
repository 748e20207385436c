-- stormguard: shared prelude of the rate-limit script.
-- Mirrors stormguard/ratelimit/algorithms/__init__.py exactly. Lua numbers are doubles, exact
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

local function fmt(x)  -- an integral double as digits ('%d' is exact below 2^53 on 64 bits)
  return string.format('%d', x)
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

-- a fixed window's state: "window used", then any number of ";window units" appended
-- natively by the hybrid store's forced adds (APPEND, no script): the newest window and
-- the units counted in it (older windows' units are void)
local function fwstate(v)
  if not string.find(v, ';', 1, true) then
    local a, b = string.match(v, '^(%S+) (%S+)')
    return {tonumber(a), tonumber(b)}
  end
  local w, used = nil, 0
  for a, b in string.gmatch(v, '(%d+) (%d+)') do
    a = tonumber(a)
    if not w or a > w then
      w, used = a, tonumber(b)
    elseif a == w then
      used = used + tonumber(b)
    end
  end
  if not w then
    return nil
  end
  return {w, used}
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
  local text
  if t[3] then
    text = string.format('%d %d %d', t[1], t[2], t[3])
  else
    text = string.format('%d %d', t[1], t[2])
  end
  redis.call('SET', key, text, 'PX', ttl_ms(exp, now))
end

-- ALGOS[code] holds the algorithm's functions, defined only for the algorithms this call
-- uses (USED, from ARGV: creating the closures of all six would cost every call ~0.7 us):
-- load(key, now, N, W) -> state | nil
-- decide(state, now, N, W, B, cost, consume) -> allowed, new_state, remaining, reset, retry, expires_at
-- save(key, new_state, now, expires_at)
local ALGOS = {}
local USED = {}
for j = 5, #ARGV, 4 do
  USED[ARGV[j]] = true
end

-- The time a call judges at, in integer microseconds: the client's (ARGV[1]) or, when it
-- sent '' (time_source="server"), the server's TIME.
local function now_us(arg)
  if arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return tonumber(arg)
end
