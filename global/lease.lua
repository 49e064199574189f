-- Rate lease: grant one instance its share of a global rate, on Redis server
-- time. records.lua, prepended, describes the hash and its helpers.
--
-- KEYS[1]  lease hash (see records.lua)
-- ARGV[1]  instance id (non-empty)
-- ARGV[2]  want, tokens per second this instance asks for (>= 0; 0 without
--          yield releases)
-- ARGV[3]  rate, the limit's global rate in tokens per second (>= 0)
-- ARGV[4]  n, the instance count N-hat, the largest seen lately (>= 1)
-- ARGV[5]  ttl_us, lease lifetime in microseconds (>= 1)
-- ARGV[6]  running, what this instance is running now, tokens per second
--          (>= 0): it learns of this run's grant only when the answer
--          arrives, and perhaps never (a lost answer)
-- ARGV[7]  running_us, how much longer it runs that, microseconds (>= 0)
-- ARGV[8]  yield ("0"/"1"): the instance gives up everything above want,
--          and with want 0 keeps a record granted 0
-- ARGV[9]  held ("0"/"1"): running is a grant Redis gave this instance
-- ARGV[10] max_ttl_us, the longest lease any instance may hold (>= 1)
-- ARGV[11] exact_bursts ("0"/"1", absent = "0"): the limit's instances
--          never run a default share unasked (their first decision on a
--          key asks Redis), so unrecorded instances are counted at 0
-- ARGV[12] young ("0"/"1", absent = "0"): the instance's demand above what
--          it runs is too recent to cut the others' grants for: it is
--          granted what it would be, but its record wants no more than it
--          then holds (the larger of grant and running), so that the
--          others' fair shares, and their grants at their next renewals,
--          do not make room for it; the rest of its want is kept apart
--          (young_want) and still counts as demand: while it goes unmet,
--          nobody is granted what nobody wants on top of its want
-- ARGV[13] drain (>= 0, absent = 0): the instance comes from the exact
--          placement; with a grant, up to drain * granted / rate whole
--          tokens (the lease's part of a burst of drain) move from the
--          key's pool to it, as the pool last stored them (without refill),
--          so that its traffic goes on at the lease with what the pool
--          held for it
-- ARGV[14] "burst want_b running_b" (absent or empty: the burst is not
--          counted apart, and every record holds its rate's part of it):
--          the limit's burst, the part of it this instance asks for, and
--          the part it runs now (until running_us, as running). Redis
--          then counts the burst as it counts the rate: every instance at
--          the part it may hold (a lease at the larger of its granted and
--          running parts, an exact user and an unrecorded instance at
--          their default part burst/n, the unrecorded with the remainder
--          tokens their ranks may give them), and grants at most the
--          max-min fair part of the wants, and at most the burst less what
--          the others are counted at. So an instance whose traffic is
--          light but bursty can hold more than its rate's part of the
--          burst while a saturated one, which needs little, holds less.
--
-- Returns {granted, fair, demand, contended ("0"/"1"), expiry_us, lost
-- ("0"/"1"), in_us, unrecorded, drained, granted_b}, all strings because
-- Redis truncates Lua numbers to integers. granted_b is the part of the
-- burst granted, -1 without ARGV[14].
-- fair is this instance's max-min fair share. expiry_us is when the lease
-- ends; for a release, when the instance may run its default share again
-- (grants made while its record counted it lower may run until then).
-- lost is "1" while grants are capped at running because Redis lost leases.
--
-- Invariant: after every run, the sum over the instances of the key of what
-- each may be running -- a lease the larger of its grant and, until it
-- ends, the grant it said it was running; an unrecorded instance its
-- default share rate/n -- and the pool's rate, which the exact users take
-- from and which is what the leases and the unrecorded leave (exact.lua),
-- is at most rate, because this instance is granted at most rate minus
-- what all the others are counted at, and it was counted at what it is
-- running already. Exact users run nothing locally: what they are counted
-- at (rate/n, or their demand with exact bursts) is what the grants leave
-- the pool for them. Otherwise records only shrink (expire or are released), but an
-- instance that releases a record below rate/n, or whose record lapsed,
-- is unrecorded again: it must not run its default share before the
-- grants made meanwhile end (expiry_us of the release). After Redis lost its records (FLUSHALL, a
-- restart, a failover), the instances that still run pre-loss leases are
-- not counted; until the longest of those has ended ("lost"), no grant
-- exceeds what its instance says it runs (an exact user: the default share
-- the pool holds for it meanwhile), so nobody grows into them.
-- With ARGV[14] the same holds of the burst: the parts each may hold (a
-- lease the larger of its granted part and, until it ends, the part it
-- said it ran; an exact user and an unrecorded instance burst/n, the
-- unrecorded with the remainder tokens their ranks may hold) sum to at
-- most burst, and exact.lua's pool holds what they leave.

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
-- wants is split N ways on top of each want, so N-1 parts stay free for
-- instances that start wanting the key; but never below the default share
-- rate/n while that is free, so that a lease never leaves a key worse off
-- than rate/n would (its burst follows its rate). An instance that yields
-- gets no surplus, nor does any instance while others decide the key
-- exactly: the pool they take from is what the leases leave, and it takes
-- up the surplus, where those who want it ask for it request by request
-- (an exact user is counted at its default share, or its measured demand,
-- which can be far below what it wants). A release's fair share is its
-- want, 0.
local function fair_share(want, level, left, count, rate, n, yield)
  if level ~= nil then
    return math.min(want, level)
  end
  if yield or not (want > 0) then
    return want
  end
  return math.max(want + left / math.max(n, count), math.min(rate / n, want + left))
end

local key = KEYS[1]
local inst = ARGV[1]
local want = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local running = tonumber(ARGV[6])
local running_us = tonumber(ARGV[7])
local yield, held = ARGV[8] == '1', ARGV[9] == '1'
local max_ttl = tonumber(ARGV[10])
local exact_bursts = ARGV[11] == '1'
local young = ARGV[12] == '1'
local drain = tonumber(ARGV[13] or '0')
local burst, want_b, running_b
local burst_ok = true
if ARGV[14] ~= nil and ARGV[14] ~= '' then
  local a, b, c = string.match(ARGV[14], '^(%S+) (%S+) (%S+)$')
  if a then burst, want_b, running_b = tonumber(a), tonumber(b), tonumber(c) end
  burst_ok = burst ~= nil and want_b ~= nil and running_b ~= nil
    and burst >= 0 and want_b >= 0 and running_b >= 0
end
local valid = burst_ok and inst ~= nil and inst ~= '' and want and rate and n and ttl
  and running and running_us and max_ttl and drain and drain >= 0
  and (ARGV[8] == '0' or ARGV[8] == '1') and (ARGV[9] == '0' or ARGV[9] == '1')
  and not (want < 0 or rate < 0 or n < 1 or ttl < 1 or running < 0
  or running_us < 0 or max_ttl < 1)
if not valid then
  return redis.error_reply('ERR hybridlimit: invalid lease arguments')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local self, self_x = 'i:' .. inst, 'x:' .. inst
local share = rate / n
local release = want == 0 and not yield

local h = read_hash(redis.call('HGETALL', key), inst, now, burst, rate, n)
hdel(key, h.dead)

-- A grant this instance runs has no record: Redis lost it, and perhaps the
-- others' too. Until every lease granted before the loss has ended, no
-- instance may grow.
local lost = h.lost
if held and running > 0 and h.own == nil then
  lost = math.max(lost or 0, now + max_ttl)
  redis.call('HSET', key, 'lost', string.format('%d', lost))
end

-- Every live instance is counted: the others with a lease at what they may
-- be running and at their want; the unrecorded at the default share, what
-- they may run without asking; exact users at the default share, what they
-- gave the pool, or with exact bursts at their measured demand with
-- headroom (exact_counted), which is all the pool must leave them: they
-- run nothing but what they take from it, and what a lease is granted is
-- taken from the pool's rate.
local unrecorded = math.max(0, math.floor(n) - 1 - h.recorded)
if exact_bursts then unrecorded = 0 end
local wants = h.wants
local counted = h.others + unrecorded * share
for i = 1, h.exact do
  local c = share
  if exact_bursts then c = exact_counted(h.exact_d[i] or nil, share) end
  wants[#wants + 1] = c
  counted = counted + c
end
for _ = 1, unrecorded do
  wants[#wants + 1] = share
end
wants[#wants + 1] = want

local demand, level, left = water_fill(wants, rate)
-- Young wants do not cut the others' fair shares, but what is left is not
-- handed out on top of the wants while they go unmet.
demand = demand + h.young
-- No surplus either while others decide the key exactly (see fair_share).
local pooled = h.exact > 0
local fair = fair_share(want, level, left, #wants, rate, n, yield or h.young > 0 or pooled)
local granted = math.min(fair, rate - counted)
-- While lost, no grant exceeds what Redis counts its instance at already,
-- so that the total counted never grows into the leases Redis forgot: what
-- the instance says it runs, what its record holds, and for an exact user
-- (leaving the exact placement, it runs nothing locally) the default share
-- of rate and burst that the pool holds for each exact user meanwhile
-- (exact.lua). Its lease takes that share from the pool; the record keeps
-- counting it at that share until the loss is forgotten (keep_share), so
-- that its renewals may be granted it once the others' grants leave room.
-- Before, a grant of 0 on the first request, while a peer still ran a
-- larger grant, left its traffic with nothing until the loss was
-- forgotten (MaxTTL).
local may_run, may_run_b = running, running_b
if h.own ~= nil then
  may_run = math.max(may_run, holds(h.own, now))
  if burst ~= nil then may_run_b = math.max(may_run_b, holds_burst(h.own, now, burst, rate)) end
end
local keep_share = false
if h.own_x ~= nil then
  may_run = math.max(may_run, share)
  if burst ~= nil then may_run_b = math.max(may_run_b, burst / n) end
  keep_share = lost ~= nil
end
if lost ~= nil then granted = math.min(granted, may_run) end
if granted < 0 or release then granted = 0 end

-- The burst, counted as the rate is (ARGV[14]). The unrecorded may hold
-- one token of the burst's remainder each beyond burst/n (by their ranks,
-- which Redis does not know), at most burst mod n of them.
local granted_b = -1
if burst ~= nil then
  local share_b = burst / n
  local whole = math.floor(n)
  local rem = burst % whole
  local extra = math.max(0, math.min(unrecorded, rem) - unrecorded * rem / whole)
  local wants_b = h.wants_b
  for _ = 1, h.exact + unrecorded do
    wants_b[#wants_b + 1] = share_b
  end
  wants_b[#wants_b + 1] = want_b
  local counted_b = h.others_b + (h.exact + unrecorded) * share_b + extra
  local _, level_b, left_b = water_fill(wants_b, burst)
  granted_b = math.min(fair_share(want_b, level_b, left_b, #wants_b, burst, n, yield or pooled),
    burst - counted_b)
  if lost ~= nil then granted_b = math.min(granted_b, may_run_b) end
  if granted_b < 0 or not (granted > 0) then granted_b = 0 end
end

local expiry = now
local last = h.last
local drained = 0
if release then
  redis.call('HDEL', key, self, self_x)
  -- Counted at its default share from now on: it may run that share at
  -- once if its record counted it at least that and every lease granted
  -- while it was counted lower has ended (an exact record says until
  -- when such leases may run, see exact.lua); otherwise -- a lower
  -- record, or one that has lapsed and may have been lower -- once the
  -- others' leases stop holding more than their default shares: only
  -- what a lease holds above its own share can be what this instance
  -- did not hold. A release it is still waiting out ("w:") holds too.
  if h.own_x ~= nil then
    expiry = math.max(now, h.own_x_clean or 0)
  elseif not (h.own ~= nil and holds(h.own, now) >= share
    and (burst == nil or holds_burst(h.own, now, burst, rate) >= burst / n - 1e-9)) then
    expiry = math.max(now, h.above_end)
  end
  expiry = math.max(expiry, h.own_w or 0)
  if expiry > now then
    redis.call('HSET', key, 'w:' .. inst, string.format('%d', expiry))
    last = math.max(last, expiry)
  end
else
  expiry = now + ttl
  redis.call('HDEL', key, self_x)
  local l = {granted = granted, want = want, expiry = expiry}
  if burst ~= nil then
    l.granted_b, l.want_b = granted_b, want_b
    if young then l.want_b = math.min(want_b, math.max(granted_b, running_b)) end
  end
  if young then
    l.want = math.min(want, math.max(granted, running))
    if want > l.want then l.young_want = want end
  end
  if (running > 0 or (running_b or 0) > 0) and running_us > 0 then
    -- Until it hears of this grant the instance runs what it has: count
    -- that too, until it ends, so that what it gives up is not granted to
    -- others early (what it has may be larger, or last longer).
    l.running, l.running_until = running, now + running_us
    l.running_b = running_b
    last = math.max(last, l.running_until)
  end
  if keep_share then
    l.running = math.max(l.running or 0, share)
    l.running_until = math.max(l.running_until or 0, lost)
    if burst ~= nil then l.running_b = math.max(l.running_b or 0, burst / n) end
  elseif lost ~= nil and h.own ~= nil and h.own.running_until > now
    and math.min(h.own.running, share) > (l.running or 0)
    and h.own.running_until >= (l.running_until or 0) then
    -- While lost, the record's claim, up to the default share, is kept
    -- if it is larger than the request's and lasts at least as long:
    -- keep_share's, until the instance is granted it. A larger claim (a
    -- lease the instance ran before it heard of a smaller grant) is not:
    -- the instance said it runs less now, and its peers may grow into
    -- what it gave up.
    l.running, l.running_until = math.min(h.own.running, share), h.own.running_until
    if burst ~= nil then
      l.running_b = math.max(l.running_b or 0, math.min(h.own.running_b or 0, burst / n))
    end
  end
  if l.running_until ~= nil then last = math.max(last, l.running_until) end
  redis.call('HSET', key, self, encode_lease(l))
  last = math.max(last, expiry)
  if drain > 0 and granted > 0 and h.pool ~= nil then
    -- Moved, not copied: the pool keeps what is left, refilling from its
    -- last time as before.
    local a, b = string.match(h.pool, '^(%S+) (%S+)$')
    local tokens, at = tonumber(a), tonumber(b)
    if tokens ~= nil and at ~= nil then
      -- At most the grant's part of drain (the lease's burst), so that
      -- the pool keeps what the lease could not hold.
      local part = drain * granted / rate
      if burst ~= nil and burst > 0 then part = drain * granted_b / burst end
      drained = math.max(0, math.min(math.floor(part + 1e-9), math.floor(tokens)))
      if drained > 0 then
        redis.call('HSET', key, 'p', string.format('%.17g %d', tokens - drained, at))
      end
    end
  end
end
if lost ~= nil then last = math.max(last, lost) end
if h.pool ~= nil then
  -- exact.lua keeps the pool until it would be full again.
  local pttl = redis.call('PTTL', key)
  if pttl > 0 then last = math.max(last, now + pttl * 1000) end
end
expire_at(key, last, now)

local contended, is_lost = '0', '0'
if demand > rate then contended = '1' end
if lost ~= nil then is_lost = '1' end
return {
  string.format('%.17g', granted),
  string.format('%.17g', fair),
  string.format('%.17g', demand),
  contended,
  string.format('%d', expiry),
  is_lost,
  string.format('%d', expiry - now),
  string.format('%d', unrecorded),
  string.format('%d', drained),
  string.format('%.17g', granted_b),
}
