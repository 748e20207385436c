-- Entry point. KEYS: one key per rule (all in one slot).
-- ARGV: now_us ('' = server TIME), cost, consume ('1' or '0'), TTL slack in ms,
--       then per rule: algorithm code, N (limit), W (window us), B (capacity).
-- Several rules are all-or-nothing: every verdict is computed before anything is
-- written, and the writes happen only when every rule admits.
-- Returns {all_allowed, then per rule: allowed, remaining, reset_us, retry_us}.
local now = now_us(ARGV[1])
local cost = tonumber(ARGV[2])
local consume = ARGV[3] == '1'
local n = #KEYS
if n == 1 then  -- one rule: no bookkeeping for all-or-nothing
  local A = ALGOS[ARGV[5]]
  local N, W, B = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
  local ok, nst, rem, reset, retry, exp = A.decide(A.load(KEYS[1], now, N, W), now, N, W, B,
                                                   cost, consume)
  if ok and consume then
    A.save(KEYS[1], nst, now, exp)
  end
  local o = ok and 1 or 0
  return {o, o, rem, reset, retry}
end
local algos, params, states, verdicts = {}, {}, {}, {}
local all_ok = true
for i = 1, n do
  local j = 1 + 4 * i
  local A = ALGOS[ARGV[j]]
  local N, W, B = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
  local st = A.load(KEYS[i], now, N, W)
  local ok, nst, rem, reset, retry, exp = A.decide(st, now, N, W, B, cost, consume)
  algos[i] = A
  params[i] = {N, W, B}
  states[i] = st
  verdicts[i] = {ok, nst, rem, reset, retry, exp}
  if not ok then
    all_ok = false
  end
end
local out = {all_ok and 1 or 0}
for i = 1, n do
  local v = verdicts[i]
  if consume and all_ok then
    algos[i].save(KEYS[i], v[2], now, v[6])
  elseif consume and v[1] then
    -- admitted by this rule but another rule denied: report the unconsumed view
    local p = params[i]
    v = {algos[i].decide(states[i], now, p[1], p[2], p[3], cost, false)}
  end
  out[#out + 1] = (v[1] and all_ok) and 1 or 0
  out[#out + 1] = v[3]
  out[#out + 1] = v[4]
  out[#out + 1] = v[5]
end
return out
