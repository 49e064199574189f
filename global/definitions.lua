-- Definitions: record what one instance runs a limit at, and return what
-- every live instance does, on Redis server time.
--
-- KEYS[1]  the limit's definitions hash (Store.DefinitionsKey)
-- ARGV[1]  instance id (non-empty)
-- ARGV[2]  the instance's definition of the limit (any text)
-- ARGV[3]  ttl_ms: how long the record lives unless written again (>= 1)
--
-- Each field is an instance, its value "expiry_ms definition". Returns the
-- live records, this one included, as a flat list: instance, definition,
-- instance, definition, ... Ended records are deleted.

local key, inst, def, ttl = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
if not (inst ~= nil and inst ~= '' and def ~= nil and ttl and ttl >= 1) then
  return redis.error_reply('ERR hybridlimit: invalid definitions arguments')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', key, inst, string.format('%d %s', now + ttl, def))

local all, out = redis.call('HGETALL', key), {}
for i = 1, #all, 2 do
  local expiry, d = string.match(all[i + 1], '^(%d+) (.*)$')
  if expiry == nil or tonumber(expiry) <= now then
    redis.call('HDEL', key, all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = d
  end
end
redis.call('PEXPIRE', key, ttl)
return out
