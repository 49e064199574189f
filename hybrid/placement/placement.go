// Package placement is the placement policy of one Hybrid limit (placement
// version 3): for each key on this instance, whether it is decided exactly,
// one script per decision against the key's pool in Redis, or locally at a
// rate leased from Redis; what to ask Redis for and when; and what an
// answer changes.
//
// A Policy reads no clock, starts no goroutine, sends nothing and imports
// nothing else of this module but internal/table, a container that imports
// nothing of it either. Its caller (package hybrid's lease loop)
// hands it the time, each key's statistics and Redis's answers, and carries
// out what it returns: lease asks and releases to send, and marks and
// grants to put in force in the key's local limiter. So the policy is
// tested with step tables at fixed instants, and the import graph shows
// that it is pure.
//
// A key is in one of three states (State). Its first decision on an
// instance is exact (Exact), so a client's burst of up to the limit's burst
// is admitted whole wherever it lands. When a lease would admit as well for
// fewer scripts (see worth), the key asks for one (Asking) and goes on
// deciding exactly until the grant is in force (Leased). A lease that ends,
// goes idle or stops being worth it goes back to Exact before its record
// is released: a key never decides locally without a grant that Redis
// counts.
//
// Every ask, and every return to the exact placement, bumps the key's
// generation (Gen), which each ask and each exact take carries to Redis: a
// take from an older generation never drops a newer lease, and an ask from
// an older generation never writes over a newer record. An exact key's generation is also its mark in the
// local limiter, so that a hold set under one generation ends with it.
package placement

import (
	"fmt"
	"time"
)

// Thresholds of the policy. Rates are in tokens per second.
const (
	// Headroom multiplies a key's measured demand into its want, so that a
	// key whose demand grows a little is not starved until its next
	// renewal.
	Headroom = 1.05
	// MinWantFraction of the rate is the least a leased key asks for.
	MinWantFraction = 1e-3

	// A key is worth a lease when the lease would hold at least
	// EnterBurst tokens of the limit's burst at its demand or its fair
	// share, whichever is larger (see worth), and its demand would fill at
	// least EnterRenewal tokens per renewal period: below those a lease
	// splits the burst too finely for its clients' clumps (requests
	// sprayed over the instances near the limit are cut at a token or two
	// each), or costs more renewals than exact decisions. A leased key
	// leaves for the exact placement below LeaveBurst and LeaveRenewal:
	// the gap between the two pairs keeps a key near the line from
	// flapping.
	EnterBurst   = 4.0
	LeaveBurst   = 2.0
	EnterRenewal = 2.0
	LeaveRenewal = 0.5
	// A key whose last two looks saw fewer than FallBelow of the tokens
	// its demand would have brought, when that is FallTokens or more, has
	// fallen: it wants what those looks saw, at once, and not an average
	// that lets a pulse that ended go on asking for a share for a second
	// (whether it keeps a lease goes by the average, so that clumps a few
	// ticks apart do not churn it). One whose looks saw more than
	// RiseAbove times those tokens, FallTokens or more, has risen: its
	// demand is what they saw, so that its want follows traffic that moved
	// to it within a renewal, not a second. FallTokens keeps sparse keys,
	// whose few arrivals per look say nothing of either, on the average.
	FallBelow  = 0.25
	RiseAbove  = 2.0
	FallTokens = 8
	// MinTokens is the least number of tokens a key not yet tracked must
	// have asked for before its demand is believed: one or two requests
	// close together measure a rate that says nothing.
	MinTokens = 8

	// EndEarly is the part of a lease's lifetime after which its grant
	// ends locally: Redis started the lease no earlier than the ask went
	// out, so the grant ends here before it ends there, whatever the
	// clocks.
	EndEarly = 0.9
	// A lease renews once 1/RenewDivisor of its lifetime has passed, so
	// that a renewal that fails leaves time for more before it ends.
	RenewDivisor = 2
	// A contended lease is settled once SettleAfter answers in a row, its
	// first grant and the renewals after it, have left the grant within
	// SettledWithin, and the demand of the key's instances within
	// DemandWithin, of the answer before: key.stable counts those
	// renewals, and nextTTL grows once it reaches SettleAfter-1. From then
	// its lifetime grows SettledGrowth times at each renewal, from
	// ContendedTTL up to UncontendedTTL (an uncontended lease asks for
	// UncontendedTTL at once), so that a steady key costs a renewal every
	// few seconds, while a key whose share still moves renews often enough
	// to follow it.
	SettleAfter   = 3
	SettledWithin = 0.1
	SettledGrowth = 4
	// DemandWithin is how far the demand of the key's instances may move
	// between two answers for a lease to count as settled: wider than a
	// grant's, since the sum of many measured demands moves with each, and
	// narrow enough to see a pulse start or end elsewhere.
	DemandWithin = 0.25
	// A leased key renews early, at most every EarlyTicks ticks, when its
	// want falls below Shrink of its grant (it would free a quarter for
	// the others, if they want it: contended) or rises above Grow times
	// what it last asked for (it may get more): demand follows traffic
	// within a renewal or two.
	Shrink     = 0.75
	Grow       = 1.25
	EarlyTicks = 2
	// A grant below Starved of its fair share and of its want is held
	// down by others that hold more than theirs until they renew: the key
	// asks again EarlyTicks ticks later, whatever its lease's lifetime, as
	// often as the others may renew early when their traffic fell.
	Starved = 0.9
	// The lag is how long the answers to asks took to be handed in
	// (Grant.Answered less the ask's time): the round trip, and the time
	// the lease loop waited for a CPU. A process whose callers saturate
	// its CPU hands answers in hundreds of milliseconds late, and a lease
	// that ends before its renewal lands stops admitting while Redis still
	// counts it. So a lease lives at least LagTTLs lags (up to
	// UncontendedTTL), and renews at least LagLead lags before it ends
	// here, so that one renewal as late as the worst lately seen lands in
	// time. The lag remembered is the worst answer's, falling by
	// LagDecay at each answer that took less: one slow answer is not
	// forgotten at the next quick one, while the CPU is still saturated.
	LagTTLs  = 4
	LagLead  = 2
	LagDecay = 0.9
)

// State is where a key stands on this instance.
type State uint8

const (
	// Exact: every decision is one script against the key's pool in
	// Redis, with a deny cache; the key runs nothing locally.
	Exact State = iota
	// Asking: a lease was asked for and no grant is in force yet; the key
	// goes on deciding exactly (make before break).
	Asking
	// Leased: a grant is in force until its end.
	Leased
)

func (s State) String() string {
	switch s {
	case Exact:
		return "exact"
	case Asking:
		return "asking"
	case Leased:
		return "leased"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Config is the limit and the lease loop's timings.
type Config struct {
	Rate  float64 // tokens per second, positive
	Burst int     // tokens, at least 1
	// Tick is the loop's period; ContendedTTL the lifetime of a new or
	// moving lease; UncontendedTTL the longest lease, and twice the time
	// after which a leased key without decisions is released.
	Tick, ContendedTTL, UncontendedTTL time.Duration
}

// Stats is what the local limiter knows of a key at a tick.
type Stats struct {
	Key string
	// Asked is the total number of tokens ever asked for on the key,
	// denied ones included. It only grows.
	Asked    int64
	Created  time.Time // the key's first decision
	LastSeen time.Time // its latest decision
}

// Kind says what an Out asks the caller to do.
type Kind uint8

const (
	// Ask: send a lease ask for Key (global.LeaseAsk) with Gen, Want, TTL,
	// Running, RunningFor and Drain, and hand the answer to Answer.
	Ask Kind = iota + 1
	// Release: send a release of Key's record with Gen; nothing waits on
	// the answer.
	Release
	// Mark: decide Key exactly from now on, under mark Gen (the local
	// limiter's SetMark).
	Mark
	// Assign: put the grant Rate, Burst in force on Key until Until, and
	// add Give tokens to its bucket (moved from the pool); when Until
	// passes, the key decides exactly under mark Gen.
	Assign
)

func (k Kind) String() string {
	switch k {
	case Ask:
		return "ask"
	case Release:
		return "release"
	case Mark:
		return "mark"
	case Assign:
		return "assign"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Out is one thing the caller must do for a key.
type Out struct {
	Kind Kind
	Key  string
	Gen  uint8
	// Ask only.
	Want       float64
	TTL        time.Duration
	Running    float64
	RunningFor time.Duration
	Drain      bool
	// Recorded says that the key's last answered ask left a record in
	// Redis that still lives and was not released: Redis finding none
	// has lost it (global.LeaseAsk.Recorded).
	Recorded bool
	// Assign only.
	Rate  float64
	Burst int
	Until time.Time
	Give  int
}

// Grant is Redis's answer to an Ask, as global.LeaseGrant has it.
type Grant struct {
	Granted, Fair          float64
	Demand                 float64 // the sum of the wants Redis counted
	Contended, Lost, Stale bool
	In                     time.Duration // the lease's lifetime from when Redis ran the ask
	Drained                int
	// Answered is when the answer was handed in; the zero time means at
	// once, when the ask went out. The policy keeps the lag from it.
	Answered time.Time
}

// Gauges sum up a limit's leases at a tick.
type Gauges struct {
	Leased    float64 // tokens per second held by grants in force
	Contended int     // keys with a contended grant in force
	Expired   int     // grants that ran out since the last tick
}

// NextGen returns the generation after g: generations run from 1 to 255
// and wrap, skipping 0, which marks no key.
func NextGen(g uint8) uint8 {
	g++
	if g == 0 {
		g = 1
	}
	return g
}

// PrevGen returns the generation before g, the inverse of NextGen.
func PrevGen(g uint8) uint8 {
	g--
	if g == 0 {
		g = 255
	}
	return g
}

// FirstGen is the generation, and so the mark, of a key's first decisions.
const FirstGen uint8 = 1

// Policy is the placement policy of one Hybrid limit. It is not safe for
// concurrent use: the lease loop owns it.
type Policy struct {
	cfg   Config
	epoch time.Time // instants count from here
	keys  keyTable
	peak  int // the most keys since the table was last packed (see Compact)
	// degraded: Redis is taken to be unreachable; nothing is sent, and
	// leases run out into the exact placement (where decisions follow the
	// outage policy).
	degraded bool
	// lag is the worst time lately from an ask to its answer (see
	// LagTTLs).
	lag time.Duration
}

// New returns the policy of a limit.
func New(cfg Config) *Policy {
	return &Policy{cfg: cfg, keys: newKeyTable()}
}

// SetLimit changes the limit's rate and burst; every lease renews at now.
func (p *Policy) SetLimit(now time.Time, rate float64, burst int) {
	p.cfg.Rate, p.cfg.Burst = rate, burst
	p.Resettle(now)
}

// SetDegraded says whether Redis is taken to be unreachable.
func (p *Policy) SetDegraded(on bool) { p.degraded = on }

// Resettle makes every lease renew at now, unsettled: the instance count
// changed, and the fair shares with it.
func (p *Policy) Resettle(now time.Time) {
	t := p.instant(now)
	p.keys.Each(func(_ string, k *key) {
		if k.state == Leased {
			k.renewAt, k.ttl = floorClock(t), 0
			k.setStable(0)
		}
	})
}

// Compact gives back the memory of keys forgotten since the policy tracked
// the most (the table reuses their places but never shrinks by itself):
// once fewer than a quarter of that many are left, the table is packed.
// The loop calls it after evicting idle keys.
func (p *Policy) Compact() {
	if p.peak < compactFrom || p.keys.Len() >= p.peak/4 {
		return
	}
	p.keys.Pack()
	p.peak = p.keys.Len()
}

// compactFrom is the fewest keys a table must have held for Compact to
// pack it: below, the memory is not worth the copy.
const compactFrom = 64

// Lag returns the worst time lately from an ask to its answer.
func (p *Policy) Lag() time.Duration { return p.lag }

// Len returns the number of keys the policy tracks: those that left their
// first exact placement, until they are forgotten.
func (p *Policy) Len() int { return p.keys.Len() }

// State returns where key stands and its generation.
func (p *Policy) State(key string) (State, uint8) {
	if k := p.keys.get(key); k != nil {
		return k.state, k.gen
	}
	return Exact, FirstGen
}
