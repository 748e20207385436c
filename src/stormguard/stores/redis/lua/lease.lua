-- Entry point of the hybrid store's leases. KEYS: one key per lease (any slots on one
-- server; one slot per call on a cluster), then, when ARGV[3] is not '', the board's two
-- keys (its list, its sequence number). ARGV: now_us ('' = server TIME), the number of
-- leases, the board ('' = none, else "<last sequence seen> <capacity>"), TTL slack in ms,
-- then per lease 8 values: algorithm code, N, W, B, want, min, and two unused ones (the
-- prelude reads every 4th ARGV from the 5th as an algorithm code; `want` lands there and
-- is ignored).
-- A lease takes `want` units of cost from the counter, or, when fewer are free, as many
-- as are free if that is at least `min` (min 0: whatever is free, possibly nothing; the
-- hybrid store's way to charge admissions made while the backend was unreachable).
-- Nothing is taken when fewer than `min` are free; the reply then carries the wait for
-- `min` units. min -1 (and -2, -4: the hybrid store's other kinds) is a forced add:
-- `want` units admitted already (the cold allowance) are added to the counter whatever
-- it holds, past the limit if need be.
-- min -3 is a post: the key onto the board until `want` (µs), nothing leased (a key a
-- native forced add, APPEND outside the script, exhausted).
-- The same counters, in the same format, as the rate-limit script: direct checks and
-- leases on one key see each other.
-- The board: a key whose counter a lease or a forced add exhausts (a check of cost 1 would
-- be denied after it, and was admitted before) is appended as "<until_us> <key>\255"
-- (until: when a check of cost 1 would pass again; byte 255 ends an entry: it is never
-- part of UTF-8 text) to one string, its sequence number the bytes ever appended (a
-- byte offset). The reply carries the bytes appended since the caller's last sequence
-- number as one string (at most about the capacity's entries, whole entries only): one
-- bulk reply, not a Lua string per entry from a list, which cost twice the Redis time
-- per entry read. The string keeps the last BOARD_KEEP bytes once it outgrows BOARD_MAX.
-- Returns {now_us, then per lease: granted, remaining after, reset_us, retry_us, then,
-- with a board: its sequence number and the entries' string}.
local now = now_us(ARGV[1])
local n = tonumber(ARGV[2])
local out = {now}
local posts = {}
local POST = -3  -- the `min` of a post: no lease, the key onto the board
local FW = {}  -- per window length W: {window, "window ", its end, TTL ms}
-- the board: bytes read per entry of the capacity; the string's most and what it keeps
local BOARD_ENTRY, BOARD_MAX, BOARD_KEEP = 128, 1048576, 524288

-- a forced add: the state after `add` more units, whatever the limit (the formulas of
-- the algorithms' decide, without the check); fixed_window, the common case, inline below
local FORCE = {
  swc = function(st, now, N, W, B, add)
    local w = fdiv(now, W)
    local cur, prev = 0, 0
    if st then
      if st[1] >= w then
        w = st[1]
        cur, prev = st[2], st[3]
      elseif st[1] == w - 1 then
        prev = st[2]
      end
    end
    return {w, cur + add, prev}, w * W + 2 * W
  end,
  tb = function(st, now, N, W, B, add)
    local cap = B * W
    local level, t = tb_level(st, now, N, cap)
    level = level - add * W
    return {level, t}, t + cdiv(cap - level, N)
  end,
  gcra = function(st, now, N, W, B, add)
    local debt = 0
    if st and st[1] >= now then
      debt = (st[1] - now) * N + st[2]
    end
    debt = debt + add * W
    local q = fdiv(debt, N)
    return {now + q, debt - q * N}, now + cdiv(debt, N)
  end,
  lb = function(st, now, N, W, B, add)
    local level, t = lb_level(st, now, N)
    level = level + add * W
    return {level, t}, t + cdiv(level, N)
  end,
}

for i = 1, n do
  local j = 5 + 8 * (i - 1)
  local code = ARGV[j]
  local N, W, B = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
  local want, min = tonumber(ARGV[j + 4]), tonumber(ARGV[j + 5])
  local key = KEYS[i]
  local granted, rem, reset, retry = 0, 0, 0, 0
  if min == POST then
    -- a key a native forced add exhausted (the hybrid store saw it in the add's reply,
    -- one round ago): onto the board, unless it frees already; `want` is when it frees
    if want > now then
      posts[#posts + 1] = fmt(want) .. ' ' .. key .. '\255'
    end
  elseif min < 0 and code == 'fw' then
    -- forced add on a fixed window: one SET when the key is new (the common case of a
    -- cold key: SET NX GET creates it, or answers what it holds), a second one otherwise;
    -- the window, its end and the TTL computed once per window length in the call
    local fw = FW[W]
    if not fw then
      local w = fdiv(now, W)
      local e = (w + 1) * W
      fw = {w, fmt(w) .. ' ', e, ttl_ms(e, now)}
      FW[W] = fw
    end
    local w, t, e = fw[1], now, fw[3]
    local used = 0
    local v = redis.call('SET', key, fw[2] .. ARGV[j + 4], 'NX', 'GET', 'PX', fw[4])
    if v then
      local st = fwstate(v) or {w, 0}
      local a, b = st[1], st[2]
      if a >= w then
        if a > w then
          w = a
          t = w * W
          e = (w + 1) * W
        end
        used = b
      end
      redis.call('SET', key, fmt(w) .. ' ' .. fmt(used + want), 'PX', ttl_ms(e, t))
    end
    local was = N - used
    used = used + want
    granted = want
    rem = N - used
    reset = e - t
    if rem < 1 then
      retry = e - t
      if was >= 1 then
        posts[#posts + 1] = fmt(now + retry) .. ' ' .. key .. '\255'
      end
    end
  elseif min < 0 then
    local A = ALGOS[code]
    local st = A.load(key, now, N, W)
    local ok0 = A.decide(st, now, N, W, B, 1, false)
    local nst, exp = FORCE[code](st, now, N, W, B, want)
    A.save(key, nst, now, exp)
    local ok, _st
    ok, _st, rem, reset, retry = A.decide(nst, now, N, W, B, 1, false)
    granted = want
    if ok then
      retry = 0
    elseif ok0 then
      posts[#posts + 1] = fmt(now + retry) .. ' ' .. key .. '\255'
    end
  else
    local A = ALGOS[code]
    local ok, nst, exp
    ok, nst, rem, reset, retry, exp = A.decide(A.load(key, now, N, W), now, N, W, B, want,
                                               true)
    if ok then
      granted = want
      A.save(key, nst, now, exp)
    else
      local g = rem
      if g > want then
        g = want
      end
      if g > 0 and g >= min then
        ok, nst, rem, reset, retry, exp = A.decide(A.load(key, now, N, W), now, N, W, B, g,
                                                   true)
        if ok then
          granted = g
          A.save(key, nst, now, exp)
        end
      end
      if granted == 0 and min > 0 then
        ok, nst, rem, reset, retry, exp = A.decide(A.load(key, now, N, W), now, N, W, B,
                                                   min, false)
      end
    end
    if granted > 0 then
      retry = 0
      if rem < 1 then  -- this lease took the last unit: on the board
        local ok1, _, _, _, r1 = A.decide(A.load(key, now, N, W), now, N, W, B, 1, false)
        if not ok1 then
          posts[#posts + 1] = fmt(now + r1) .. ' ' .. key .. '\255'
        end
      end
    end
  end
  if rem < 0 then
    rem = 0
  end
  out[#out + 1] = granted
  out[#out + 1] = rem
  out[#out + 1] = reset
  out[#out + 1] = retry
end

if ARGV[3] ~= '' then
  local since, cap = string.match(ARGV[3], '^(%S+) (%S+)$')
  since, cap = tonumber(since), tonumber(cap)
  local bkey, skey = KEYS[n + 1], KEYS[n + 2]
  local seq = tonumber(redis.call('GET', skey) or '0')
  local size
  if #posts > 0 then
    local text = table.concat(posts)
    size = redis.call('APPEND', bkey, text)
    seq = redis.call('INCRBY', skey, #text)
    if size > BOARD_MAX then  -- keep the last BOARD_KEEP bytes, from an entry's start
      local tail = redis.call('GETRANGE', bkey, size - BOARD_KEEP, -1)
      local cut = string.find(tail, '\255', 1, true) or #tail
      tail = string.sub(tail, cut + 1)
      redis.call('SET', bkey, tail)
      size = #tail
    end
    redis.call('PEXPIRE', bkey, 600000)
    redis.call('PEXPIRE', skey, 600000)
  end
  out[#out + 1] = seq
  if cap > 0 and since ~= seq then
    size = size or redis.call('STRLEN', bkey)
    local base = seq - size  -- the sequence number of the string's first byte
    local from = since
    if since < base or since > seq then  -- a first sync, a reader left behind, a lost board
      from = base
    end
    local most = seq - cap * BOARD_ENTRY
    local whole = true
    if from < most then
      from = most
      whole = false
    end
    if from < seq then
      local text = redis.call('GETRANGE', bkey, from - base, -1)
      if not whole then  -- cut inside an entry: from the next one on
        local cut = string.find(text, '\255', 1, true) or #text
        text = string.sub(text, cut + 1)
      end
      out[#out + 1] = text
    end
  end
end
return out
