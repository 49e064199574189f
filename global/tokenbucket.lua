-- Token bucket on Redis server time: refill, then take n tokens in one step.
--
-- KEYS[1]  bucket hash: tokens (float as string), ts (server time, microseconds)
-- ARGV[1]  rate, tokens per second (> 0)
-- ARGV[2]  burst, bucket capacity (>= 0)
-- ARGV[3]  n, tokens to take; a negative n gives -n tokens back (a
--          request that did not go ahead), less what the bucket could
--          have refilled since they were taken, never above burst
-- ARGV[4]  for a give, when the tokens were taken: the server time the
--          take returned, in microseconds
--
-- Returns {allowed ("0"/"1"), tokens left, retry_after_us, now_us}, all
-- strings because Redis truncates Lua numbers to integers. retry_after_us is "-1" when n tokens
-- can never be there (n > burst).
local key = KEYS[1]
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local since = tonumber(ARGV[4] or '0')
if not rate or not burst or not n or not since or rate <= 0 or burst < 0 then
  return redis.error_reply('ERR hybridlimit: invalid token bucket arguments')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if n < 0 then
  -- A give: had the tokens never been taken, the bucket would have been
  -- full sooner and lost up to a refill's worth of them since; giving
  -- back only the rest leaves it at most where it would be.
  n = math.min(0, n + math.max(0, now - since) * rate / 1000000)
end

local state = redis.call('HMGET', key, 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  -- A missing (or expired) bucket is a full one.
  tokens = burst
  ts = now
end
-- The server clock may step back after a failover; never refill negatively.
local elapsed = math.max(0, now - ts)
tokens = tokens + elapsed * rate / 1000000
if tokens > burst then tokens = burst end
if tokens < 0 then tokens = 0 end

local allowed = 0
local retry = 0
if n <= tokens then
  allowed = 1
  tokens = math.min(tokens - n, burst)
elseif n > burst then
  retry = -1
else
  retry = math.ceil((n - tokens) * 1000000 / rate)
end

redis.call('HSET', key, 'tokens', string.format('%.17g', tokens), 'ts', string.format('%d', now))
-- Expire when the bucket would be full again: a missing key means the same.
local ttl = math.ceil((burst - tokens) * 1000 / rate)
if ttl < 1 then ttl = 1 end
if ttl > 9007199254740991 then ttl = 9007199254740991 end
redis.call('PEXPIRE', key, string.format('%d', ttl))

return {tostring(allowed), string.format('%.17g', tokens), string.format('%d', retry), string.format('%d', now)}
