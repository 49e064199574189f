-- Ask: grant, renew or release one instance's lease of a key, on Redis
-- server time. placement.lua, prepended, describes the hash.
--
-- KEYS[1]  the placement hash (Store.RecordKey)
-- ARGV[1]  instance id (non-empty)
-- ARGV[2]  gen (1 to 255): the placement the ask was sent in
-- ARGV[3]  want, tokens per second (>= 0)
-- ARGV[4]  rate, the limit's rate in tokens per second (> 0)
-- ARGV[5]  burst, the limit's burst in tokens (>= 1)
-- ARGV[6]  n, N-hat, the largest instance count seen lately (>= 1)
-- ARGV[7]  ttl_us, the lease lifetime in microseconds (>= 1)
-- ARGV[8]  max_ttl_us, the longest lease of any instance (>= ttl_us)
-- ARGV[9]  running, the grant the instance runs now in tokens per second
--          (>= 0): it learns of this ask's grant only when the answer
--          arrives, and perhaps never
-- ARGV[10] running_us, how much longer it runs it (>= 0)
-- ARGV[11] drain ("0"/"1"): the instance comes from the exact placement,
--          and takes the lease's part of the pool's tokens with a grant
-- ARGV[12] release ("0"/"1"): end the instance's record
-- ARGV[13] young_us (>= 0): the other instances' records younger than
--          this (born_us) do not count in the fair shares: their demand
--          may end before a cut of this grant for them would land
-- ARGV[14] recorded ("0"/"1"): the instance holds a live record of the
--          key that its last answered ask left: finding none, Redis lost
--          it, as when it says it runs a grant (running > 0)
--
-- Returns {granted, fair, demand, contended, in_us, lost, drained, stale}
-- as strings, because Redis truncates Lua numbers to integers: the grant
-- (tokens/s, until in_us from now), the instance's max-min fair share, the
-- sum of the live wants, "1" if that exceeds the rate, "1" while grants
-- are capped because Redis lost records, the whole tokens moved from the
-- pool, "1" if the ask was older than the instance's record and did
-- nothing. A release and a stale ask are granted 0 with in_us 0.
--
-- Invariant after every run: what the lease records hold plus the pool's
-- rate is at most the rate, and the same of the burst: the grant is at
-- most the rate less what the other records hold, the instance says what
-- it runs (the claim), which it was counted at already unless Redis lost
-- it, and the pool is what the records leave.

local key, inst = KEYS[1], ARGV[1]
local gen = gen_of(ARGV[2])
local want, rate, burst, n = num(ARGV[3]), num(ARGV[4]), num(ARGV[5]), num(ARGV[6])
local ttl, max_ttl = num(ARGV[7]), num(ARGV[8])
local running, running_us = num(ARGV[9]), num(ARGV[10])
local young = num(ARGV[13])
if not (inst ~= nil and inst ~= '' and gen and want and rate and burst and n and ttl and max_ttl
  and running and running_us and young and (ARGV[11] == '0' or ARGV[11] == '1')
  and (ARGV[12] == '0' or ARGV[12] == '1') and (ARGV[14] == '0' or ARGV[14] == '1')
  and want >= 0 and rate > 0 and burst >= 1 and n >= 1 and ttl >= 1 and max_ttl >= ttl
  and running >= 0 and running_us >= 0 and young >= 0) then
  return redis.error_reply('ERR hybridlimit: invalid ask arguments')
end
local drain, release, recorded = ARGV[11] == '1', ARGV[12] == '1', ARGV[14] == '1'

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local self = 'i:' .. inst

local h = read_hash(redis.call('HGETALL', key), inst, now)
hdel(key, h.dead)
local own = h.own
local others = held_by_others(h, now)

-- The pool as the records left it before this ask: its size changes with
-- what this instance's record holds, from now on.
local held_before = others
if own ~= nil then held_before = held_before + holds(own, now) end
local f_before = pool_frac(held_before, rate, h.lost, h.known)

local granted, fair, demand, contended, in_us, drained, stale = 0, 0, 0, false, 0, 0, false
local lost, known = h.lost, h.known
local mine = own -- this instance's record as the ask leaves it

if own ~= nil and newer(own.gen, gen) then
  -- Sent in a placement the instance has left: it must not undo the
  -- record of the one it is in.
  stale = true
elseif release then
  if own ~= nil then redis.call('HDEL', key, self) end
  mine = nil
else
  -- The instance runs a grant that Redis has no lease record of, or says
  -- it has a record Redis does not have: Redis lost it, and perhaps the
  -- others' too. Until every lease granted before the loss has ended,
  -- nobody grows.
  if (running > 0 and not (own ~= nil and own.kind == 'L')) or (recorded and own == nil) then
    lost, known = math.max(lost or 0, now + max_ttl), (known or 0) + running
    redis.call('HSET', key, 'lost', string.format('%d %.17g', lost, known))
  end

  -- Every other live instance whose demand is not young wants something:
  -- a lease its want while the grant lives, an exact user its measured
  -- demand, which the pool must keep for it.
  local wants = {}
  local old = now - young
  for _, l in ipairs(h.leases) do
    if l.expiry > now and l.born <= old then wants[#wants + 1] = l.want end
  end
  for _, x in ipairs(h.exact) do
    if x.born <= old then wants[#wants + 1] = decayed(x.demand, x.at, now) end
  end
  wants[#wants + 1] = want
  local level, left
  demand, level, left = water_fill(wants, rate)
  contended = level ~= nil
  if contended then
    fair = math.min(want, level)
  elseif #h.exact > 0 or not (want > 0) then
    -- No surplus while others decide the key exactly: the pool takes up
    -- what the leases leave, and its users take the surplus request by
    -- request. Nor for an instance that wants nothing.
    fair = want
  else
    -- What nobody wants is split N ways on top, so that N-1 parts stay
    -- free for instances that start wanting the key; but never below
    -- rate/n while that is free.
    fair = math.max(want + left / math.max(n, #wants), math.min(rate / n, want + left))
  end
  -- The others' live credits are tokens out of the pool, which its burst
  -- must keep room for: the grant leaves the pool that part of the rate
  -- (of a lease's credit, what its part of the burst does not cover).
  local room = rate - others - rate * credit_beyond_others(h, now, rate, burst) / burst
  granted = math.max(0, math.min(fair, room))
  -- While lost, a grant is at most what the instance runs already, or what
  -- the known grants leave (capacity): nobody grows into leases Redis
  -- forgot.
  if lost ~= nil then granted = math.min(granted, math.max(running, capacity(others, known))) end

  local claim, claim_until = 0, 0
  if running > 0 and running_us > 0 then claim, claim_until = running, now + running_us end
  local born = now
  if own ~= nil then born = own.born end
  -- The instance may spend its live credit until the grant is in force.
  mine = carry_credit({kind = 'L', gen = gen, granted = granted, want = want, expiry = now + ttl,
    claim = claim, claim_until = claim_until, born = born}, own, now)
  redis.call('HSET', key, self, encode(mine))
  in_us = ttl
end

local held_after = others
if mine ~= nil then held_after = held_after + holds(mine, now) end
local f_after = pool_frac(held_after, rate, lost, known)

-- The pool refills at the size the records gave it until now, and at its
-- new size from now on: a pool is stored at now by every ask, since the
-- ask may change its size, or delete records whose credits capped it
-- (pool_at; a released record's credit stops counting from now). A
-- missing pool is full, at any size: it stays missing unless it grows.
local tokens = nil
if h.pool ~= nil then tokens = pool_at(h.pool, now, rate, burst, f_before, h.credits) end
local store = h.pool ~= nil or f_after > f_before + 1e-12
if drain and granted > 0 then
  -- Moved, not copied: the lease's part of the burst, at most what the
  -- pool holds.
  local have = tokens or pool_cap(burst, f_before, h.credits, now)
  drained = math.max(0, math.min(math.floor(burst * granted / rate + eps), math.floor(have + eps)))
  tokens, store = math.max(0, have - drained), true
end
if store then
  tokens = math.min(tokens or pool_cap(burst, f_before, h.credits, now), pool_cap(burst, f_after, h.credits, now))
  redis.call('HSET', key, 'p', string.format('%.17g %d', tokens, now))
end

local last, lease_last = hash_ends(h, mine, lost, now)
expire_hash(key, now, last, lease_last, tokens, burst, rate)

local function flag(b)
  if b then return '1' end
  return '0'
end
return {
  string.format('%.17g', granted),
  string.format('%.17g', fair),
  string.format('%.17g', demand),
  flag(contended),
  string.format('%d', in_us),
  flag(lost ~= nil),
  string.format('%d', drained),
  flag(stale),
}
