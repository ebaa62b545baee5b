-- Release reservations whose expiry has passed (their request vanished: gateway crash).
-- KEYS: expiry zset. ARGV: max count, reservation key prefix (".../res:"), settled_ttl.
-- Expiries are on Redis's clock (reserve.lua), so "now" is Redis's TIME too: replicas whose
-- clocks disagree still agree on what has expired. Returns the released request ids.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for _, rid in ipairs(ids) do
  local r = close_reservation(ARGV[2] .. rid, KEYS[1], rid, 'released', 0, 0, now, tonumber(ARGV[3]))
  redis.call('ZREM', KEYS[1], rid)
  if r[1] == 'ok' then out[#out + 1] = rid end
end
return out
