-- Rate lease: grant one instance its share of a global rate, on Redis server time.
--
-- KEYS[1]  lease hash: one field "i:<instance>" per instance, value
--          "granted want expiry_us", or "granted want expiry_us running
--          running_until_us" when the instance said it was running a grant
--          until then; a field "born" with the time (us) the
--          hash was created; and, while the key is young, "r:<instance>"
--          (value: until when, us) for instances that released their lease
-- ARGV[1]  instance id (non-empty)
-- ARGV[2]  want, tokens per second this instance asks for (>= 0; 0 releases)
-- ARGV[3]  rate, the limit's global rate in tokens per second (>= 0)
-- ARGV[4]  n, the live instance count (>= 1)
-- ARGV[5]  ttl_us, lease lifetime in microseconds (>= 1)
-- ARGV[6]  cold_us, how long after the hash is born instances that have not
--          asked yet are counted as wanting rate/n (>= 0)
-- ARGV[7]  running, the grant this instance is running now, tokens per
--          second (>= 0): it learns of this run's grant only when the answer
--          arrives, and perhaps never (a lost answer)
-- ARGV[8]  running_us, how much longer it runs that grant, microseconds (>= 0)
--
-- Returns {granted, fair, demand, contended ("0"/"1"), expiry_us}, all strings
-- (fair: this instance's max-min fair share; when the key is uncontended, its
-- want plus an N-th of what nobody wants)
-- because Redis truncates Lua numbers to integers.
--
-- Invariant: after every run, the sum over the live leases of the key of
-- what each instance may be running -- the larger of its grant and, until
-- it ends, the grant it said it was running -- is at most rate, because
-- this instance is granted at most rate minus what the others may be
-- running, and it was counted at what it is running already. Leases only
-- otherwise shrink (expire or are released).
local key = KEYS[1]
local inst = ARGV[1]
local want = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local cold = tonumber(ARGV[6])
local running = tonumber(ARGV[7])
local running_us = tonumber(ARGV[8])
if inst == nil or inst == '' or not want or not rate or not n or not ttl or not cold
    or not running or not running_us
    or want < 0 or rate < 0 or n < 1 or ttl < 1 or cold < 0 or running < 0 or running_us < 0 then
  return redis.error_reply('ERR hybridlimit: invalid lease arguments')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- Live leases of the other instances; expired or unreadable fields go.
local fields = redis.call('HGETALL', key)
local wants = {}
local others = 0
local last = 0 -- latest expiry among the other live leases
local dead = {}
local born = nil
local self = 'i:' .. inst
local released = {} -- instances that released recently: known, wanting 0
local leased = {}   -- instances with a live lease
for i = 1, #fields, 2 do
  local id = fields[i]
  if id == 'born' then
    born = tonumber(fields[i + 1])
  elseif string.sub(id, 1, 2) == 'r:' then
    local e = tonumber(fields[i + 1])
    if not e or e <= now then
      dead[#dead + 1] = id
    elseif id ~= 'r:' .. inst then
      released[string.sub(id, 3)] = true
      if e > last then last = e end
    end
  else
  local v = fields[i + 1]
  local g, w, e, rg, re = string.match(v, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
  if not g then
    g, w, e = string.match(v, '^(%S+) (%S+) (%S+)$')
    rg, re = '0', '0'
  end
  g, w, e, rg, re = tonumber(g), tonumber(w), tonumber(e), tonumber(rg), tonumber(re)
  if not g or not w or not e or not rg or not re then
    dead[#dead + 1] = id
  else
    -- What the instance may be running: its grant while the lease lives,
    -- and the larger grant it was running when it asked, until that ends.
    local holds = 0
    if e > now then holds = g end
    if re > now and rg > holds then holds = rg end
    local until_ = math.max(e, re)
    if until_ <= now then
      dead[#dead + 1] = id
    elseif id ~= self then
      if e > now then wants[#wants + 1] = w end
      others = others + holds
      leased[string.sub(id, 3)] = true
      if until_ > last then last = until_ end
    end
  end
  end
end
-- An instance that released its lease is not one that has not asked yet.
local known = #wants
for id in pairs(released) do
  if not leased[id] then known = known + 1 end
end
if born == nil and want > 0 then
  born = now
  redis.call('HSET', key, 'born', string.format('%d', now))
end
-- Delete in chunks: unpack is limited by the Lua stack.
for i = 1, #dead, 1000 do
  redis.call('HDEL', key, unpack(dead, i, math.min(i + 999, #dead)))
end

-- This instance, then, while the key is young, the instances that have not
-- asked yet, each counted as wanting its default share: they may be running
-- at it already, and counting them keeps cold starts from overshooting. An
-- instance that first sees the key later starts at its default share too;
-- DESIGN.md allows one such default share per (instance, key) cold start.
wants[#wants + 1] = want
if born ~= nil and now - born < cold then
  local phantoms = math.floor(n) - (known + 1)
  for _ = 1, phantoms do
    wants[#wants + 1] = rate / n
  end
end

-- Max-min fair split (water-filling): serve the smallest wants first; the
-- level is what every want that does not fit is capped at.
table.sort(wants)
local demand = 0
for i = 1, #wants do demand = demand + wants[i] end
local left = rate
local level = nil
for i = 1, #wants do
  local share = left / (#wants - i + 1)
  if wants[i] > share then
    level = share
    break
  end
  left = left - wants[i]
end
local fair = want
if level ~= nil and level < fair then fair = level end
-- Uncontended: what nobody wants is split N ways on top of each want, so a
-- key one instance uses runs with at least its default share (and burst)
-- there, while N-1 parts stay free for instances that start wanting it.
-- Not while the key is young: after a FLUSHALL or a restart, instances that
-- have not renewed yet may hold more than the rate/N they are counted at,
-- and handing out what looks free would overshoot and starve them.
local young = born ~= nil and now - born < cold
if level == nil and want > 0 and not young then
  fair = want + left / math.max(n, #wants)
end
-- Uncontended, a young key's instance still gets what nobody wants on top
-- of its want up to its default share rate/N, so that a lease does not
-- leave a sparse key worse off than rate/N would (its burst follows its
-- rate).
if level == nil and want > 0 then
  fair = math.max(fair, math.min(rate / n, want + left / math.max(n, #wants)))
end

local granted = math.min(fair, rate - others)
if granted < 0 or want == 0 then granted = 0 end

local expiry = now
if want == 0 then
  -- Released: while the key is young, remember that this instance asked
  -- and wants nothing, so that it is not counted as one that has not asked.
  redis.call('HDEL', key, self)
  if born ~= nil and now - born < cold then
    local until_ = born + cold
    redis.call('HSET', key, 'r:' .. inst, string.format('%d', until_))
    if until_ > last then last = until_ end
  end
else
  expiry = now + ttl
  redis.call('HDEL', key, 'r:' .. inst)
  if running > 0 and running_us > 0 then
    -- Until it hears of this grant the instance runs the one it has: count
    -- that too, until it ends, so that what it gives up is not granted to
    -- others early (the one it has may be larger, or last longer).
    local running_until = now + running_us
    redis.call('HSET', key, self,
      string.format('%.17g %.17g %d %.17g %d', granted, want, expiry, running, running_until))
    if running_until > last then last = running_until end
  else
    redis.call('HSET', key, self,
      string.format('%.17g %.17g %d', granted, want, expiry))
  end
end
if expiry > last then last = expiry end
-- The hash lives as long as its latest lease, so it vanishes with the last one.
if last > now then
  redis.call('PEXPIRE', key, string.format('%d', math.ceil((last - now) / 1000)))
else
  redis.call('DEL', key)
end

local contended = '0'
if demand > rate then contended = '1' end
return {
  string.format('%.17g', granted),
  string.format('%.17g', fair),
  string.format('%.17g', demand),
  contended,
  string.format('%d', expiry),
}
