-- sliding_window_log: a list of admission times (one entry per unit of cost), oldest first.
-- Entries that can no longer count (<= now - W) are a prefix of the list. load only
-- measures that prefix; an admission cuts it off before appending. A peek or a denied
-- request writes nothing: after a clock stepped back, entries that a later time had
-- expired count again, exactly as in stormguard.algorithms.SlidingWindowLog.
if USED['swl'] then ALGOS['swl'] = {
  load = function(key, now, N, W)
    local last = redis.call('LINDEX', key, -1)
    if not last then
      return nil
    end
    last = tonumber(last)
    if now < last then
      now = last  -- a clock that stepped back: never reorder the log
    end
    local cut = now - W
    local size = redis.call('LLEN', key)
    local dead = 0  -- length of the expired prefix
    if last <= cut then
      dead = size
    elseif tonumber(redis.call('LINDEX', key, 0)) <= cut then
      -- the first entry > cut lies in [1, size - 1]: binary search, O(log size) reads
      local lo, hi = 1, size - 1
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if tonumber(redis.call('LINDEX', key, mid)) <= cut then
          lo = mid + 1
        else
          hi = mid
        end
      end
      dead = lo
    end
    return {key = key, n = size - dead, dead = dead, last = last, now = now}
  end,
  decide = function(st, now, N, W, B, cost, consume)
    local live, last, dead = 0, 0, 0
    if st then
      live = st.n
      last = st.last
      now = st.now
      dead = st.dead
    end
    if live + cost <= N then
      local nst = st
      if consume then
        nst = {push = now, cost = cost, dead = dead}
        live = live + cost
        last = now
      end
      if live > 0 then
        return true, nst, N - live, last + W - now, 0, last + W
      end
      return true, nst, N, 0, 0, now
    end
    local k = live + cost - N  -- how many of the oldest live entries must expire
    local kth = tonumber(redis.call('LINDEX', st.key, dead + k - 1))
    return false, st, N - live, last + W - now, kth + W - now, last + W
  end,
  save = function(key, st, now, exp)
    if st.dead > 0 then
      redis.call('LTRIM', key, st.dead, -1)  -- O(entries removed), each removed once
    end
    local t = fmt(st.push)
    local left = st.cost
    while left > 0 do
      local chunk = {}
      for i = 1, math.min(left, 1000) do
        chunk[i] = t
      end
      redis.call('RPUSH', key, unpack(chunk))
      left = left - #chunk
    end
    redis.call('PEXPIRE', key, ttl_ms(exp, now))
  end,
} end
