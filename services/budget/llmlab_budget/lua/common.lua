-- Shared by settle.lua and reap.lua (prepended by ledger.py): close one reservation.
-- Charges `charge_in` + `charge_out` tokens (both 0 for a release) to every scope the
-- reservation holds, releases the rest, frees its concurrency slot. Idempotent: a reservation
-- that is no longer 'reserved' is left alone. Returns {status, charged, reserved_total}.
local function close_reservation(res, expiry, rid, state, charge_in, charge_out, now, settled_ttl)
  local r = redis.call('HMGET', res, 'state', 'input', 'total', 'tools_exempt', 'day', 'month', 'minute', 'stems')
  if not r[1] then return {'missing', 0, 0} end
  if r[1] ~= 'reserved' then return {'dup', 0, 0, r[1]} end
  local total = tonumber(r[3])
  local cin, cout = 0, 0
  if state == 'settled' then
    cin = charge_in
    if cin < 0 then cin = tonumber(r[2]) end -- input unknown (cancelled): the reserved estimate
    cin = math.max(0, cin - tonumber(r[4]))  -- tool tokens the plan does not count
    cout = math.max(0, charge_out)
  end
  local charged = cin + cout
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
    'closed_at', now)
  redis.call('EXPIRE', res, settled_ttl)
  redis.call('ZREM', expiry, rid)
  return {'ok', charged, total}
end
