-- The placement hash of one (limit, key), version 3 (Store.RecordKey): the
-- helpers of ask.lua and take.lua, which are run with this file prepended.
--
-- Fields:
--   "i:<instance>"  the instance's record, one of
--     "L gen granted want expiry_us claim claim_until_us born_us
--      credit credit_end_us credit_id"
--                   a lease: the instance may admit granted tokens/s until
--                   expiry_us, and said it runs claim tokens/s until
--                   claim_until_us (what it runs until it hears the answer
--                   of the ask that wrote the record). It holds the larger
--                   of the two while each lasts (holds), and the same part
--                   of the burst, burst * holds / rate. Its want counts as
--                   demand while expiry_us is ahead;
--     "X gen demand at_us asked expiry_us born_us credit credit_end_us
--      credit_id"
--                   an exact user: it runs nothing locally and takes each
--                   decision from the pool (take.lua), so it holds 0.
--                   demand is in tokens/s at at_us, decayed over
--                   demand_tau (decayed); it counts as the instance's want
--                   in the lease grants, so that they leave the pool what
--                   its users need. asked is the instance's cumulative
--                   count of the tokens asked for on the key, as of its
--                   latest take that wrote the record;
--                   gen (1 to 255) is the instance's placement generation,
--                   bumped at every change of placement; see newer;
--                   born_us is when the instance's demand on the key
--                   began: its first record, kept by every record that
--                   replaces one of the same instance's. A record younger
--                   than the ask's young_us (ask.lua) does not cut the
--                   other leases' fair shares: a pulse that may end before
--                   a cut lands takes only what is free;
--                   credit is the tokens take.lua last handed the
--                   instance ahead of its next requests, which it may
--                   admit locally until credit_end_us; credit_id names
--                   them (their hand-out time modulo 2^32). A credit is
--                   live until it ends, or until a take of the instance
--                   names it (it is spent), and carried over by every
--                   record of the instance that replaces this one. Live
--                   credits are tokens out of the pool: see pool_at;
--   "p"             the pool, a token bucket "tokens last_us". A missing
--                   pool is full;
--   "lost"          "until_us known": Redis lost records that instances may
--                   run until until_us; known is the sum of the grants the
--                   instances said they ran when they found their records
--                   gone (ask.lua): of what ran before the loss, only that
--                   is known. Until until_us, grants and the pool together
--                   hold at most known (see capacity): they grow only into
--                   what those instances gave up since (ask.lua);
--   "q"             "at_us instance": the latest turn handed out (take.lua).
-- Records are live until they end (record_end), and deleted once they
-- have; so are fields that cannot be read.
--
-- The pool is the part of the rate and burst that no lease holds: a
-- fraction f = clamp(1 - H/rate, 0, 1) of both, H being what all the lease
-- records hold; while lost, at most what known leaves (capacity)
-- (pool_frac). Nobody without a record runs anything, so Redis counts every
-- instance at what it may be running: the sum of what the lease records
-- hold and of the pool's rate is at most the rate, and the same of the
-- burst. The pool and the live credits together hold at most the pool's
-- burst (pool_cap), and a grant leaves the pool room for the other
-- instances' live credits beyond their leases' parts of the burst
-- (credit_beyond_others, ask.lua).
--
-- Redis runs this as Lua 5.1 and forbids globals: every name is local.

-- demand_tau is the time constant, in microseconds, over which an exact
-- user's demand forgets its past takes.
local demand_tau = 1000000

-- eps forgives the rounding errors of fractions of the rate.
local eps = 1e-9

-- num is s as a finite number, or nil: tonumber also reads "nan" and "inf".
local function num(s)
  local x = tonumber(s)
  if x == nil or x ~= x or x == math.huge or x == -math.huge then return nil end
  return x
end

-- gen_of is s as a generation, an integer from 1 to 255, or nil.
local function gen_of(s)
  local g = num(s)
  if g == nil or g < 1 or g > 255 or g ~= math.floor(g) then return nil end
  return g
end

-- newer reports whether generation a is newer than b, in serial number
-- arithmetic modulo 256 (RFC 1982): a - b is 1 to 127 modulo 256. Lua's %
-- is floored, so a negative difference wraps.
local function newer(a, b)
  local d = (a - b) % 256
  return d >= 1 and d <= 127
end

-- decayed is demand d measured at at, decayed to now.
local function decayed(d, at, now)
  if now <= at then return d end
  return d * math.exp(-(now - at) / demand_tau)
end

-- decode reads a record: {kind = 'L', gen, granted, want, expiry, claim,
-- claim_until, born, credit, credit_end, credit_id} or {kind = 'X', gen,
-- demand, at, asked, expiry, born, credit, credit_end, credit_id}; nil if
-- it cannot be read. One anchored match a record: a take reads every
-- record of the hash, and splitting them word by word cost it more than
-- all the rest.
local function decode(v)
  local k, a, b, c, d, e, f, g, h, i, j = string.match(v,
    '^([LX]) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) ?(%S*)$')
  local r
  if k == 'L' and j ~= '' then
    r = {kind = 'L', gen = gen_of(a), granted = num(b), want = num(c),
      expiry = num(d), claim = num(e), claim_until = num(f), born = num(g),
      credit = num(h), credit_end = num(i), credit_id = num(j)}
    if not (r.granted and r.want and r.expiry and r.claim and r.claim_until
      and r.granted >= 0 and r.want >= 0 and r.claim >= 0) then return nil end
  elseif k == 'X' and j == '' then
    r = {kind = 'X', gen = gen_of(a), demand = num(b), at = num(c),
      asked = num(d), expiry = num(e), born = num(f),
      credit = num(g), credit_end = num(h), credit_id = num(i)}
    if not (r.demand and r.at and r.asked and r.expiry and r.demand >= 0 and r.asked >= 0) then return nil end
  else
    return nil
  end
  if r.gen and r.born and r.credit and r.credit_end and r.credit_id and r.credit >= 0 then return r end
  return nil
end

-- encode writes record r for decode.
local function encode(r)
  local c = string.format('%d %d %d', r.credit, r.credit_end, r.credit_id)
  if r.kind == 'L' then
    return string.format('L %d %.17g %.17g %d %.17g %d %d %s',
      r.gen, r.granted, r.want, r.expiry, r.claim, r.claim_until, r.born, c)
  end
  return string.format('X %d %.17g %d %.17g %d %d %s', r.gen, r.demand, r.at, r.asked, r.expiry, r.born, c)
end

-- credit_of is the live credit of record r (nil: none) at now, in tokens.
local function credit_of(r, now)
  if r == nil or not (r.credit_end > now) then return 0 end
  return r.credit
end

-- carry_credit gives record r the credit of record old (nil: none) that
-- is live at now, or none, and returns r.
local function carry_credit(r, old, now)
  r.credit, r.credit_end, r.credit_id = 0, 0, 0
  if credit_of(old, now) > 0 then
    r.credit, r.credit_end, r.credit_id = old.credit, old.credit_end, old.credit_id
  end
  return r
end

-- holds is the rate the instance of record r may be running at now: for a
-- lease its grant while the lease lives and its claim while that lasts,
-- whichever is larger; 0 for an exact user.
local function holds(r, now)
  if r.kind ~= 'L' then return 0 end
  local h = 0
  if r.expiry > now then h = r.granted end
  if r.claim_until > now and r.claim > h then h = r.claim end
  return h
end

-- record_end is when record r ends: a lease when its grant and its claim
-- both have, an exact user at its expiry; either not before its credit.
local function record_end(r)
  if r.kind == 'L' then return math.max(r.expiry, r.claim_until, r.credit_end) end
  return math.max(r.expiry, r.credit_end)
end

-- read_hash sorts out the fields of the hash at server time now for
-- instance inst. It returns a table of
--   dead    the fields to delete: ended records, unreadable fields;
--   own     this instance's live record, or nil;
--   leases  the other instances' live lease records;
--   exact   the other instances' live exact records;
--   pool    {tokens, last} as stored, or nil if there is none;
--   credits every readable record's credit {tokens, end_us}, this
--           instance's and ended records' included (see pool_at);
--   lost    until when Redis lost records, nil if it did not or that ended;
--   q_at, q_by  the latest turn and whose it is, nil if none or it passed.
-- With others_expiry, the other instances' exact records are read for
-- their ends and their credit alone (take.lua needs no more of them).
local function read_hash(fields, inst, now, others_expiry)
  local self = 'i:' .. inst
  local h = {dead = {}, leases = {}, exact = {}, credits = {}}
  for i = 1, #fields, 2 do
    local id, v = fields[i], fields[i + 1]
    local ok = true
    if id == 'p' then
      local a, b = string.match(v, '^(%S+) (%S+)$')
      local tokens, last = num(a), num(b)
      ok = tokens ~= nil and last ~= nil and tokens >= 0
      if ok then h.pool = {tokens = tokens, last = last} end
    elseif id == 'lost' then
      local a, b = string.match(v, '^(%S+) (%S+)$')
      local e, k = num(a), num(b)
      ok = e ~= nil and k ~= nil and e > now and k >= 0
      if ok then h.lost, h.known = e, k end
    elseif id == 'q' then
      local a, by = string.match(v, '^(%S+) (.+)$')
      local e = num(a)
      ok = e ~= nil and e > now
      if ok then h.q_at, h.q_by = e, by end
    elseif string.sub(id, 1, 2) == 'i:' then
      local r
      if others_expiry and id ~= self and string.sub(v, 1, 2) == 'X ' then
        -- Of another instance's exact record, only its ends and its
        -- credit are needed: one whose fields read is kept as it is until
        -- an ask reads it whole (and deletes it if it cannot).
        local e, c, ce = string.match(v, '^X %S+ %S+ %S+ %S+ (%S+) %S+ (%S+) (%S+)')
        e, c, ce = num(e), num(c), num(ce)
        if e and c and ce and c >= 0 then r = {kind = 'X', expiry = e, credit = c, credit_end = ce} end
      else
        r = decode(v)
      end
      if r ~= nil and r.credit > 0 then h.credits[#h.credits + 1] = {r.credit, r.credit_end} end
      ok = r ~= nil and record_end(r) > now
      if not ok then
        -- dead
      elseif id == self then
        h.own = r
      elseif r.kind == 'L' then
        h.leases[#h.leases + 1] = r
      else
        h.exact[#h.exact + 1] = r
      end
    else
      ok = false
    end
    if not ok then h.dead[#h.dead + 1] = id end
  end
  return h
end

-- held_by_others is what the other instances' lease records of h hold at
-- now.
local function held_by_others(h, now)
  local s = 0
  for _, l in ipairs(h.leases) do s = s + holds(l, now) end
  return s
end

-- capacity is how much of the rate grants and the pool may hold beyond
-- held, what the lease records hold, while Redis has lost records: what
-- the known grants of before the loss (known) leave. Leases of before the
-- loss that no instance has claimed since may still run: they and the
-- lost pool held at most the rate less known.
local function capacity(held, known)
  return math.max(0, known - held)
end

-- pool_frac is the fraction of the rate and of the burst that the pool
-- holds when the lease records hold held in all, and lost is until when
-- Redis lost records (nil: it did not), known what was claimed of them:
-- while lost, at most what known leaves (capacity), since the leases Redis
-- forgot that no instance has claimed may still run.
local function pool_frac(held, rate, lost, known)
  local f = math.max(0, math.min(1, 1 - held / rate))
  if lost ~= nil then f = math.min(f, capacity(held, known) / rate) end
  return f
end

-- credits_after is the sum of the credits (as read_hash lists them) that
-- are live at t: that end after it.
local function credits_after(credits, t)
  local s = 0
  for _, c in ipairs(credits) do
    if c[2] > t then s = s + c[1] end
  end
  return s
end

-- credit_beyond_others is the other instances' live credit at now beyond
-- their leases' parts of the burst (a lease's bucket starts from what is
-- left of its credit: the two are never both spent); an exact record's
-- counts whole.
local function credit_beyond_others(h, now, rate, burst)
  local s = 0
  for _, l in ipairs(h.leases) do s = s + math.max(0, credit_of(l, now) - burst * holds(l, now) / rate) end
  for _, x in ipairs(h.exact) do s = s + credit_of(x, now) end
  return s
end

-- pool_cap is what the pool may hold at t, at a fraction f of burst: its
-- burst less the credits live at t, which are tokens out of it.
local function pool_cap(burst, f, credits, t)
  return math.max(0, burst * f - credits_after(credits, t))
end

-- pool_at is what pool p (nil: none, which is full) holds at now, refilled
-- since it was stored at a fraction f of rate, up to that fraction of
-- burst less the live credits (pool_cap). Every credit was handed at or
-- before the pool's last write, so the cap only rises since, as credits
-- end: the pool refills piecewise across their ends, never jumps. The
-- server clock may step back after a failover: it never refills
-- negatively.
local function pool_at(p, now, rate, burst, f, credits)
  if p == nil then return pool_cap(burst, f, credits, now) end
  local ends = {}
  for _, c in ipairs(credits) do
    if c[2] > p.last and c[2] < now then ends[#ends + 1] = c[2] end
  end
  table.sort(ends)
  local t, tokens = p.last, p.tokens
  for _, e in ipairs(ends) do
    tokens = math.min(tokens + (e - t) * rate * f / 1000000, pool_cap(burst, f, credits, t))
    t = e
  end
  return math.min(tokens + math.max(0, now - t) * rate * f / 1000000, pool_cap(burst, f, credits, now))
end

-- water_fill is the max-min fair split of rate over wants, which it sorts:
-- the smallest wants are served first. It returns the demand (the sum of
-- the wants), the level every want that does not fit is capped at (nil
-- when the demand does not exceed the rate: the key is uncontended) and
-- what the wants leave of the rate (0 when contended).
local function water_fill(wants, rate)
  table.sort(wants)
  local demand = 0
  for i = 1, #wants do demand = demand + wants[i] end
  if demand <= rate then return demand, nil, rate - demand end
  local left = rate
  for i = 1, #wants do
    local share = left / (#wants - i + 1)
    if wants[i] > share then return demand, share, 0 end
    left = left - wants[i]
  end
  return demand, wants[#wants], 0 -- reached by rounding alone
end

-- hdel deletes the fields ids of key, in chunks: unpack is limited by the
-- Lua stack.
local function hdel(key, ids)
  for i = 1, #ids, 1000 do
    redis.call('HDEL', key, unpack(ids, i, math.min(i + 999, #ids)))
  end
end

-- expire_hash makes key live until last (us), the end of its latest record,
-- "lost" or "q", and until its pool would be full again: tokens (nil: no
-- pool, which is full) refill at the full rate to the full burst at the
-- latest once lease_last, the end of the latest lease record, credit and
-- "lost", has passed. A hash with nothing left to keep is deleted.
local function expire_hash(key, now, last, lease_last, tokens, burst, rate)
  if tokens ~= nil and tokens < burst then
    last = math.max(last, math.max(now, lease_last) + math.ceil((burst - tokens) * 1000000 / rate))
  end
  if last > now then
    -- Absolute and rounded up, so that the hash lives until last: a
    -- relative PEXPIRE counts from Redis's clock in whole milliseconds,
    -- rounded down. At most about two centuries ahead, so that the
    -- milliseconds stay exact.
    local at = math.ceil(math.min(last, now + 7e15) / 1000)
    redis.call('PEXPIREAT', key, string.format('%d', at))
  else
    redis.call('DEL', key)
  end
end

-- hash_ends is (last, lease_last) for expire_hash: the ends of the records
-- of h other than this instance's, of mine (this instance's record as the
-- script leaves it, nil: none), of "lost" (lost) and of "q"; the ends of
-- their credits count in lease_last, since the pool's burst grows back
-- only as they end.
local function hash_ends(h, mine, lost, now)
  local last, lease_last = now, now
  for _, l in ipairs(h.leases) do
    last = math.max(last, record_end(l))
    lease_last = math.max(lease_last, record_end(l))
  end
  for _, x in ipairs(h.exact) do
    last = math.max(last, record_end(x))
    lease_last = math.max(lease_last, x.credit_end)
  end
  if mine ~= nil then
    last = math.max(last, record_end(mine))
    lease_last = math.max(lease_last, mine.credit_end)
    if mine.kind == 'L' then lease_last = math.max(lease_last, record_end(mine)) end
  end
  if lost ~= nil then
    last = math.max(last, lost)
    lease_last = math.max(lease_last, lost)
  end
  if h.q_at ~= nil then last = math.max(last, h.q_at) end
  return last, lease_last
end
