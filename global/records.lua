-- The records of a key's lease hash, shared by lease.lua and exact.lua: the
-- Go side prepends this file to each of them.
--
-- The hash of one (limit, key) holds, at server time now (microseconds):
--   "i:<instance>"  a rate lease: "granted want expiry_us", or "granted
--                   want expiry_us running running_until_us" when the
--                   instance said it was running a grant until then, or
--                   those five and "young_want" when its demand above
--                   what it holds is young (lease.lua's ARGV[12]): want
--                   is then what it holds, young_want what it wants;
--                   any of these may end in " | granted_b want_b
--                   running_b": the part of the burst it was granted,
--                   wanted, and said it ran until running_until_us
--                   (lease.lua's ARGV[14]). A record without them holds
--                   the burst in proportion to its rate;
--   "x:<instance>"  an exact user, which decides each request against the
--                   pool and runs nothing locally: "expiry_us clean_us
--                   demand demand_us", where clean_us (0: none) is until
--                   when leases granted while the instance was counted
--                   below its default share (before it became exact) may
--                   run: a release of the record lets it run its default
--                   share only then; and demand is the tokens per second
--                   its takes asked for, decayed exponentially over
--                   demand_tau to demand_us (see exact_counted). Older
--                   records hold "expiry_us" or "expiry_us clean_us", and
--                   no demand;
--   "w:<instance>"  "back_us": the instance released a record that counted
--                   it below its default share, and may run that share
--                   only from back_us on (lease.lua's release); an exact
--                   record it takes before then keeps back_us as its
--                   clean_us;
--   "c:<instance>"  credit: tokens an exact user took from the pool ahead
--                   of its requests, which it may admit locally until
--                   then: "tokens until_us". Counted against the pool's
--                   burst until then, whatever record the instance holds;
--   "p"             the pool, a token bucket: "tokens last_us";
--   "lost"          until when (us) Redis is known to have lost leases
--                   that instances may still run (see lease.lua);
--   "q"             the latest turn exact.lua handed out: "at_us
--                   instance", when that instance may ask again.
-- A live instance with neither an "i:" nor an "x:" record is "unrecorded":
-- it may be running its default share, rate/n, and is counted so.
--
-- Redis runs this as Lua 5.1 and forbids globals: every name is local.

-- demand_tau is the time constant, in microseconds, over which an exact
-- user's demand forgets its past takes.
local demand_tau = 1000000

-- exact_headroom is how much more than its measured demand an exact user
-- of a limit with exact bursts is counted at, and exact_floor the least
-- part of its default share it is counted at (see exact_counted).
local exact_headroom = 1.2
local exact_floor = 0.05

-- decayed is demand d measured at at, decayed to now.
local function decayed(d, at, now)
  if now <= at then return d end
  return d * math.exp(-(now - at) / demand_tau)
end

-- exact_counted is the rate an exact user whose demand is d (nil: not
-- measured, an older record) is counted at by the lease grants of a limit
-- with exact bursts, share being its default share: its demand with
-- headroom, at least exact_floor of that share and at most all of it.
-- An exact user runs nothing locally; it takes from the pool, which is
-- what the leases leave, so what it is counted at only sets how much of
-- the rate the leases leave to the pool. With exact bursts no instance
-- runs its default share unasked, so an exact user counted below it never
-- runs more than it is counted at, even once its record is gone. With split
-- bursts an exact user is counted at its default share, which it may run
-- once its record is released.
local function exact_counted(d, share)
  if d == nil then return share end
  return math.min(share, math.max(exact_headroom * d, exact_floor * share))
end

-- decode_lease reads an "i:<instance>" value, in any format, into
-- {granted, want, expiry, running, running_until, young_want}; nil if it
-- is unreadable. A record without a running grant says it runs 0 until 0;
-- young_want is nil unless the record has one.
local function decode_lease(v)
  local gb, wb, rb
  local head, tail = string.match(v, '^(.-) | (.+)$')
  if head then
    gb, wb, rb = string.match(tail, '^(%S+) (%S+) (%S+)$')
    if not gb then return nil end
    gb, wb, rb = tonumber(gb), tonumber(wb), tonumber(rb)
    if not gb or not wb or not rb then return nil end
    v = head
  end
  local g, w, e, rg, re, yw = string.match(v, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
  if g then
    yw = tonumber(yw)
    if not yw then return nil end
  else
    g, w, e, rg, re = string.match(v, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
  end
  if not g then
    g, w, e = string.match(v, '^(%S+) (%S+) (%S+)$')
    rg, re = '0', '0'
  end
  g, w, e, rg, re = tonumber(g), tonumber(w), tonumber(e), tonumber(rg), tonumber(re)
  if not g or not w or not e or not rg or not re then
    return nil
  end
  return {granted = g, want = w, expiry = e, running = rg, running_until = re, young_want = yw,
    granted_b = gb, want_b = wb, running_b = rb}
end

-- decode_exact reads an "x:<instance>" value, in any format, into
-- expiry_us, clean_us (nil if none) and demand and demand_us (nil if
-- none); expiry_us is nil if the value is unreadable.
local function decode_exact(v)
  local a, c, d, at = string.match(v, '^(%S+) (%S+) (%S+) (%S+)$')
  if not a then
    a, c = string.match(v, '^(%S+) (%S+)$')
    if not a then a = v end
  end
  local e = tonumber(a)
  if c ~= nil then
    c = tonumber(c)
    if c == nil then return nil end
    if c == 0 then c = nil end
  end
  if d ~= nil then
    d, at = tonumber(d), tonumber(at)
    if d == nil or at == nil or d < 0 then return nil end
  end
  return e, c, d, at
end

-- encode_exact writes an "x:<instance>" value for decode_exact.
local function encode_exact(expiry, clean, d, at)
  return string.format('%d %d %.17g %d', expiry, clean or 0, d, at)
end

-- encode_lease_rate writes the fields of lease l before its burst.
local function encode_lease_rate(l)
  if l.young_want ~= nil then
    return string.format('%.17g %.17g %d %.17g %d %.17g',
      l.granted, l.want, l.expiry, l.running or 0, l.running_until or 0, l.young_want)
  end
  if l.running_until == nil then
    return string.format('%.17g %.17g %d', l.granted, l.want, l.expiry)
  end
  return string.format('%.17g %.17g %d %.17g %d',
    l.granted, l.want, l.expiry, l.running, l.running_until)
end

-- encode_lease writes a lease for decode_lease: six fields if it has a
-- young_want, five if it has a running_until, three if neither; and its
-- burst fields after them if it has a granted_b.
local function encode_lease(l)
  local v = encode_lease_rate(l)
  if l.granted_b == nil then return v end
  return string.format('%s | %.17g %.17g %.17g', v, l.granted_b, l.want_b, l.running_b or 0)
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

-- holds_burst is the part of the burst the instance of lease l may hold
-- at now, burst and rate being the limit's: what it was granted while the
-- lease lives, and the larger part it said it ran, until that ends; a
-- record without burst fields holds the burst in proportion to holds.
local function holds_burst(l, now, burst, rate)
  if l.granted_b == nil then
    if rate > 0 then return burst * holds(l, now) / rate end
    return 0
  end
  local b = 0
  if l.expiry > now then b = l.granted_b end
  if l.running_until > now and l.running_b > b then b = l.running_b end
  return b
end

-- lease_end is when lease l stops counting: when both its grant and the
-- grant it said it was running have ended.
local function lease_end(l)
  return math.max(l.expiry, l.running_until)
end

-- above_end is when lease l stops holding more than share, the default
-- share, and more than part, the default part of the burst (nil when the
-- burst is not counted apart): when its grant ends if that is more, and
-- when the running claim ends if that is more. A record without burst
-- fields holds the burst in proportion to its rate, above part exactly
-- when its rate is above share.
local function above_end(l, share, part)
  local e = 0
  local eps = 1e-9
  if l.granted > share + eps then e = math.max(e, l.expiry) end
  if l.running > share + eps then e = math.max(e, l.running_until) end
  if part ~= nil and l.granted_b ~= nil then
    if l.granted_b > part + eps then e = math.max(e, l.expiry) end
    if l.running_b > part + eps then e = math.max(e, l.running_until) end
  end
  return e
end

-- read_hash sorts out the fields of the lease hash at server time now, for
-- instance inst, of a limit of rate and burst (nil: not counted apart) over n
-- instances. It returns a table of
--   dead      the fields to delete: ended or unreadable records, fields of
--             older versions ("born", "r:<instance>") and unknown ones;
--   wants     the wants of the other instances whose grant lives;
--   young     how much more than those wants the young ones among them
--             want (see records with a young_want);
--   others    what the other instances' leases may be running (see holds);
--   others_b  ... and the parts of the burst they may hold (holds_burst),
--             when read_hash is given burst (else 0);
--   wants_b   the burst parts the others whose grant lives want (their
--             want_b, or their want's part of the burst), when given burst;
--   exact     how many other instances have a live "x:" record;
--   exact_d   the demand of each of them decayed to now, false for a
--             record without one (see exact_counted);
--   recorded  how many other instances have a live "i:" or "x:" record:
--             the others of the n live instances are unrecorded;
--   last      when the latest of the others' records and "lost" ends, or 0;
--   above_end when the others' leases stop holding more than their
--             default share (rate/n) or more than their default part of the
--             burst (burst/n), or 0: until then they may have been granted
--             what an instance counted below its default share did not
--             hold;
--   own       this instance's live lease (decoded), or nil;
--   own_x     when this instance's live "x:" record ends, or nil;
--   own_x_clean ... and its clean_us, or nil if it has none;
--   own_x_d   ... and its demand decayed to now, or nil if it has none;
--   own_w     this instance's live "w:" record (back_us), or nil;
--   credits   the live credit of every instance, this one's included;
--   own_c     this instance's live credit {tokens, ends}, or nil;
--   lost      until when Redis lost leases, nil if it did not or that ended;
--   pool      the pool's value, nil if there is none;
--   queue     the "q" field's time, nil if there is none or it has passed;
--   queue_by  the instance that turn is for.
local function read_hash(fields, inst, now, burst, rate, n)
  local self, self_x, self_c = 'i:' .. inst, 'x:' .. inst, 'c:' .. inst
  local share, part = rate / n, nil
  if burst ~= nil then part = burst / n end
  local h = {dead = {}, wants = {}, young = 0, others = 0, exact = 0, exact_d = {}, recorded = 0,
    others_b = 0, wants_b = {},
    last = 0, above_end = 0, own = nil, own_x = nil, lost = nil, pool = nil,
    credits = 0, own_c = nil}
  local seen = {} -- other instances with a live record, by id
  for i = 1, #fields, 2 do
    local id, v = fields[i], fields[i + 1]
    local kind, who = string.sub(id, 1, 2), string.sub(id, 3)
    if id == 'p' then
      h.pool = v
    elseif id == 'q' then
      local a, by = string.match(v, '^(%d+) (.+)$')
      local e = tonumber(a)
      if not e or e <= now then
        h.dead[#h.dead + 1] = id
      else
        h.queue, h.queue_by = e, by
      end
    elseif id == 'lost' then
      local e = tonumber(v)
      if not e or e <= now then
        h.dead[#h.dead + 1] = id
      else
        h.lost = e
        h.last = math.max(h.last, e)
      end
    elseif kind == 'w:' then
      local e = tonumber(v)
      if not e or e <= now then
        h.dead[#h.dead + 1] = id
      else
        if who == inst then h.own_w = e end
        h.last = math.max(h.last, e)
      end
    elseif kind == 'x:' then
      local e, c, d, at = decode_exact(v)
      if not e or e <= now then
        h.dead[#h.dead + 1] = id
      elseif id == self_x then
        h.own_x = e
        if c ~= nil and c > now then h.own_x_clean = c end
        if d ~= nil then h.own_x_d = decayed(d, at, now) end
      else
        h.exact = h.exact + 1
        h.exact_d[#h.exact_d + 1] = (d ~= nil and decayed(d, at, now)) or false
        if not seen[who] then seen[who] = true; h.recorded = h.recorded + 1 end
        h.last = math.max(h.last, e)
      end
    elseif kind == 'c:' then
      local c, e = string.match(v, '^(%S+) (%S+)$')
      c, e = tonumber(c), tonumber(e)
      if not c or not e or e <= now then
        h.dead[#h.dead + 1] = id
      else
        h.credits = h.credits + c
        h.last = math.max(h.last, e)
        if id == self_c then h.own_c = {tokens = c, ends = e} end
      end
    elseif kind == 'i:' then
      local l = decode_lease(v)
      if not l or lease_end(l) <= now then
        h.dead[#h.dead + 1] = id
      elseif id == self then
        h.own = l
      else
        if l.expiry > now then
          h.wants[#h.wants + 1] = l.want
          if l.young_want ~= nil and l.young_want > l.want then
            h.young = h.young + l.young_want - l.want
          end
          if burst ~= nil then
            local wb = l.want_b
            if wb == nil then
              wb = 0
              if rate > 0 then wb = burst * l.want / rate end
            end
            h.wants_b[#h.wants_b + 1] = wb
          end
        end
        h.others = h.others + holds(l, now)
        if burst ~= nil then h.others_b = h.others_b + holds_burst(l, now, burst, rate) end
        if not seen[who] then seen[who] = true; h.recorded = h.recorded + 1 end
        h.last = math.max(h.last, lease_end(l))
        h.above_end = math.max(h.above_end, above_end(l, share, part))
      end
    else
      h.dead[#h.dead + 1] = id
    end
  end
  return h
end

-- hdel deletes the fields ids of key, in chunks: unpack is limited by the
-- Lua stack.
local function hdel(key, ids)
  for i = 1, #ids, 1000 do
    redis.call('HDEL', key, unpack(ids, i, math.min(i + 999, #ids)))
  end
end

-- expire_at makes key live until last (us), or deletes it if that has
-- passed: the hash vanishes with its last record.
local function expire_at(key, last, now)
  if last > now then
    -- At most about two centuries, so that the milliseconds stay exact.
    local ms = math.ceil(math.min(last - now, 7e15) / 1000)
    redis.call('PEXPIRE', key, string.format('%d', ms))
  else
    redis.call('DEL', key)
  end
end
