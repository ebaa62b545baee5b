-- KEYS: reservation, expiry zset.
-- ARGV: request_id, state ('settled'|'released'), charge_input (-1 = reserved estimate),
--       charge_output, now, settled_ttl, tombstone (1: a release of a missing reservation
--       leaves a closed record, so a late reserve takes no slot), attempt (of a settle's event)
return close_reservation(KEYS[1], KEYS[2], ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]),
  ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]))
