-- Shared by settle.lua and reap.lua (prepended by ledger.py): close one reservation.
-- Charges `charge_in` + `charge_out` tokens (both 0 for a release) to every scope the
-- reservation holds, releases the rest, frees its concurrency slot. Idempotent: a reservation
-- already settled is left alone ('dup'), unless the charge comes from a later attempt of the
-- request (`attempt`): a request pays for its highest billing attempt, the one its client's
-- answer came from, so that attempt's charge replaces the earlier one ('resettled', the
-- difference applied); a released one still takes a settle's charge once ('late'). Returns
-- {status, charged, reserved_total}.
local function close_reservation(res, expiry, rid, state, charge_in, charge_out, now, settled_ttl, tombstone, attempt)
  attempt = attempt or 0
  local r = redis.call('HMGET', res, 'state', 'input', 'total', 'tools_exempt', 'day', 'month', 'minute', 'stems',
    'attempt', 'charged')
  if not r[1] then
    if tombstone == 1 then
      -- Released before its reserve ran (the gateway stopped waiting for the budget): a closed
      -- record, so the reserve that arrives later is a duplicate and takes no slot.
      redis.call('HSET', res, 'state', 'released', 'output', 0, 'total', 0, 'closed_at', now)
      redis.call('EXPIRE', res, settled_ttl)
    end
    return {'missing', 0, 0}
  end
  local cin, cout = 0, 0
  if state == 'settled' then
    cin = charge_in
    if cin < 0 then cin = tonumber(r[2] or 0) end -- input unknown (cancelled): the reserved estimate
    cin = math.max(0, cin - tonumber(r[4] or 0))  -- tool tokens the plan does not count
    cout = math.max(0, charge_out)
  end
  local charged = cin + cout
  if r[1] ~= 'reserved' then
    if state == 'settled' and r[1] == 'settled' and r[8] and attempt > tonumber(r[9] or 0) then
      -- A later attempt answered (the earlier one was given up while its worker still finished
      -- it, e.g. cut off by a NATS outage): its charge replaces the earlier one's.
      local delta = charged - tonumber(r[10] or 0)
      for stem in string.gmatch(r[8], '[^|]+') do
        redis.call('HINCRBY', stem .. ':d:' .. r[5], 'used', delta)
        redis.call('HINCRBY', stem .. ':m:' .. r[6], 'used', delta)
      end
      redis.call('HSET', res, 'charged', charged, 'charged_input', cin, 'charged_output', cout, 'attempt', attempt)
      return {'resettled', delta, 0}
    end
    if state == 'settled' and r[1] == 'released' and r[8] then
      -- A charge that arrives after the reservation was released (by the reaper, or by the
      -- request's failure event processed first) is still owed: charged now to the day and month
      -- it was reserved in. The reservation and its slot were freed by the release.
      for stem in string.gmatch(r[8], '[^|]+') do
        redis.call('HINCRBY', stem .. ':d:' .. r[5], 'used', charged)
        redis.call('HINCRBY', stem .. ':m:' .. r[6], 'used', charged)
      end
      redis.call('HSET', res, 'state', 'settled', 'charged', charged, 'charged_input', cin, 'charged_output', cout,
        'closed_at', now, 'late', 1, 'attempt', attempt)
      redis.call('EXPIRE', res, settled_ttl)
      return {'late', charged, 0}
    end
    return {'dup', 0, 0, r[1]}
  end
  local total = tonumber(r[3])
  for stem in string.gmatch(r[8], '[^|]+') do
    local d = stem .. ':d:' .. r[5]
    local m = stem .. ':m:' .. r[6]
    local mi = stem .. ':min:' .. r[7]
    redis.call('HINCRBY', d, 'reserved', -total)
    redis.call('HINCRBY', d, 'used', charged)
    redis.call('HINCRBY', m, 'reserved', -total)
    redis.call('HINCRBY', m, 'used', charged)
    -- TPM counts what was used: give back the unused part of the reservation in its minute.
    if redis.call('EXISTS', mi) == 1 then redis.call('HINCRBY', mi, 'tok', charged - total) end
    local c = redis.call('DECR', stem .. ':conc')
    if c < 0 then redis.call('SET', stem .. ':conc', 0) end
  end
  redis.call('HSET', res, 'state', state, 'charged', charged, 'charged_input', cin, 'charged_output', cout,
    'closed_at', now, 'attempt', attempt)
  redis.call('EXPIRE', res, settled_ttl)
  redis.call('ZREM', expiry, rid)
  return {'ok', charged, total}
end
