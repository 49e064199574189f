-- Give: put tokens back into a key's pool, on Redis server time: tokens
-- that take.lua took for a request that did not go ahead (a cancelled
-- reservation). placement.lua, prepended, describes the hash.
--
-- KEYS[1]  the placement hash (Store.RecordKey)
-- ARGV[1]  rate, the limit's rate in tokens per second (> 0)
-- ARGV[2]  burst, the limit's burst in tokens (>= 1)
-- ARGV[3]  tokens to give back (>= 0)
-- ARGV[4]  since_us, when they were taken: the server time take.lua
--          returned
--
-- Had the tokens never been taken, the pool would have been full sooner
-- and lost up to a refill's worth of them since (at most rate per
-- second): only the rest goes back, and never above the pool's burst (its
-- fraction of the limit's, pool_frac) less the live credits (pool_cap), so
-- that the pool holds at most what it would hold had the request never
-- come, and what the cluster admits, less the requests given back, stays
-- within rate·w + burst. A missing pool is full: it takes nothing back.
--
-- Returns the pool's tokens after the give, as a string.

local key = KEYS[1]
local rate, burst, give, since = num(ARGV[1]), num(ARGV[2]), num(ARGV[3]), num(ARGV[4])
if not (rate and burst and give and since and rate > 0 and burst >= 1 and give >= 0) then
  return redis.error_reply('ERR hybridlimit: invalid give arguments')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
give = math.max(0, give - math.max(0, now - since) * rate / 1000000)

-- No instance's record is this script's own: every lease is another's.
local h = read_hash(redis.call('HGETALL', key), '', now)
local f = pool_frac(held_by_others(h, now), rate, h.lost, h.known)
if h.pool == nil then return string.format('%.17g', pool_cap(burst, f, h.credits, now)) end
hdel(key, h.dead)
local tokens = math.min(pool_at(h.pool, now, rate, burst, f, h.credits) + give, pool_cap(burst, f, h.credits, now))
redis.call('HSET', key, 'p', string.format('%.17g %d', tokens, now))
local last, lease_last = hash_ends(h, nil, h.lost, now)
expire_hash(key, now, last, lease_last, tokens, burst, rate)
return string.format('%.17g', tokens)
