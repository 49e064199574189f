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
--          that does not exist is full. Every take records the caller's
--          demand in its exact record (the tokens asked for, admitted or
--          not), which lease.lua counts it at with exact bursts
-- ARGV[9]  keep_lease ("0"/"1", absent = "0"): the instance may hold a
--          lease of the key that it does not run (yet): it is on its way
--          from exact decisions to a lease, or this take was sent before
--          its lease request and lands after it. A live lease record of
--          the instance is then kept and counted like the others' (the
--          pool is what it leaves), and no exact record is written while
--          it lives. "0": the instance stopped running its lease before
--          asking, and the take drops the lease record.
-- ARGV[10] credit, at most this many tokens to hand the instance beyond
--          take, as credit it may admit locally for credit_ttl_us (>= 0,
--          absent = 0); handed only from a pool at least half full after
--          them, so that the pool keeps at least half its burst for others
-- ARGV[11] returned, tokens of its credit the instance gives back: it
--          stopped admitting them before asking (>= 0, absent = 0)
-- ARGV[12] credit_ttl_us, how long a credit handed now lasts, us (>= 1
--          when credit > 0; absent = 0)
-- ARGV[13] held, the demand of the requests the instance denied in
--          process since its last take, while its deny cache held the
--          key (the tokens they asked for, each decayed over demand_tau
--          from when it was asked to when this take was sent): added to
--          the demand this take records, as if each had been a take
--          (0 to 1e12, absent = 0)
--
-- The pool is what no lease and no default share holds: the exact users
-- gave it their default shares, and it takes up what the leases leave.
--   pool_rate  = rate - what the other instances' leases (and a lease of
--                the caller's that keep_lease keeps) may be running
--                - unrecorded * rate/n (0 with exact_bursts), at least 0;
--                while Redis lost leases ("lost"), at most rate/n for
--                each exact user, what they gave;
--   pool_burst = burst less the parts of it the leases hold (their rates'
--                parts, or the parts lease.lua granted them apart, see
--                holds_burst) and unrecorded * burst/n (capped as
--                pool_rate is while lost), less what the unrecorded hold
--                of the burst's remainder: the default bursts are
--                floor(burst/n), plus one token for the instances whose
--                rank is below burst mod n, and Redis does not know the
--                ranks, so the unrecorded are counted as if they held as
--                many of those tokens as they can, min(unrecorded,
--                burst mod n), above unrecorded * burst/n.
-- It refills at pool_rate up to pool_burst less the live credits of all
-- instances ("c:" records): what the pool and the credits hold together is
-- at most pool_burst, so credit admits no burst beyond the pool's. A
-- missing pool starts empty, or full with exact_bursts; give is added, up
-- to pool_burst, on the take that creates the caller's record.
--
-- Returns {allowed ("0"/"1"), tokens left, retry_after_us, pool_rate,
-- pool_burst, credit handed, turn_us}, all strings because Redis truncates
-- Lua numbers to integers. retry_after_us is "-1" when the tokens can never
-- be there at the current pool_rate and pool_burst. A denial's retry_after_us, and an
-- admission's turn_us when it left the pool less than one token, is the
-- caller's turn (see turn below); turn_us is "0" otherwise.
--
-- Invariant: as in lease.lua. Without keep_lease the caller gives up its
-- lease (it stopped running it before asking) and is counted as an exact
-- user, at rate/n (with exact bursts, at its demand: exact_counted); the
-- pool's rate is what the leases and the unrecorded leave, which every
-- lease grant keeps at least what the exact users are counted at.
-- With keep_lease and a live lease of its own, the caller is counted at
-- that lease and the pool is what all the leases leave: what it takes
-- from the pool and what it runs of its lease once the grant is in force
-- are both counted.

local key = KEYS[1]
local inst = ARGV[1]
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local take = tonumber(ARGV[6])
local give = tonumber(ARGV[7])
local exact_bursts = ARGV[8] == '1'
local keep_lease = ARGV[9] == '1'
local credit = tonumber(ARGV[10] or '0')
local returned = tonumber(ARGV[11] or '0')
local credit_ttl = tonumber(ARGV[12] or '0')
local held = tonumber(ARGV[13] or '0')
local valid = inst ~= nil and inst ~= '' and rate and burst and n and ttl
  and take and give and credit and returned and credit_ttl and held
  and (ARGV[8] == '0' or ARGV[8] == '1')
  and (ARGV[9] == nil or ARGV[9] == '0' or ARGV[9] == '1')
  and not (rate < 0 or burst < 0 or n < 1 or ttl < 1 or take < 0 or give < 0
  or credit < 0 or returned < 0 or credit_ttl < 0 or (credit > 0 and credit_ttl < 1)
  or not (held >= 0 and held <= 1e12))
if not valid then
  return redis.error_reply('ERR hybridlimit: invalid exact arguments')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local self, self_x, self_c = 'i:' .. inst, 'x:' .. inst, 'c:' .. inst
local share = rate / n

local h = read_hash(redis.call('HGETALL', key), inst, now, burst, rate, n)
-- kept is the caller's live lease when keep_lease keeps it: Redis counts
-- the caller at that lease, as it counts the others', and the caller takes
-- from the pool without an exact record. lease.lua turns an exact record
-- into a lease record in one step, so a take that lands after a lease
-- request can never count the caller at its default share while it runs a
-- larger grant.
local kept = nil
if keep_lease and h.own ~= nil then
  kept = h.own
  h.others = h.others + holds(kept, now)
  h.others_b = h.others_b + holds_burst(kept, now, burst, rate)
  h.last = math.max(h.last, lease_end(kept))
end
-- The caller's record lives until now + ttl at least. clean is until when
-- leases granted while the caller was counted below its default share may
-- run: a release of its exact record lets it run that share only then
-- (lease.lua). Kept from its record, from a release it is still waiting
-- out ("w:"), and from a lower lease dropped here: until the others'
-- leases stop holding more than their own default shares (above_end).
local expiry = math.max(now + ttl, h.own_x or 0)
local clean = math.max(h.own_x_clean or 0, h.own_w or 0)
if h.own ~= nil and kept == nil then
  h.dead[#h.dead + 1] = self
  if holds(h.own, now) < share or holds_burst(h.own, now, burst, rate) < burst / n - 1e-9 then
    clean = math.max(clean, h.above_end)
  end
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
  -- The burst, as the leases hold it: in proportion to their rates, or
  -- their own parts of it (see holds_burst).
  local frac_b = (n - unrecorded) / n - h.others_b / math.max(burst, 1e-300)
  if h.lost ~= nil then
    -- What the exact users gave: the caller too, unless its lease counts it.
    local users = h.exact
    if kept == nil then users = users + 1 end
    frac = math.min(frac, users / n)
    frac_b = math.min(frac_b, users / n)
  end
  frac = math.max(0, math.min(1, frac))
  frac_b = math.max(0, math.min(1, frac_b))
  -- The remainder tokens the unrecorded may hold beyond burst/n each
  -- (0 when n divides burst).
  local whole = math.floor(n)
  local rem = burst % whole
  local extra = math.min(unrecorded, rem) - unrecorded * rem / whole
  return rate * frac, math.max(0, burst * frac_b - extra)
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
  if h.own_x == nil and kept == nil then tokens = tokens + give end
  return math.max(0, math.min(tokens, pool_burst))
end

local pool_rate, pool_burst = pool_size()
-- The caller's credit, less what it gives back; the pool holds at most
-- what the credits of all instances leave of its burst.
local own_c, own_ends = 0, 0
if h.own_c ~= nil then own_c, own_ends = h.own_c.tokens, h.own_c.ends end
local back = math.min(returned, own_c)
own_c = own_c - back
local cap = math.max(0, pool_burst - (h.credits - back))
local tokens = math.min(pool_tokens(pool_rate, pool_burst) + back, cap)

-- Fractions of a share leave rounding errors: forgive them.
local eps = 1e-9

-- demand is the caller's demand with this take: what its takes asked for,
-- admitted or not, and what its deny cache held, so that a caller the pool
-- turns away shows what it wants (recorded below).
local demand = (h.own_x_d or 0) + (take + held) * 1000000 / demand_tau

-- refill is the rate the turns below are worked out at: the pool's. With
-- exact bursts, at least what the caller is counted at with this take
-- (exact_counted): the leases leave the pool that much from their next
-- renewals. A caller counted low (it was idle, its demand decayed), whose
-- pool the leases had taken down to a twentieth of a share, was told to
-- wait for that trickle, seconds on a slow key, while the leases would
-- make room for it within a renewal. Turns are hints only: a caller that
-- comes back early is denied again, and its demand grows.
local refill = pool_rate
if exact_bursts and kept == nil then refill = math.max(pool_rate, exact_counted(demand, share)) end

-- turn returns how long until the caller's turn to ask again, wait being
-- how long until the pool holds its tokens. Callers that the pool cannot
-- serve now are told to come back one after another, one take's refill
-- apart, rather than all when the next tokens are there: each caches that
-- until its turn, so that a key sprayed over the instances costs about
-- one script per admission, not one per instance. Only the hint moves: the
-- tokens go to whoever asks first. Turns reach at most n - 1 refills past
-- wait (one per instance), and fewer than the pool's burst holds, so that
-- the pool cannot fill up and lose tokens while every caller waits.
-- Only the latest turn is kept (the "q" field): the caller that holds it
-- keeps it if it asks again before it; any other caller is queued after it.
local function turn(wait, size)
  local step = math.ceil(size * 1000000 / refill)
  local ahead = math.max(0, math.min(n - 1, math.floor(pool_burst / size + eps) - 1))
  local at = now + wait
  if h.queue ~= nil and h.queue_by == inst then
    at = math.max(at, h.queue)
  elseif h.queue ~= nil then
    at = math.min(math.max(at, h.queue + step), at + ahead * step)
  end
  h.queue = at
  redis.call('HSET', key, 'q', string.format('%d %s', at, inst))
  return at - now
end

local allowed, retry, next_turn = '0', 0, 0
local extra = 0
if take <= tokens + eps then
  allowed = '1'
  tokens = math.max(0, tokens - take)
  if take > 0 and tokens + eps < 1 and pool_rate > 0 then
    -- The caller emptied the pool: its next take, of one token as most
    -- are, waits for its turn too.
    next_turn = turn(math.ceil((1 - tokens) * 1000000 / refill), 1)
  end
  if credit > 0 then
    -- Ahead of the caller's requests, from a pool that stays at least
    -- half full: a key near its limit gets none.
    extra = math.max(0, math.min(credit, math.floor(tokens - pool_burst / 2 + eps)))
    tokens = math.max(0, tokens - extra)
    own_c = own_c + extra
  end
elseif take > pool_burst + eps or not (pool_rate > 0) then
  retry = -1
else
  retry = turn(math.ceil((take - tokens) * 1000000 / refill), take)
end

local last = h.last
if kept == nil then
  if not (clean > now) then clean = 0 end
  redis.call('HSET', key, self_x, encode_exact(expiry, clean, demand, now))
  last = math.max(last, expiry)
end
redis.call('HSET', key, 'p', string.format('%.17g %d', tokens, now))
if extra > 0 then own_ends = math.max(own_ends, now + credit_ttl) end
if own_c > 0 then
  redis.call('HSET', key, self_c, string.format('%.17g %d', own_c, own_ends))
  last = math.max(last, own_ends)
elseif h.own_c ~= nil then
  redis.call('HDEL', key, self_c)
end
-- The hash lives as long as its latest record, and until the pool would be
-- full again: a missing pool is treated as full (exact bursts) or as the
-- joiner's own tokens.
last = math.max(last, h.queue or 0)
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
  string.format('%d', extra),
  string.format('%d', next_turn),
}
