-- Release reservations whose expiry has passed (their request vanished: gateway crash).
-- KEYS: expiry zset. ARGV: now, max count, reservation key prefix (".../res:"), settled_ttl.
-- Returns the released request ids.
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, rid in ipairs(ids) do
  local r = close_reservation(ARGV[3] .. rid, KEYS[1], rid, 'released', 0, 0, ARGV[1], tonumber(ARGV[4]))
  redis.call('ZREM', KEYS[1], rid)
  if r[1] == 'ok' then out[#out + 1] = rid end
end
return out
