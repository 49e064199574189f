package placement

import (
	"math"
	"time"
)

// instant is a time as nanoseconds since the policy's epoch, the first time
// it was handed: 8 bytes where a time.Time takes 24, for every key.
type instant int64

func (p *Policy) instant(t time.Time) instant {
	if p.epoch.IsZero() {
		p.epoch = t
	}
	return instant(t.Sub(p.epoch))
}

func (p *Policy) time(a instant) time.Time { return p.epoch.Add(time.Duration(a)) }

func (a instant) add(d time.Duration) instant { return a + instant(d) }

func (a instant) sub(b instant) time.Duration { return time.Duration(a - b) }

// Step looks at one key at a tick at now, n being N-hat (the largest
// instance count seen lately), and appends to out what the caller must do
// for it. g, if not nil, gathers the gauges.
func (p *Policy) Step(now time.Time, n int, st *Stats, out []Out, g *Gauges) []Out {
	t := p.instant(now)
	k := p.track(t, n, st)
	if k == nil {
		return out
	}
	if k.state == Leased && t >= k.until.at(t) {
		// The grant ran out before a renewal was answered: the local
		// limiter has marked the key already (Assign's Gen).
		out = p.toExact(k, st.Key, out)
		if g != nil {
			g.Expired++
		}
	}
	idle := now.Sub(st.LastSeen) >= p.cfg.UncontendedTTL/RenewDivisor
	switch k.state {
	case Exact:
		return p.stepExact(t, n, st.Key, k, idle, out)
	case Asking:
		return p.stepAsking(t, n, st.Key, k, idle, out)
	}
	if g != nil {
		g.Leased += k.granted
		if k.contended() {
			g.Contended++
		}
	}
	switch {
	case idle || !p.worth(k.demand, p.fairOf(k, n), p.ttlOf(k.ttl), LeaveBurst, LeaveRenewal):
		// Exact first, then the release: the key runs nothing locally
		// by the time its record goes.
		out = p.toExact(k, st.Key, out)
		if !p.degraded {
			out = append(out, released(t, st.Key, k))
		}
	case !p.degraded && (t >= k.renewAt.at(t) || p.early(t, k)):
		out = append(out, p.ask(t, st.Key, k, false))
	}
	return out
}

// stepExact is Step for a key decided exactly: it asks for a lease once
// worth one. A key whose traffic just fell releases its exact record, whose
// demand Redis would otherwise count, decaying, for a second or more: a
// pulse that ended must not cut the others' leases.
func (p *Policy) stepExact(t instant, n int, name string, k *key, idle bool, out []Out) []Out {
	switch {
	case p.degraded:
	case k.fell():
		out = append(out, released(t, name, k))
	case !idle && t >= k.renewAt.at(t) && p.worth(k.demand, p.fairOf(k, n), p.cfg.ContendedTTL, EnterBurst, EnterRenewal):
		k.state, k.ttl = Asking, 0
		k.setStable(0)
		out = append(out, p.ask(t, name, k, true))
	}
	return out
}

// stepAsking is Step for a key whose last ask got no answer, or a grant
// too small to run while others hold more than their fair shares: it asks
// again when due, or gives up if its traffic fell or it is no longer worth
// a lease, releasing the record its asks left (its want is gone) once it
// is exact.
func (p *Policy) stepAsking(t instant, n int, name string, k *key, idle bool, out []Out) []Out {
	switch {
	case p.degraded:
	case k.fell() || idle || !p.worth(k.demand, p.fairOf(k, n), p.cfg.ContendedTTL, LeaveBurst, LeaveRenewal):
		out = p.toExact(k, name, out)
		out = append(out, released(t, name, k))
	case t >= k.renewAt.at(t):
		out = append(out, p.ask(t, name, k, true))
	}
	return out
}

// track returns the state of st's key at t with its demand measured, or
// nil for a key in its first exact placement that is not worth a lease:
// the policy remembers nothing of it until it is, and its demand is its
// life's.
func (p *Policy) track(t instant, n int, st *Stats) *key {
	if k := p.keys.get(st.Key); k != nil {
		k.observe(t, st.Asked, p.cfg.ContendedTTL)
		k.ageClocks(t)
		return k
	}
	d := lifeDemand(t, p.instant(st.Created), st.Asked, p.cfg.Tick)
	if p.degraded || st.Asked < MinTokens || !p.worth(d, p.cfg.Rate/float64(max(n, 1)), p.cfg.ContendedTTL, EnterBurst, EnterRenewal) {
		return nil
	}
	// Its clocks start at the epoch, as if it had asked then, or as long
	// before t as they are kept (see ageClocks).
	c := floorClock(max(t.add(-clockAge), 0))
	k := p.keys.put(st.Key)
	k.state, k.gen, k.demand, k.now, k.asked, k.seenAt = Exact, FirstGen, d, d, uint32(st.Asked), t
	k.until, k.renewAt, k.sentAt = c, c, c
	p.peak = max(p.peak, p.keys.Len())
	return k
}

// worth reports whether a lease is worth having for a key whose demand here
// is d and whose fair share is fair, for leases of lifetime ttl: the part
// of the burst the lease would hold at the larger of its demand and its
// fair share is at least burstAt tokens (a key that wants more than its
// share is saturated, and a lease admits as well as the pool would), and
// the demand fills at least renewalAt tokens per renewal period.
func (p *Policy) worth(d, fair float64, ttl time.Duration, burstAt, renewalAt float64) bool {
	b := float64(p.cfg.Burst) * math.Min(math.Max(d, fair), p.cfg.Rate) / p.cfg.Rate
	perRenewal := d * (ttl / RenewDivisor).Seconds()
	return b >= burstAt && perRenewal >= renewalAt
}

// fairOf is the key's fair share as Redis last said, or rate/n before it
// has.
func (p *Policy) fairOf(k *key, n int) float64 {
	if k.fair > 0 {
		return float64(k.fair)
	}
	return p.cfg.Rate / float64(max(n, 1))
}

// early reports whether a leased key's demand moved enough since its last
// ask to renew before its time (see Shrink, Grow).
func (p *Policy) early(t instant, k *key) bool {
	if t.sub(k.sentAt.at(t)) < EarlyTicks*p.cfg.Tick {
		return false
	}
	w := p.want(k.now)
	if !k.contended() {
		// What it holds above its want is surplus nobody asked for:
		// nothing to free.
		return w > k.granted
	}
	// A want that grew may get more; a grant it no longer uses goes to
	// the others.
	return w < k.granted*Shrink || w > float64(k.want)*Grow
}

// want is what a key of demand d asks for.
func (p *Policy) want(d float64) float64 {
	return math.Max(d*Headroom, p.cfg.Rate*MinWantFraction)
}

// ask is the ask of key k at t: for a lease from the exact placement
// (drain: the lease takes its part of the pool's tokens), or a renewal,
// which says what the key runs until it hears the answer.
func (p *Policy) ask(t instant, name string, k *key, drain bool) Out {
	// Every ask has a generation of its own, two past the last: an ask
	// that Redis runs after a later one is stale there, and the mark a
	// grant ends into (the one after its ask's) is never an ask's.
	k.gen = NextGen(NextGen(k.gen))
	want := p.want(k.now)
	k.want, k.sentAt = float32(want), floorClock(t)
	o := Out{Kind: Ask, Key: name, Gen: k.gen, Want: want, TTL: p.ttlOf(k.ttl), Drain: drain}
	until := k.until.at(t)
	if k.state == Leased && until > t {
		o.Running, o.RunningFor = k.granted, until.sub(t)
	}
	o.Recorded = until > t
	return o
}

// released is the release of key name's record at t: from then on the key
// has none in Redis (see Out.Recorded).
func released(t instant, name string, k *key) Out {
	k.until = floorClock(t)
	return Out{Kind: Release, Key: name, Gen: k.gen}
}

// toExact moves k to the exact placement under a new generation, so that
// its takes replace whatever record an earlier one left in Redis. A key
// that leaves a lease or a failed ask waits a renewal period before it
// asks again.
func (p *Policy) toExact(k *key, name string, out []Out) []Out {
	if k.state != Exact {
		// For a lease, the mark its Assign gave the grant's end.
		k.gen = NextGen(k.gen)
	}
	k.state, k.granted = Exact, 0
	k.setStable(0)
	k.renewAt = floorClock(k.sentAt.at(k.seenAt).add(p.cfg.ContendedTTL / RenewDivisor))
	return append(out, Out{Kind: Mark, Key: name, Gen: k.gen})
}

// observe updates k's demand and its demand now with the tokens asked for
// since it was last updated. Both are exponentially weighted averages of
// the rates between looks, weighted by how long each lasted, over tau;
// when the last two looks saw the traffic rise far above either (see
// RiseAbove), that one becomes what they saw; when they saw it fall far
// below the demand now (see FallBelow), the demand now does, which its
// wants ask for from then on, while whether it is worth a lease still goes
// by the demand, so that clumps a few ticks apart keep their lease.
func (k *key) observe(t instant, asked int64, tau time.Duration) {
	dt := t.sub(k.seenAt)
	if dt <= 0 {
		return
	}
	// The tokens since the last update: Stats.Asked only grows.
	d := int64(uint32(asked) - k.asked)
	rate := float64(d) / dt.Seconds()
	a := math.Exp(-float64(dt) / float64(tau))
	k.demand = k.demand*a + rate*(1-a)
	k.now = k.now*a + rate*(1-a)
	k.setFell(false)
	if k.gap0 != 0 {
		span := dt + time.Duration(k.gap0)
		// Each average is judged against the tokens it would have
		// brought: a clump after a quiet spell raises the demand now,
		// not the demand, unless it is far above the demand too.
		saw, seen := float64(d+int64(k.asked0)), span.Seconds()
		if saw >= FallTokens && saw > RiseAbove*k.demand*seen {
			k.demand = saw / seen
		}
		expected := k.now * seen
		switch {
		case saw >= FallTokens && saw > RiseAbove*expected:
			k.now = saw / seen
		case expected >= FallTokens && saw < FallBelow*expected:
			k.now = saw / seen
			k.setFell(true)
		}
	}
	k.asked0, k.gap0 = uint32(d), 0
	if k.seenAt != 0 && dt <= math.MaxUint32 {
		k.gap0 = uint32(dt)
	}
	k.asked, k.seenAt = uint32(asked), t
}

// lifeDemand is the demand of a key first decided at created that asked
// for asked tokens by t, measured over at least floor.
func lifeDemand(t, created instant, asked int64, floor time.Duration) float64 {
	span := max(t.sub(created), floor)
	return float64(asked) / span.Seconds()
}

// Answer hands the policy Redis's answer g to the Ask o, sent at sent, and
// appends what the caller must do.
func (p *Policy) Answer(sent time.Time, o *Out, g *Grant, out []Out) []Out {
	p.observeLag(sent, g.Answered)
	k := p.keys.get(o.Key)
	if k == nil || k.gen != o.Gen || k.state == Exact {
		return out // the key moved on while the ask was out
	}
	s := p.instant(sent)
	if !g.Stale {
		// The ask left a record, granted or not, that lives at least
		// this long: a later ask that finds none proves Redis lost it.
		k.until = ceilClock(s.add(time.Duration(float64(g.In) * EndEarly)))
	}
	burst := p.burstOf(g.Granted)
	if g.Stale || burst < 1 {
		k.fair = float32(g.Fair)
		if k.state == Asking && !g.Stale && p.burstOf(g.Fair) >= 1 {
			// Others hold more than their fair shares until they renew,
			// and the record this ask left shows them what this instance
			// wants: ask again as often as an early renewal may give
			// back what they hold above their shares (as a starved lease
			// does), deciding exactly meanwhile.
			k.renewAt = floorClock(p.afterTicks(s, EarlyTicks))
			return out
		}
		// No grant worth running: back to exact decisions, whose takes
		// replace the record this ask left.
		return p.toExact(k, o.Key, out)
	}
	if k.state == Leased && math.Abs(g.Granted-k.granted) <= SettledWithin*k.granted &&
		math.Abs(g.Demand-float64(k.total)) <= DemandWithin*float64(k.total) {
		k.setStable(k.stable() + 1)
	} else {
		// The grant moved, or the others' demand did: it may move
		// again soon, as a pulse elsewhere ends.
		k.setStable(0)
	}
	k.total = float32(g.Demand)
	shrank := k.state == Leased && g.Granted < k.granted*(1-SettledWithin)
	k.state, k.granted, k.fair = Leased, g.Granted, float32(g.Fair)
	k.setContended(g.Contended)
	until := s.add(time.Duration(float64(g.In) * EndEarly))
	// Half its lifetime, or a renewal as late as the lag lands too late.
	renewAt := max(s, min(s.add(g.In/RenewDivisor), until.add(-LagLead*p.lag)))
	switch {
	case shrank:
		// Redis counts the larger grant this ask said the key ran until
		// that grant ends: say at the next tick that it runs the smaller
		// one, so that what it gave up goes to the others at once.
		renewAt = p.afterTicks(s, 1)
	case g.Granted < math.Min(g.Fair, float64(k.want))*Starved:
		// Others hold more than their fair shares until they renew,
		// early when their traffic fell: ask again as often as an early
		// renewal may come, for what they give back.
		renewAt = min(renewAt, p.afterTicks(s, EarlyTicks))
	}
	k.until, k.renewAt = ceilClock(until), floorClock(renewAt)
	k.ttl = p.nextTTL(k)
	return append(out, Out{Kind: Assign, Key: o.Key, Gen: NextGen(k.gen), Rate: g.Granted, Burst: int(burst),
		Until: p.time(until), Give: g.Drained})
}

// afterTicks is a renewal time due at the n-th tick after s, the time of
// an ask, which a tick sent: half a tick before it, so that a tick that
// fires a hair early is not missed.
func (p *Policy) afterTicks(s instant, n int) instant {
	return s.add(time.Duration(n)*p.cfg.Tick - p.cfg.Tick/2)
}

// burstOf is the whole tokens of the burst that a grant of rate r holds.
func (p *Policy) burstOf(r float64) float64 {
	return math.Floor(float64(p.cfg.Burst)*r/p.cfg.Rate + 1e-9)
}

// nextTTL is the lifetime the key's next renewal asks for: UncontendedTTL
// for an uncontended key; for a contended one ContendedTTL until its lease
// has settled, then growing SettledGrowth times a renewal up to
// UncontendedTTL.
func (p *Policy) nextTTL(k *key) ttlStep {
	switch {
	case !k.contended():
		// Its grant leaves every other instance its share of what
		// nobody wants: a long lease keeps nobody waiting.
		return ttlLongest
	case k.stable() < SettleAfter-1:
		return 0
	}
	return p.grown(k.ttl)
}

// contendedTTL is the lifetime of a new or moving lease (step 0):
// ContendedTTL, or LagTTLs lags when answers come later than that allows,
// up to UncontendedTTL.
func (p *Policy) contendedTTL() time.Duration {
	return min(p.cfg.UncontendedTTL, max(p.cfg.ContendedTTL, LagTTLs*p.lag))
}

// observeLag keeps the lag of an answer handed in at answered to an ask
// sent at sent: the worst lately, decaying by LagDecay at each answer that
// came sooner.
func (p *Policy) observeLag(sent, answered time.Time) {
	lag := max(answered.Sub(sent), 0)
	if answered.IsZero() {
		lag = 0
	}
	p.lag = max(lag, time.Duration(float64(p.lag)*LagDecay))
}

// Failed tells the policy that the Ask o, sent at sent, got no answer: the
// key keeps what it runs and asks again at the next tick.
func (p *Policy) Failed(sent time.Time, o *Out) {
	if k := p.keys.get(o.Key); k != nil && k.gen == o.Gen && k.state != Exact {
		k.renewAt = floorClock(p.instant(sent)) // due again at once
	}
}

// Release returns the release of key's record when its limit is retired
// (removed, no longer Hybrid, or closed). mark is the key's mark in the
// local limiter: the generation of its exact decisions, or its lease's.
// The release's generation is newer than mark and than the key's last
// ask, even one whose answer never came (the loop stopped, or the pipeline
// failed after Redis ran it), so that Redis deletes whatever record the
// instance left.
func (p *Policy) Release(name string, mark uint8) Out {
	g := mark
	if k := p.keys.get(name); k != nil && newer(k.gen, g) {
		g = k.gen
	}
	return Out{Kind: Release, Key: name, Gen: NextGen(g)}
}

// newer reports whether generation a is newer than b, in serial number
// arithmetic modulo 256 (RFC 1982), as Redis compares them (placement.lua).
func newer(a, b uint8) bool {
	d := a - b
	return d >= 1 && d <= 127
}

// Forget drops key, which the local limiter evicted (idle), appending the
// release of its record if it held or asked for a lease.
func (p *Policy) Forget(name string, out []Out) []Out {
	k := p.keys.get(name)
	if k == nil {
		return out
	}
	state, gen := k.state, k.gen
	p.keys.remove(name)
	switch {
	case p.degraded:
	case state == Leased || state == Asking:
		// The local limiter has forgotten the key: it runs nothing.
		out = append(out, Out{Kind: Release, Key: name, Gen: NextGen(gen)})
	}
	return out
}
