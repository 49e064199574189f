-- Exact take: decide one request of an exact user against the key's pool,
-- on Redis server time. records.lua, prepended, describes the hash and its
-- helpers.
--
-- KEYS[1]  lease hash (see records.lua)
-- ARGV[1]  instance id (non-empty)
-- ARGV[2]  rate, the limit's global rate in tokens per second (>= 0)
-- ARGV[3]  burst, the limit's global burst in tokens (>= 0)
-- ARGV[4]  n, the instance count N-hat, the largest seen lately (>= 1)
-- ARGV[5]  ttl_us, how long this instance's exact record lives, us (>= 1)
-- ARGV[6]  tokens to take (>= 0)
-- ARGV[7]  give, tokens this instance hands the pool from its local bucket
--          when it joins, that is when it has no exact record yet (>= 0)
-- ARGV[8]  exact_bursts ("0"/"1"): no instance runs a default share
--          unasked, so unrecorded instances are counted at 0, and a pool
--          that does not exist is full
--
-- The pool is what no lease and no default share holds: the exact users
-- gave it their default shares, and it takes up what the leases leave.
--   pool_rate  = rate - what the other instances' leases may be running
--                - unrecorded * rate/n (0 with exact_bursts), at least 0;
--                while Redis lost leases ("lost"), at most rate/n for
--                each exact user, what they gave;
--   pool_burst = burst * pool_rate / rate, less what the unrecorded hold
--                of the burst's remainder: the default bursts are
--                floor(burst/n), plus one token for the instances whose
--                rank is below burst mod n, and Redis does not know the
--                ranks, so the unrecorded are counted as if they held as
--                many of those tokens as they can, min(unrecorded,
--                burst mod n), above unrecorded * burst/n.
-- It refills at pool_rate up to pool_burst. A missing pool starts empty,
-- or full with exact_bursts; give is added, up to pool_burst, on the take
-- that creates the caller's record.
--
-- Returns {allowed ("0"/"1"), tokens left, retry_after_us, pool_rate,
-- pool_burst}, all strings because Redis truncates Lua numbers to
-- integers. retry_after_us is "-1" when the tokens can never be there at
-- the current pool_rate and pool_burst.
--
-- Invariant: as in lease.lua. The caller gives up its lease (it stopped
-- running it before asking) and is counted as an exact user, at rate/n;
-- the pool's rate is what the leases and the unrecorded leave, which every
-- lease grant keeps at least rate/n per exact user.

local key = KEYS[1]
local inst = ARGV[1]
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local take = tonumber(ARGV[6])
local give = tonumber(ARGV[7])
local exact_bursts = ARGV[8] == '1'
local valid = inst ~= nil and inst ~= '' and rate and burst and n and ttl
  and take and give and (ARGV[8] == '0' or ARGV[8] == '1')
  and not (rate < 0 or burst < 0 or n < 1 or ttl < 1 or take < 0 or give < 0)
if not valid then
  return redis.error_reply('ERR hybridlimit: invalid exact arguments')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local self, self_x = 'i:' .. inst, 'x:' .. inst
local share = rate / n

local h = read_hash(redis.call('HGETALL', key), inst, now)
-- The caller's record lives at least until now + ttl, and, if it drops a
-- lease that counted it below its default share, until the others' leases
-- granted meanwhile have ended: a release of the record then lets it run
-- its default share at once (see lease.lua).
local expiry = math.max(now + ttl, h.own_x or 0)
if h.own ~= nil then
  h.dead[#h.dead + 1] = self
  if holds(h.own, now) < share then expiry = math.max(expiry, h.leases_end) end
end
hdel(key, h.dead)

-- pool_size is the pool's rate and burst, worked out as a fraction of the
-- limit's, so that a pool of whole shares has a whole burst exactly.
local function pool_size()
  if not (rate > 0) then return 0, 0 end
  local unrecorded = 0
  if not exact_bursts then
    unrecorded = math.max(0, math.floor(n) - 1 - h.recorded)
  end
  local frac = (n - unrecorded) / n - h.others / rate
  if h.lost ~= nil then frac = math.min(frac, (h.exact + 1) / n) end
  frac = math.max(0, math.min(1, frac))
  -- The remainder tokens the unrecorded may hold beyond burst/n each
  -- (0 when n divides burst).
  local whole = math.floor(n)
  local rem = burst % whole
  local extra = math.min(unrecorded, rem) - unrecorded * rem / whole
  return rate * frac, math.max(0, burst * frac - extra)
end

-- pool_tokens is what the pool holds at now, refilled at pool_rate since
-- it was last taken from, capped at pool_burst.
local function pool_tokens(pool_rate, pool_burst)
  local tokens, last
  if h.pool ~= nil then
    local a, b = string.match(h.pool, '^(%S+) (%S+)$')
    tokens, last = tonumber(a), tonumber(b)
  end
  if tokens == nil or last == nil then
    tokens, last = 0, now
    if exact_bursts then tokens = pool_burst end
  end
  -- The server clock may step back after a failover; never refill negatively.
  tokens = tokens + math.max(0, now - last) * pool_rate / 1000000
  if h.own_x == nil then tokens = tokens + give end
  return math.max(0, math.min(tokens, pool_burst))
end

local pool_rate, pool_burst = pool_size()
local tokens = pool_tokens(pool_rate, pool_burst)

-- Fractions of a share leave rounding errors: forgive them.
local eps = 1e-9
local allowed, retry = '0', 0
if take <= tokens + eps then
  allowed = '1'
  tokens = math.max(0, tokens - take)
elseif take > pool_burst + eps or not (pool_rate > 0) then
  retry = -1
else
  retry = math.ceil((take - tokens) * 1000000 / pool_rate)
end

redis.call('HSET', key, self_x, string.format('%d', expiry),
  'p', string.format('%.17g %d', tokens, now))
-- The hash lives as long as its latest record, and until the pool would be
-- full again: a missing pool is treated as full (exact bursts) or as the
-- joiner's own tokens.
local last = math.max(h.last, expiry)
if pool_rate > 0 then
  last = math.max(last, now + math.ceil((pool_burst - tokens) * 1000000 / pool_rate))
end
expire_at(key, last, now)

return {
  allowed,
  string.format('%.17g', tokens),
  string.format('%d', retry),
  string.format('%.17g', pool_rate),
  string.format('%.17g', pool_burst),
}
