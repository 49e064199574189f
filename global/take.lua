-- Take: decide one request of an instance that decides a key exactly,
-- against the key's pool, on Redis server time. placement.lua, prepended,
-- describes the hash.
--
-- KEYS[1]  the placement hash (Store.RecordKey)
-- ARGV[1]  instance id (non-empty)
-- ARGV[2]  gen (1 to 255): the placement the take was sent in
-- ARGV[3]  rate, the limit's rate in tokens per second (> 0)
-- ARGV[4]  burst, the limit's burst in tokens (>= 1)
-- ARGV[5]  n, N-hat, the largest instance count seen lately (>= 1)
-- ARGV[6]  ttl_us, how long the instance's exact record lives (>= 1)
-- ARGV[7]  tokens to take (>= 0)
-- ARGV[8]  asked, the instance's cumulative count of the tokens asked for
--          on the key, this take's included (>= 0)
-- ARGV[9]  extra (>= 0): with an admission, up to this many tokens more,
--          taken ahead of the instance's next requests (credit), only
--          from a pool that stays at least half full, its demand over
--          credit_us (at least 1), to an instance without a live credit
-- ARGV[10] credit_id (0 to 2^32-1): the instance's last credit (0: none),
--          spent or ended there: if live, it stops counting from now
-- ARGV[11] credit_us (>= 0): how long a credit handed now lives; 0: none
--
-- The instance's record, by its generation and the take's:
--   a lease as new as the take or newer: the lease was asked for in the
--     placement the take was sent in or a later one, and the instance may
--     run it: it is kept and counted, and no exact record is written;
--   an older lease: the instance stopped running it before it sent the
--     take; it is replaced by an exact record, and its rate goes to the
--     pool at once;
--   an exact record newer than the take: left alone (a stale take);
--   an exact record of the same generation: updated, its demand grown by
--     what the instance asked for since (asked less the record's);
--   none, or an older exact record: a new exact record, at the demand of
--     this take's tokens.
--
-- Returns {allowed, tokens left, retry_us, pool_rate, pool_burst, turn_us,
-- credit, now_us}
-- as strings, because Redis truncates Lua numbers to integers. retry_us is
-- "-1" when the tokens can never be there at the pool's rate and burst as
-- they are; otherwise a denial's retry_us is when the pool would hold the
-- tokens (at the refill rate below). A denial's turn_us, and an
-- admission's when it left the pool less than one token, is the caller's
-- turn (see turn), at or after that; turn_us is "0" otherwise.

local key, inst = KEYS[1], ARGV[1]
local gen = gen_of(ARGV[2])
local rate, burst, n, ttl = num(ARGV[3]), num(ARGV[4]), num(ARGV[5]), num(ARGV[6])
local take, asked, extra = num(ARGV[7]), num(ARGV[8]), num(ARGV[9])
local credit_id, credit_us = num(ARGV[10]), num(ARGV[11])
if not (inst ~= nil and inst ~= '' and gen and rate and burst and n and ttl and take and asked and extra
  and credit_id and credit_us and rate > 0 and burst >= 1 and n >= 1 and ttl >= 1 and take >= 0
  and asked >= 0 and extra >= 0 and credit_id >= 0 and credit_id < 4294967296 and credit_us >= 0) then
  return redis.error_reply('ERR hybridlimit: invalid take arguments')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local self = 'i:' .. inst

local h = read_hash(redis.call('HGETALL', key), inst, now, true)
hdel(key, h.dead)
local own = h.own
local keep = own ~= nil and own.kind == 'L' and not newer(gen, own.gen)
local stale = own ~= nil and own.kind == 'X' and newer(own.gen, gen)

-- The pool refills at the size the records gave it until now: with an
-- older lease of the caller's, which is dropped from now on.
local others = held_by_others(h, now)
local held_before, held_after = others, others
if own ~= nil then held_before = held_before + holds(own, now) end
if keep then held_after = held_after + holds(own, now) end
local f = pool_frac(held_after, rate, h.lost, h.known)
local pool_rate, pool_burst = rate * f, burst * f
local tokens = math.min(pool_at(h.pool, now, rate, burst, pool_frac(held_before, rate, h.lost, h.known), h.credits),
  pool_cap(burst, f, h.credits, now))

-- The caller's record as the take leaves it, and its demand.
local mine = own
local demand = 0
if keep then
  -- counted at its lease
elseif stale then
  demand = decayed(own.demand, own.at, now)
else
  -- The instance's demand goes on across its placements: from its exact
  -- record, with the tokens asked for since (the instance counts them per
  -- key, whatever its generation); from the want of the lease it leaves,
  -- which it measured; or from this take alone on a fresh key.
  if own ~= nil and own.kind == 'X' then
    demand = decayed(own.demand, own.at, now) + math.max(0, asked - own.asked) * 1000000 / demand_tau
    asked = math.max(asked, own.asked)
  elseif own ~= nil then
    demand = own.want
  else
    demand = take * 1000000 / demand_tau
  end
  local born = now
  if own ~= nil then born = own.born end
  mine = carry_credit({kind = 'X', gen = gen, demand = demand, at = now, asked = asked, expiry = now + ttl,
    born = born}, own, now)
end

-- A take that names the caller's live credit says that it is spent, or
-- ended there: it stops counting from now. The tokens worked out at now
-- stay as they are; only the pool's refill from now on has the room.
local write = mine ~= own
if credit_id ~= 0 and credit_of(mine, now) > 0 and mine.credit_id == credit_id then
  mine.credit, mine.credit_end, mine.credit_id = 0, 0, 0
  write = true
end

-- refill is the rate the turns are worked out at: the pool's, or for an
-- exact caller up to its demand, at most rate/N-hat: the leases
-- leave the pool that much from their next renewals. A caller the leases
-- had left a trickle would be told to wait for it, seconds on a slow key,
-- while they make room for it within a renewal. Turns are hints only: a
-- caller that comes back early is denied again, and its demand grows.
local refill = pool_rate
if not keep then refill = math.max(pool_rate, math.min(rate / n, demand)) end

-- turn returns how long until the caller's turn to ask again, wait being
-- how long until the pool holds its size tokens. Callers that the pool
-- cannot serve now are told to come back one after another, one take's
-- refill apart, rather than all when the next tokens are there: each
-- caches that until its turn, so that a key sprayed over the instances
-- costs about one script per admission, not one per instance. Only the
-- hint moves: the tokens go to whoever asks first. Turns reach at most
-- n - 1 refills past wait (one per instance; also a turn kept from before
-- the rate changed), and fewer than the pool's
-- burst holds, so that the pool cannot fill up and lose tokens while
-- every caller waits. Only the latest turn is kept ("q"): the caller that
-- holds it keeps it if it asks again before it; any other caller is
-- queued after it.
local function turn(wait, size)
  local step = math.ceil(size * 1000000 / refill)
  local ahead = math.max(0, math.min(math.floor(n) - 1, math.floor(pool_burst / size + eps) - 1))
  local at = now + wait
  if h.q_at ~= nil and h.q_by == inst then
    at = math.min(math.max(at, h.q_at), at + ahead * step)
  elseif h.q_at ~= nil then
    at = math.min(math.max(at, h.q_at + step), at + ahead * step)
  end
  h.q_at, h.q_by = at, inst
  redis.call('HSET', key, 'q', string.format('%d %s', at, inst))
  return at - now
end

local allowed, retry, turn_us, credit = '0', 0, 0, 0
if take <= tokens + eps then
  allowed = '1'
  tokens = math.max(0, tokens - take)
  if take > 0 and credit_us > 0 and credit_of(mine, now) == 0 then
    -- Credit: taken now, admitted by the instance before its next take,
    -- from a pool at least half full after it, and counted in its record
    -- until it ends or a take names it.
    local size = math.min(extra, math.max(1, math.floor(demand * credit_us / 1000000 + eps)))
    credit = math.max(0, math.min(size, math.floor(tokens - pool_burst / 2 + eps)))
    if credit > 0 then
      tokens = tokens - credit
      mine.credit, mine.credit_end, mine.credit_id = credit, now + credit_us, now % 4294967296
      write = true
    end
  end
  if take > 0 and tokens + eps < 1 and pool_rate > 0 then
    -- The caller emptied the pool: its next take, of one token as most
    -- are, waits for its turn too.
    turn_us = turn(math.ceil((1 - tokens) * 1000000 / refill), 1)
  end
elseif take > pool_burst + eps or not (pool_rate > 0) then
  retry = -1
else
  -- The caller is told when the pool would hold its tokens; it is held
  -- until its turn, which may come later.
  retry = math.ceil((take - tokens) * 1000000 / refill)
  turn_us = turn(retry, take)
end

local pool = string.format('%.17g %d', tokens, now)
if write then
  redis.call('HSET', key, self, encode(mine), 'p', pool)
else
  redis.call('HSET', key, 'p', pool)
end

local last, lease_last = hash_ends(h, mine, h.lost, now)
expire_hash(key, now, last, lease_last, tokens, burst, rate)

return {
  allowed,
  string.format('%.17g', tokens),
  string.format('%d', retry),
  string.format('%.17g', pool_rate),
  string.format('%.17g', pool_burst),
  string.format('%d', turn_us),
  string.format('%d', credit),
  string.format('%d', now),
}
