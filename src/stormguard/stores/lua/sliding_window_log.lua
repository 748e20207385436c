-- sliding_window_log: a list of admission times (one entry per unit of cost), oldest first.
-- Entries that can no longer count (<= now - W) are trimmed from the head as they expire.
ALGOS['swl'] = function() return {
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
    while true do
      local head = redis.call('LINDEX', key, 0)
      if not head or tonumber(head) > cut then
        break
      end
      redis.call('LPOP', key)
    end
    return {key = key, n = redis.call('LLEN', key), last = last, now = now}
  end,
  decide = function(st, now, N, W, B, cost, consume)
    local live, last = 0, 0
    if st then
      live = st.n
      last = st.last
      now = st.now
    end
    if live + cost <= N then
      local nst = st
      if consume then
        nst = {push = now, cost = cost}
        live = live + cost
        last = now
      end
      if live > 0 then
        return true, nst, N - live, last + W - now, 0, last + W
      end
      return true, nst, N, 0, 0, now
    end
    local k = live + cost - N  -- how many of the oldest live entries must expire
    local kth = tonumber(redis.call('LINDEX', st.key, k - 1))
    return false, st, N - live, last + W - now, kth + W - now, last + W
  end,
  save = function(key, st, now, exp)
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
