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
-- because Redis truncates Lua numbers to integers. fair is this instance's
-- max-min fair share; when the key is uncontended, its want plus an N-th of
-- what nobody wants.
--
-- Invariant: after every run, the sum over the live leases of the key of
-- what each instance may be running -- the larger of its grant and, until
-- it ends, the grant it said it was running -- is at most rate, because
-- this instance is granted at most rate minus what the others may be
-- running, and it was counted at what it is running already. Leases only
-- otherwise shrink (expire or are released).
--
-- Redis runs this as Lua 5.1 and forbids globals: every name is local.

-- decode_lease reads an "i:<instance>" value, in either format, into
-- {granted, want, expiry, running, running_until}; nil if it is unreadable.
-- A record without a running grant says it runs 0 until 0.
local function decode_lease(v)
  local g, w, e, rg, re = string.match(v, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
  if not g then
    g, w, e = string.match(v, '^(%S+) (%S+) (%S+)$')
    rg, re = '0', '0'
  end
  g, w, e, rg, re = tonumber(g), tonumber(w), tonumber(e), tonumber(rg), tonumber(re)
  if not g or not w or not e or not rg or not re then
    return nil
  end
  return {granted = g, want = w, expiry = e, running = rg, running_until = re}
end

-- encode_lease writes a lease for decode_lease: five fields if it has a
-- running_until, the three of the older format if not.
local function encode_lease(l)
  if l.running_until == nil then
    return string.format('%.17g %.17g %d', l.granted, l.want, l.expiry)
  end
  return string.format('%.17g %.17g %d %.17g %d',
    l.granted, l.want, l.expiry, l.running, l.running_until)
end

-- holds is what the instance of lease l may be running at now: its grant
-- while the lease lives, and the larger grant it was running when it
-- asked, until that ends.
local function holds(l, now)
  local h = 0
  if l.expiry > now then h = l.granted end
  if l.running_until > now and l.running > h then h = l.running end
  return h
end

-- lease_end is when lease l stops counting: when both its grant and the
-- grant it said it was running have ended.
local function lease_end(l)
  return math.max(l.expiry, l.running_until)
end

-- read_hash sorts out the fields of the lease hash at server time now, for
-- instance inst. It returns
--   born    when the hash was created, nil if it does not say;
--   dead    the fields to delete: ended or unreadable leases and markers;
--   wants   the wants of the other instances whose grant lives;
--   others  what the other instances may be running (see holds);
--   last    when the latest of the others' leases and markers ends, or 0;
--   known   how many other instances have asked: those with a live lease,
--           and those that released theirs recently ("r:<instance>") and
--           hold none since. An instance that released its lease is not one
--           that has not asked yet.
local function read_hash(fields, inst, now)
  local self, self_released = 'i:' .. inst, 'r:' .. inst
  local born, dead, wants, others, last = nil, {}, {}, 0, 0
  local released, leased = {}, {} -- by instance id
  for i = 1, #fields, 2 do
    local id, v = fields[i], fields[i + 1]
    if id == 'born' then
      born = tonumber(v)
    elseif string.sub(id, 1, 2) == 'r:' then
      local e = tonumber(v)
      if not e or e <= now then
        dead[#dead + 1] = id
      elseif id ~= self_released then
        released[string.sub(id, 3)] = true
        last = math.max(last, e)
      end
    else
      local l = decode_lease(v)
      if not l or lease_end(l) <= now then
        dead[#dead + 1] = id
      elseif id ~= self then
        if l.expiry > now then wants[#wants + 1] = l.want end
        others = others + holds(l, now)
        leased[string.sub(id, 3)] = true
        last = math.max(last, lease_end(l))
      end
    end
  end
  local known = #wants
  for id in pairs(released) do
    if not leased[id] then known = known + 1 end
  end
  return born, dead, wants, others, last, known
end

-- hdel deletes the fields ids of key, in chunks: unpack is limited by the
-- Lua stack.
local function hdel(key, ids)
  for i = 1, #ids, 1000 do
    redis.call('HDEL', key, unpack(ids, i, math.min(i + 999, #ids)))
  end
end

-- water_fill is the max-min fair split of rate over wants, which it sorts:
-- the smallest wants are served first. It returns the demand (the sum of
-- the wants), the level every want that does not fit is capped at (nil
-- when all fit, the key is uncontended) and, when all fit, what is left.
local function water_fill(wants, rate)
  table.sort(wants)
  local demand = 0
  for i = 1, #wants do demand = demand + wants[i] end
  local left = rate
  for i = 1, #wants do
    local share = left / (#wants - i + 1)
    if wants[i] > share then return demand, share, left end
    left = left - wants[i]
  end
  return demand, nil, left
end

-- fair_share is the fair share of an instance wanting want, when the
-- water-filling of count wants gave level and left.
--
-- Contended, it is the want capped at the level. Uncontended, what nobody
-- wants is split N ways on top of each want, so a key one instance uses
-- runs with at least its default share (and burst) there, while N-1 parts
-- stay free for instances that start wanting it. Not while the key is
-- young: after a FLUSHALL or a restart, instances that have not renewed
-- yet may hold more than the rate/N they are counted at, and handing out
-- what looks free would overshoot and starve them. A young key's instance
-- still gets what nobody wants on top of its want up to its default share
-- rate/N, so that a lease does not leave a sparse key worse off than rate/N
-- would (its burst follows its rate). A release's fair share is its want, 0.
local function fair_share(want, level, left, count, rate, n, young)
  if level ~= nil then
    return math.min(want, level)
  end
  if not (want > 0) then
    return want
  end
  local with_surplus = want + left / math.max(n, count)
  if young then
    return math.max(want, math.min(rate / n, with_surplus))
  end
  return with_surplus
end

local key = KEYS[1]
local inst = ARGV[1]
local want = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local cold = tonumber(ARGV[6])
local running = tonumber(ARGV[7])
local running_us = tonumber(ARGV[8])
local valid = inst ~= nil and inst ~= '' and want and rate and n and ttl and cold
  and running and running_us and not (want < 0 or rate < 0 or n < 1 or ttl < 1
  or cold < 0 or running < 0 or running_us < 0)
if not valid then
  return redis.error_reply('ERR hybridlimit: invalid lease arguments')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local self = 'i:' .. inst

local born, dead, wants, others, last, known =
  read_hash(redis.call('HGETALL', key), inst, now)
if born == nil and want > 0 then
  born = now
  redis.call('HSET', key, 'born', string.format('%d', now))
end
hdel(key, dead)
local young = born ~= nil and now - born < cold

-- This instance, then, while the key is young, the instances that have not
-- asked yet, each counted as wanting its default share: they may be running
-- at it already, and counting them keeps cold starts from overshooting. An
-- instance that first sees the key later starts at its default share too;
-- DESIGN.md allows one such default share per (instance, key) cold start.
wants[#wants + 1] = want
if young then
  for _ = 1, math.floor(n) - (known + 1) do
    wants[#wants + 1] = rate / n
  end
end

local demand, level, left = water_fill(wants, rate)
local fair = fair_share(want, level, left, #wants, rate, n, young)
local granted = math.min(fair, rate - others)
if granted < 0 or want == 0 then granted = 0 end

local expiry = now
if want == 0 then
  -- Released: while the key is young, remember that this instance asked
  -- and wants nothing, so that it is not counted as one that has not asked.
  redis.call('HDEL', key, self)
  if young then
    local until_ = born + cold
    redis.call('HSET', key, 'r:' .. inst, string.format('%d', until_))
    last = math.max(last, until_)
  end
else
  expiry = now + ttl
  redis.call('HDEL', key, 'r:' .. inst)
  local l = {granted = granted, want = want, expiry = expiry}
  if running > 0 and running_us > 0 then
    -- Until it hears of this grant the instance runs the one it has: count
    -- that too, until it ends, so that what it gives up is not granted to
    -- others early (the one it has may be larger, or last longer).
    l.running, l.running_until = running, now + running_us
    last = math.max(last, l.running_until)
  end
  redis.call('HSET', key, self, encode_lease(l))
end
last = math.max(last, expiry)
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
