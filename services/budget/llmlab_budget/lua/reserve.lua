-- Authenticate-and-reserve for one request, atomically over every scope and window.
-- KEYS: reservation, expiry zset, the API key's record (revocation is checked here, so it
--       takes effect for the very next request).
-- ARGV: 1 request_id, 2 now, 3 hold seconds (the reservation expires that long after Redis's
--       own TIME: one clock for every replica's reaper), 4 day, 5 month, 6 minute, 7 input tokens,
--       8 requested output tokens, 9 reserve_tokens (margin), 10 min_output_tokens,
--       11 on_short ('clamp'|'refuse'), 12 tools_exempt (input tokens not charged at settle),
--       13 day ttl, 14 month ttl, 15 minute ttl, 16 reservation ttl,
--       17.. per scope 9 values: ledger stem, daily, monthly, max_input, max_output, rpm, tpm,
--       max_concurrent, scope name. A limit of -1 is unlimited.
-- Returns {'ok', output_allowance, reserved_total}, {'dup', output, total, state} for a
-- request id already reserved, or a refusal {reason, scope, limit, detail}.
local res, expiry, keyrec = KEYS[1], KEYS[2], KEYS[3]
local prev = redis.call('HMGET', res, 'state', 'output', 'total')
if prev[1] then return {'dup', tonumber(prev[2]), tonumber(prev[3]), prev[1]} end

local revoked = redis.call('HGET', keyrec, 'revoked_at')
if revoked == false then return {'unknown_key', '', 0, ''} end
if revoked ~= '' then return {'revoked', '', 0, ''} end

local rid, now = ARGV[1], ARGV[2]
local day, month, minute = ARGV[4], ARGV[5], ARGV[6]
local input, want = tonumber(ARGV[7]), tonumber(ARGV[8])
local margin, minout, onshort = tonumber(ARGV[9]), tonumber(ARGV[10]), ARGV[11]

local scopes = {}
local cap = want            -- output cap from the request and per-request limits
local avail = nil           -- output room left by the budgets (nil: unlimited)
local tight = nil           -- the refusal if the budgets are what falls short
local n = (#ARGV - 16) / 9
for i = 0, n - 1 do
  local b = 17 + i * 9
  local s = {stem = ARGV[b], daily = tonumber(ARGV[b + 1]), monthly = tonumber(ARGV[b + 2]),
    maxin = tonumber(ARGV[b + 3]), maxout = tonumber(ARGV[b + 4]), rpm = tonumber(ARGV[b + 5]),
    tpm = tonumber(ARGV[b + 6]), conc = tonumber(ARGV[b + 7]), name = ARGV[b + 8]}
  scopes[#scopes + 1] = s
  if s.maxin >= 0 and input > s.maxin then return {'input_cap', s.name, s.maxin, ''} end
  if s.maxout >= 0 and s.maxout < cap then cap = s.maxout end
  if s.conc >= 0 then
    local c = tonumber(redis.call('GET', s.stem .. ':conc') or '0')
    if c + 1 > s.conc then return {'concurrency', s.name, s.conc, ''} end
  end
  if s.rpm >= 0 or s.tpm >= 0 then
    local m = redis.call('HMGET', s.stem .. ':min:' .. minute, 'req', 'tok')
    if s.rpm >= 0 and tonumber(m[1] or '0') + 1 > s.rpm then return {'rpm', s.name, s.rpm, ''} end
    if s.tpm >= 0 then
      local a = s.tpm - tonumber(m[2] or '0') - input - margin
      if avail == nil or a < avail then avail = a; tight = {'tpm', s.name, s.tpm, ''} end
    end
  end
  for _, w in ipairs({{'daily', ':d:' .. day, s.daily}, {'monthly', ':m:' .. month, s.monthly}}) do
    if w[3] >= 0 then
      local h = redis.call('HMGET', s.stem .. w[2], 'used', 'reserved')
      local a = w[3] - tonumber(h[1] or '0') - tonumber(h[2] or '0') - input - margin
      if avail == nil or a < avail then avail = a; tight = {'quota', s.name, w[3], w[1]} end
    end
  end
end

local out = cap
if avail ~= nil and avail < cap then
  -- The budget, not the request, limits the output: refuse below the minimum (or at all when
  -- the plan says refuse rather than clamp).
  if avail < minout or onshort == 'refuse' then
    tight[4] = tight[4] .. ':' .. math.max(0, avail)
    return tight
  end
  out = avail
end

local total = input + out
local stems = {}
for _, s in ipairs(scopes) do
  local d, m, mi = s.stem .. ':d:' .. day, s.stem .. ':m:' .. month, s.stem .. ':min:' .. minute
  -- A window key gets its TTL when this reservation is all it holds (it was just created, or
  -- everything before was released): one EXPIRE per window, not one per request.
  if redis.call('HINCRBY', d, 'reserved', total) == total then redis.call('EXPIRE', d, ARGV[13]) end
  if redis.call('HINCRBY', m, 'reserved', total) == total then redis.call('EXPIRE', m, ARGV[14]) end
  if redis.call('HINCRBY', mi, 'req', 1) == 1 then redis.call('EXPIRE', mi, ARGV[15]) end
  redis.call('HINCRBY', mi, 'tok', total)
  redis.call('INCR', s.stem .. ':conc')
  stems[#stems + 1] = s.stem
end
local t = redis.call('TIME')
local exp = tonumber(t[1]) + tonumber(t[2]) / 1e6 + tonumber(ARGV[3])
redis.call('HSET', res, 'state', 'reserved', 'input', input, 'output', out, 'total', total,
  'tools_exempt', ARGV[12], 'day', day, 'month', month, 'minute', minute,
  'stems', table.concat(stems, '|'), 'created_at', now, 'expires_at', exp)
redis.call('EXPIRE', res, ARGV[16])
redis.call('ZADD', expiry, exp, rid)
return {'ok', out, total}
