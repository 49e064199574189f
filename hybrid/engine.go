package hybrid

import (
	"fmt"
	"math"
	"time"

	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/internal/shrink"
	"github.com/hybridlimit/hybridlimit/local"
)

// The lease policy of one Hybrid limit lives in engine: which keys ask Redis
// for a lease at a tick, for how much and for how long, and what a grant, a
// failure or an idle key changes. It is clock-free: every method is handed
// the time, the key statistics and the answers; it starts no goroutine,
// reads no clock and sends nothing. The loop (loop.go) drives it.

// Thresholds of the lease policy. Rates are in tokens per second.
const (
	// headroom multiplies a key's measured demand into its want, so that a
	// key whose demand grows a little is not starved until its next renewal.
	headroom = 1.1
	// minWantFraction of the rate is the least a live key asks for.
	minWantFraction = 1e-3
	// earlyGrowth is how far demand must outgrow the grant of an
	// uncontended key before it renews early, at most every earlyEvery
	// ticks.
	earlyGrowth = 1.0
	earlyEvery  = 4
	// A settled contended lease renews early when its demand (with
	// headroom) falls below settledShrink of its grant (it would free a
	// quarter), or, if it asked for less than its fair share, rises above
	// settledGrow times what it asked for (it could take more).
	settledShrink = 0.75
	settledGrow   = 1.25
	// settleAfter is how many contended renewals in a row must leave a
	// grant unchanged (within settledWithin) at its fair share (at least
	// settledFair of it) before its lease lifetime starts to grow,
	// settledGrowth times at each further one, up to UncontendedTTL. A
	// settled lease renews early when its own demand moves (settledShrink,
	// settledGrow), so the growth only sets how many renewals a key
	// spends reaching the long lease: with 4 rather than 2, a key at the
	// defaults reaches it in two renewals (2.4 s, then 5 s) rather than
	// four, and balanced sends about a fifth fewer commands in its first
	// seconds.
	settleAfter   = 3
	settledWithin = 0.01
	settledFair   = 0.99
	settledGrowth = 4
	// starvedFair: a contended grant below this part of its fair share, or
	// below it by more than ackShrink of the rate (a large key's tenth is
	// much rate), means others still hold more than theirs until their
	// next renewal; such a key (see starved), and a key's first contended
	// grant, ask again after soonTicks ticks to pick up what they free.
	starvedFair = 0.9
	soonTicks   = 2
	// ackShrink of the rate is the least shrink of a grant that the
	// instance tells Redis about at the next tick rather than at its next
	// renewal: Redis counts the old grant until it ends, and a small shrink
	// is not worth an extra command.
	ackShrink = 0.05
	// endEarly is the part of its lease lifetime after which a grant ends
	// locally: Redis started the lease no earlier than the request went
	// out, so the grant ends here before it ends there, whatever the clocks.
	endEarly = 0.9
	// renewDivisor: a lease renews once 1/renewDivisor of its lifetime has
	// passed, so that a renewal that fails leaves time for more before the
	// lease ends. A leased key without decisions for one uncontended
	// renewal period (UncontendedTTL/renewDivisor) stops renewing: letting
	// go sooner would make keys with a request or two per renewal flap
	// between a lease and their default share.
	renewDivisor = 2
)

// keyState is where one key stands on this instance: its placement
// (share, lease or exact) and, for a lease, how far its request got.
type keyState uint8

const (
	// stateDefault is the share placement: the key runs its default share
	// and Redis holds no record of it, counting it at that share. A new key
	// of a limit with split bursts, or one whose record was released.
	stateDefault keyState = iota
	// stateAsking: a lease was asked for and no grant has been in force
	// since: the first answer is on its way, was lost, or failed. The key
	// runs what it ran before asking, and says so in every request, so
	// that Redis counts it at that even if an answer is lost.
	stateAsking
	// stateHeld: a grant is in force until lease.until.
	stateHeld
	// stateLapsed: the last grant ran out before a renewal was answered.
	// The key runs the smaller of that grant and its default share (Redis
	// counts it at the grant until its record ends, and at the default
	// share after that), or its outage policy while the limit is degraded.
	stateLapsed
	// stateReleasing: the key went idle and its record's release is on its
	// way. It runs as lapsed until the release is acknowledged: only then
	// may it go back to its default share.
	stateReleasing
	// stateYielded: at a peer's ask the key gave up its default share
	// above lease.granted (lowered here first), and records that in Redis,
	// renewing the record while peers ask. It goes back to its default
	// share only after the record has certainly ended, or asks for a lease
	// when its own demand grows (raise only after a grant).
	stateYielded
	// stateExact: every decision is one script against the key's pool in
	// Redis, with a deny cache; the key's default share went to the pool.
	stateExact
	// stateLeaving: an exact key on its way to a lease (make before
	// break). It keeps deciding exactly, with takes that keep and count a
	// lease record of this instance (markExact), and asks for a lease at
	// every tick until a grant is in force; a key whose takes dropped a
	// lease record (markExactDropLease) first waits until those still on
	// their way have ended, since one landing after the lease request
	// would drop the new lease while the key runs it.
	stateLeaving
)

func (s keyState) String() string {
	switch s {
	case stateDefault:
		return "default"
	case stateAsking:
		return "asking"
	case stateHeld:
		return "held"
	case stateLapsed:
		return "lapsed"
	case stateReleasing:
		return "releasing"
	case stateYielded:
		return "yielded"
	case stateExact:
		return "exact"
	case stateLeaving:
		return "leaving"
	}
	return fmt.Sprintf("keyState(%d)", int(s))
}

// lease is this instance's view of one key's record in Redis.
type lease struct {
	// The last grant: its rate and this instance's fair share, both in
	// tokens per second, and whether the key's instances want more than its
	// rate (contended). A yielded key's granted is what it kept.
	granted, fair float64
	until         instant // local end of the grant (yielded: of the record, certainly)
	renewAt       instant // when the next request is due
	askedAt       instant // when a peer last asked this instance to yield the key (share placement: an ask that stands, see step)
	lastWant      float64 // the want of the last request
	sentAt        instant // when the last request went out
	attemptedAt   int64   // the key's Attempted counter at sentAt
	demandNow     float64 // share placement: the demand last measured, at most a second ago
	quietAt       int64   // the key's Attempted counter at the last tick
	askedPeers    instant // when this instance last asked its peers to yield the key
	wantsMoreAt   instant // when its requests started to want more than it runs; zero if the last did not
	demand        demandWindow
	// The fields below are smaller than 8 bytes, and kept together so that
	// they fill one word instead of padding one each: a lease per key.
	deniedAt uint32 // the key's Denied counter when last looked at
	quietGap uint32 // quietAt less the key's Attempted counter at the tick before the last
	stable   int16  // contended renewals in a row that changed nothing (saturates)
	burst    uint16 // the part of the burst the last grant holds locally (Lease.Burst, rounded down; saturates)
	askGap   uint8  // ticks after a grant that a key that asked its peers renews; 0: soonTicks
	ignored  uint8  // denials in a row that sparseDenial said nothing of (see ignoreDenial)
	state    keyState
	// failed: the last request for this key failed on its own. Orthogonal
	// to state: a held grant stays in force until it ends, then lapses to
	// at most the default share; only a degraded limit follows its policy.
	failed     bool
	contended  bool
	returning  bool // releasing: the release was acknowledged; the key returns to its default share at until
	measured   bool // demandNow was measured over a second or more
	measuredOn bool // ... and rests on fallTokens decisions or more
	wantsLease bool // yielded: its share denied a request, and it asks for a lease until granted
	unrecorded bool // the last grant counted peers that hold no record at their default share: they could yield
	recovering bool // went back to its default share while Redis was down: its record is released once it is back
}

// quietPrev is the key's Attempted counter at the tick before the last.
func (le *lease) quietPrev() int64 { return le.quietAt - int64(le.quietGap) }

// peersCouldYield reports whether asking the peers to yield could grow the
// key's grant: Redis counted peers without a record at their default
// share, or others hold more than their fair share (they renew with their
// demand now when asked). A key at its fair share among peers that all
// need theirs does not ask.
func (le *lease) peersCouldYield(rate float64) bool {
	return le.unrecorded || starved(le.granted, le.fair, rate)
}

// starved reports whether a contended grant is short of its fair share
// by enough that others hold more than theirs, see starvedFair.
func starved(granted, fair, rate float64) bool {
	return granted < fair*starvedFair || fair-granted > ackShrink*rate
}

// settled reports whether the key's contended share has stopped moving.
func (le *lease) settled() bool { return le.stable >= settleAfter }

// running is what the key runs now, which its requests say until their
// answer is in force: the grant while held, the smaller of the grant and
// the default share def once lapsed, what it kept when yielded, and the
// default share otherwise (a key asking from the share placement).
func (le *lease) running(def float64) (r float64, held bool) {
	switch le.state {
	case stateHeld:
		return le.granted, true
	case stateLapsed, stateReleasing:
		return min(le.granted, def), true
	case stateYielded:
		// What it kept is not a grant of Redis's: its record may not exist
		// yet, and a missing record must not read as lost state.
		return le.granted, false
	}
	return def, false
}

// keyShares puts the engine's decisions into force in the keys' local
// limiters. *local.Limiter implements it.
type keyShares interface {
	Assign(t time.Time, key string, s local.Share, until time.Time) bool
	AssignNew(t time.Time, key string, s local.Share, until time.Time) bool
	Unassign(t time.Time, key string) bool
	SetMark(key string, m uint8) bool
	SetNewMark(m uint8)
	Give(t time.Time, key string, tokens int) bool
	Stats(key string) (local.KeyStats, bool)
	Shards() int
	AppendShardStats(i int, dst []local.KeyStats) []local.KeyStats
}

// instantShares is keyShares taking the engine's instants.
type instantShares struct {
	keyShares
	clock *epoch
}

func (s instantShares) Assign(t instant, key string, sh local.Share, until instant) bool {
	return s.keyShares.Assign(s.clock.time(t), key, sh, s.clock.time(until))
}

func (s instantShares) AssignNew(t instant, key string, sh local.Share, until instant) bool {
	return s.keyShares.AssignNew(s.clock.time(t), key, sh, s.clock.time(until))
}

func (s instantShares) Give(t instant, key string, tokens int) bool {
	return s.keyShares.Give(s.clock.time(t), key, tokens)
}

func (s instantShares) Unassign(t instant, key string) bool {
	return s.keyShares.Unassign(s.clock.time(t), key)
}

// The local marks of a key in the exact placement: its decisions go to
// Redis, one script each.
const (
	// markExact: the key's takes keep a lease record Redis may hold for
	// this instance, and count it (global.ExactRequest.KeepLease): the key
	// runs no lease, or not yet. A key that leaves the exact placement
	// for a lease keeps deciding exactly until its grant is in force: a
	// take that lands after the lease request cannot undo it.
	markExact uint8 = 1
	// markExactDropLease: the key stopped running a lease to decide
	// exactly, and its takes drop that lease's record, so that what it
	// held goes to the pool at once.
	markExactDropLease uint8 = 2
)

// Thresholds of the placement policy.
const (
	// yieldBelow: a key in the share placement gives up its default share
	// when a peer asks only if its demand measured over a second (with
	// headroom) is below this part of that share; an instance that needs
	// its share keeps it. A yield keeps the default part of the burst
	// (yieldShare), so an instance that yields to its demand still absorbs
	// its clients' clumps: at half the share, as first built, instances at
	// 0.5-0.85 of their share kept all of it while a heavy peer was held
	// to what they left (a key 60/40 over four instances at 1.2x its
	// limit admitted 0.73 of an exact bucket, 10 keys 70/30 over six at
	// 1.5x 0.82).
	yieldBelow = 0.85
	// youngYieldBelow is yieldBelow for a key whose demand has not been
	// measured over a second yet (youngDemand): its few requests so far
	// say little, so it yields only well below its share.
	youngYieldBelow = 0.5
	// heldYieldTokens is the least number of decisions that a held key's
	// demand must rest on for it to yield to that demand (heldYields): one
	// or two requests over a second say nothing of a sparse key's rate (a
	// key at 0.5/s measured 0.9/s on one, and its yield kept nearly twice
	// what it used while its heavy peer went short). A denial whose window
	// holds fewer says nothing of it either (sparseDenial).
	heldYieldTokens = 3
	// ignoredDenials is how many denials in a row a key may leave
	// unanswered because they say nothing of its demand (ignoreDenial).
	ignoredDenials = 2
	// yieldLife is a yield record's lifetime in UncontendedTTLs: longer
	// than any lease granted against it, since Redis counts a record that
	// ends before a new lease would at the default share (its instance may
	// go back to that share when it ends). It renews at a third of it
	// while peers keep asking.
	yieldLife = 2
	// exactBurstBelow: a contended grant whose part of the burst is below
	// this many tokens splits the burst too finely (requests sprayed over
	// the instances near the limit are cut at a token or two per
	// instance): the key moves to the exact placement, unless its demand
	// here is above exactDemandUpTo times its fair share, where a lease
	// admits as well for far fewer commands.
	exactBurstBelow  = 3
	exactDemandUpTo  = 3
	exactLeaveBelow  = 0.5 // an exact key whose demand falls below this part of its default share (beyond chance, with split bursts) leaves the exact placement
	exactLeaseAbove  = 4.0 // ... and so does one whose demand is above this many default shares, for a lease
	askPeersAfterGap = 0.9 // a held key asks its peers to yield when its grant is below this part of its want
	// exactAskAbove: an exact key (split bursts) whose demand, with
	// headroom, is above this many default shares asks its peers to yield
	// every askEvery. Below it, a key sprayed over its instances at about
	// its share on each, the peers need theirs too: their yields would
	// cost Redis records and give little (keys: 164 commands per 1000
	// decisions asking above one share, against 150).
	exactAskAbove = 2.0
	maxAskGap     = 64 // ticks: the longest a key that asks its peers waits to look again
	// askEvery is how often a starved key asks its peers again between
	// renewals: well within a yield record's half-life, so that yields
	// stand while it needs them.
	askEvery = time.Second

	// exactSampleEvery is how often an exact key of a limit with split
	// bursts records a sample of its demand window (see stepExact).
	exactSampleEvery = time.Second
	// A held contended key whose demand over the last two ticks is below
	// fallBelow of what it last asked for, when that would have been at
	// least fallTokens decisions, gives back what it no longer uses at
	// once (engine.fell). fallTokens keeps sparse keys, whose arrivals are
	// too few per tick to tell a fall (or a jump, engine.demandNow) from
	// chance, on their schedule.
	fallBelow  = 0.25
	fallTokens = 8
	// A key in the share placement younger than a second (its demand not
	// yet measured) that a peer asks to yield does so once it is
	// youngYieldAfter old, to its requests so far plus youngSlack over its
	// age (youngDemand, which counts from the start of its demand window).
	youngYieldAfter = 200 * time.Millisecond
	youngSlack      = 2
	// yieldLower: a yielded key whose measured demand (with headroom)
	// falls below this part of what it kept lowers to it, and records that
	// at once, so that the asker can take the difference.
	yieldLower = 0.9
)

// youngFor is how long a key's demand above what it runs must last before
// its requests cut the others' grants for it (global.LeaseRequest.Young):
// about what a reallocation between busy instances takes, from the cut of
// the others, which lands at their renewals before the raise here, to the
// return of the share once the demand has ended. A pulse shorter than that
// would lose the cluster more than it gains it, so it takes only what is
// free.
func (e *engine) youngFor() time.Duration { return e.t.contendedTTL / renewDivisor }

// timings are the lease loop's periods, see Config.
type timings struct {
	tick, contendedTTL, uncontendedTTL, redisTimeout time.Duration
}

// engine is the placement policy of one Hybrid limit. It is not safe for
// concurrent use: the loop goroutine owns it.
type engine struct {
	limit, instance string
	rate            float64
	burst           int
	t               timings
	shares          instantShares
	clock           epoch // of every instant the engine keeps

	keys map[string]*lease
	size shrink.Tracker // of keys
	asks []string       // keys to ask the peers to yield, gathered at a tick
	// frees are the keys whose contended grant this instance gave up, in
	// part, at a tick: the peers that want more renew at once (freed).
	frees []string
	// ticks are the instants of the last two ticks, the latest first: a
	// held key's Attempted counters then (quietAt, quietPrev) tell its
	// demand over the last two ticks.
	ticks [2]instant
	// tickAt is the instant of the tick under way, which becomes ticks[0]
	// at the next one.
	tickAt instant
	// denied: the key step is at was denied a decision since the last
	// tick (scratch of step, read by renewal).
	denied bool
	// degraded: Redis is taken to be unreachable; exact keys go back to
	// their default share, for the outage policy. Set by the loop.
	degraded bool
	// exactBursts: the limit's keys start in the exact placement and go
	// back to it, never to their default share (Limit.ExactBursts).
	exactBursts bool
}

func newEngine(limit Limit, instance string, t timings, shares keyShares) *engine {
	e := &engine{
		limit: limit.Name, instance: instance, rate: limit.Rate, burst: limit.Burst,
		t: t, keys: make(map[string]*lease), exactBursts: limit.ExactBursts,
	}
	e.shares = instantShares{keyShares: shares, clock: &e.clock}
	return e
}

// callKind says what a call asks of Redis.
type callKind uint8

const (
	callLease   callKind = iota // ask for, renew or shrink a lease
	callYield                   // record a yield
	callRelease                 // release the key's record; lease set: the key waits for the ack
)

// call is one request the engine wants sent, with the lease it is for
// (nil for a release nothing waits on).
type call struct {
	req   global.LeaseRequest
	lease *lease
	kind  callKind
}

// tickStats sums up a limit's leases at a tick, for its gauges.
type tickStats struct {
	leased    float64 // tokens/s held by grants in force
	contended int     // keys with a contended grant in force
	expired   int     // grants that ran out since the last tick
}

// request builds the request of one key: n is N-hat, the largest recent
// instance count, by which Redis counts the instances that hold no record.
func (e *engine) request(key string, want float64, n int, ttl time.Duration) global.LeaseRequest {
	return global.LeaseRequest{
		Limit: e.limit, Key: key, Instance: e.instance,
		Want: want, Rate: e.rate, Instances: n, TTL: ttl,
		MaxTTL: e.t.uncontendedTTL * yieldLife, ExactBursts: e.exactBursts,
		Burst: e.burst,
	}
}

// wantBurst is the part of the burst a key asks for with a want of want,
// n being N-hat: its want's part of the burst, and at least its default
// part, burst/n. Redis counts the burst apart from the rate (see
// global.LeaseRequest.Burst) and splits it max-min fair over what the
// instances ask for: an instance whose demand is light, and whose
// requests come unevenly, keeps its default part of the burst while a
// heavy one, which runs its bucket empty and needs little burst, takes
// what is left. With a part of the burst in proportion to its rate, a
// light instance of a contended key turned away a good part of its
// requests (Poisson arrivals at 25/s through a bucket of 3 tokens admit
// 86%), and its rate was lost to the cluster.
func (e *engine) wantBurst(want float64, n int) float64 {
	return min(float64(e.burst), max(float64(e.burst)*want/e.rate, float64(e.burst)/float64(max(n, 1))))
}

// runningBurst is the part of the burst key runs now, st being its
// statistics: its local bucket's, or its grant's, whichever is larger.
func runningBurst(st *local.KeyStats, le *lease) float64 {
	b := st.Share.Burst
	if le.state == stateHeld || le.state == stateLapsed || le.state == stateReleasing {
		b = max(b, int(le.burst))
	}
	return float64(b)
}

// release builds the request that gives key's record back; le, if set,
// waits for its acknowledgement.
func (e *engine) release(key string, n int, le *lease) call {
	return call{req: e.request(key, 0, n, e.t.contendedTTL), lease: le, kind: callRelease}
}

// share is the local share of a rate r: its burst in proportion, rounded
// down.
func (e *engine) share(r float64) local.Share {
	return local.Share{Limit: rate.Limit(r), Burst: int(float64(e.burst) * r / e.rate)}
}

// heldShare is the local share at a rate r of at most the key's grant:
// its part of the burst in proportion, at most the part its grant holds
// (which Redis counts until the record ends).
func (e *engine) heldShare(r float64, le *lease) local.Share {
	s := e.share(r)
	s.Burst = min(s.Burst, int(le.burst))
	return runnable(s, float64(le.burst))
}

// runnable is share s as a key's bucket may run it while Redis counts this
// instance at part tokens of the burst. The local limiter raises an
// assigned share with a rate to a whole token (local.Share): a share whose
// counted part is under one token therefore runs nothing, or it would run
// a token that Redis counts at its fraction, and the parts run would sum
// above the burst.
func runnable(s local.Share, part float64) local.Share {
	if s.Limit > 0 && s.Burst < 1 && part < 1-1e-9 {
		return local.Share{}
	}
	return s
}

// yieldShare is the local share of a key that yields to a rate d, n being
// N-hat: its burst in proportion, and with split bursts at least burst/n
// rounded down, which its yield record keeps counted (stepYielded) and
// Redis counts until then as it counts an instance without a record; with
// exact bursts the record counts what the key runs. Runnable while Redis
// counts it at burst/n: with a burst below the instance count that is
// under a token, and a yield below a token of its own keeps nothing.
func (e *engine) yieldShare(d float64, n int) local.Share {
	s := e.share(d)
	if !e.exactBursts && s.Limit > 0 {
		s.Burst = max(s.Burst, e.floorPart(n))
	}
	return runnable(s, float64(e.floorPart(n)))
}

// yieldBurst is the part of the burst the record of a yield to a rate d
// keeps counted, n being N-hat: what its share runs, with split bursts at
// least the default part (see stepYielded), and a token at least for a
// share that admits anything.
func (e *engine) yieldBurst(d float64, n int) float64 {
	run := e.yieldShare(d, n)
	b := float64(run.Burst)
	if !e.exactBursts {
		b = max(b, float64(e.floorPart(n)))
	}
	if run.Limit > 0 {
		b = max(b, 1) // an assigned share that admits anything runs a token
	}
	return b
}

// floorPart is the default part of the burst over n instances, rounded
// down: what every instance's default share holds at least (the lowest
// ranks hold one token more), and what Redis counts of an instance without
// a record, burst/n, rounded down.
func (e *engine) floorPart(n int) int { return e.burst / max(n, 1) }

// tokenless reports whether a default share def of the limit holds less
// than a whole token of its burst (a burst below the instance count):
// Redis counts every other instance at about that part, so no lease of
// the key holds a token either, and the key's share admits nothing.
func (e *engine) tokenless(def float64) bool { return e.share(def).Burst < 1 }

// collect appends to calls the requests due at now for the keys in stats
// (a snapshot of the limit's keys), n being N-hat, and returns them with
// the limit's gauges. The keys to ask the peers about are in e.asks.
func (e *engine) collect(t time.Time, n int, stats []local.KeyStats, calls []call) ([]call, tickStats) {
	e.startTick(t)
	var ts tickStats
	calls = e.collectKeys(t, n, stats, calls, &ts)
	return calls, ts
}

// startTick readies the engine for a tick's collectKeys.
func (e *engine) startTick(t time.Time) {
	if now := e.clock.instant(t); now != e.tickAt {
		if !e.tickAt.IsZero() {
			e.ticks[1], e.ticks[0] = e.ticks[0], e.tickAt
		}
		e.tickAt = now
	}
	e.asks = shrink.Slice(e.asks)
	e.frees = shrink.Slice(e.frees)
	if e.exactBursts && !e.degraded {
		e.shares.SetNewMark(markExact)
	} else {
		e.shares.SetNewMark(0)
	}
}

// collectKeys is collect for part of the keys, after startTick: the loop
// hands it the limit's keys a shard at a time, so that its snapshot buffer
// holds one shard's keys, not every key's. It adds the gauges to ts.
func (e *engine) collectKeys(t time.Time, n int, stats []local.KeyStats, calls []call, ts *tickStats) []call {
	now := e.clock.instant(t)
	def := e.rate / float64(n)
	for i := range stats {
		st := &stats[i]
		le := e.keys[st.Key]
		if le == nil {
			if e.untracked(now, def, st) {
				continue
			}
			le = e.track(now, st)
		}
		if le.state == stateHeld && !now.Before(le.until) {
			le.state = stateLapsed
			ts.expired++
		}
		if le.state == stateHeld {
			ts.leased += le.granted
			if le.contended {
				ts.contended++
			}
		}
		calls = e.step(now, n, def, st, le, calls)
	}
	e.size.Grew(len(e.keys))
	return calls
}

// untracked reports whether the engine keeps no state at now of st's key,
// which it does not track yet: a key that nothing moved from where it
// started (never denied, assigned, or marked other than as it was
// created), with fewer than demandTokens tokens asked for in all. With
// split bursts that is the share placement; such a key has nothing to
// remember: its demand, should a peer ask it to yield, is measured from
// its first decision, as a new key's is (track). With exact bursts it is
// the exact placement, until the policy moves it (exactDue). Keys decided
// once or twice (one-shot keys, or many keys each within its share) so
// cost the engine nothing; not while degraded, where every key is looked
// at for its outage policy.
func (e *engine) untracked(now instant, def float64, st *local.KeyStats) bool {
	if e.degraded || st.Denied != 0 || st.Assigned || st.Lapsed || st.Attempted >= demandTokens {
		return false
	}
	if !e.exactBursts {
		return st.Mark == 0
	}
	return st.Mark == markExact && !e.exactDue(now, def, st)
}

// exactDue reports whether an untracked key of a limit with exact bursts
// leaves the exact placement at now: what stepExact would decide of it,
// at the instants it would look (the first tick that sees the key, and
// then every ContendedTTL/renewDivisor; here from the key's first
// decision, which that tick follows within a tick), on the demand its
// window would measure (from the key's first decision while it holds
// fewer than demandTokens tokens).
func (e *engine) exactDue(now instant, def float64, st *local.KeyStats) bool {
	created := e.clock.instant(st.Created)
	period := e.t.contendedTTL / renewDivisor
	if prev := e.ticks[0]; !prev.IsZero() && !prev.Before(created) && period > 0 &&
		now.Sub(created)/period == prev.Sub(created)/period {
		return false // the last tick saw the key, and no look is due since
	}
	var w demandWindow
	w.open(created)
	d, tokens, span := w.measured(now, st, def)
	return e.exactLeaves(d, tokens, span, def)
}

// exactLeaves reports whether a key of a limit with exact bursts whose
// demand is d (tokens over span of its window) leaves the exact placement
// for a lease, def being its default share: a heavy one, and a steady one
// whose default share's part of the burst splits well, where a lease
// admits as well for far fewer commands.
func (e *engine) exactLeaves(d float64, tokens int64, span time.Duration, def float64) bool {
	steady := d >= def*exactLeaveBelow && e.share(def).Burst >= exactBurstBelow
	return e.exactHeavy(d, def, tokens, span) || steady
}

// exactHeavy reports whether an exact key whose demand is d, tokens over
// span of its window, is heavy enough for a lease: above exactLeaseAbove
// default shares def, beyond chance (surelyAbove), on fallTokens decisions
// or more. A few requests close together on a young or sparse key measure
// a high rate that says nothing, and surelyAbove's two standard deviations
// let them through: two requests 50 ms apart pass it at 10/s, which one
// key in ten at 1/s shows now and then. On the bench's 10 000 Zipf keys
// with exact bursts, light keys left for a lease some 70 times in 7 s,
// each drawing the pool into one instance's lease and costing its peers'
// yields, the renewals and the release: about ten commands for nothing.
// Never with a burst below the instance count: Redis counts the other
// instances at about burst/N-hat each (exact users and instances without a
// record at that), so a grant would hold less than a whole token and send
// the key back to the pool (granted): a request for nothing.
func (e *engine) exactHeavy(d, def float64, tokens int64, span time.Duration) bool {
	return !e.tokenless(def) && d > def*exactLeaseAbove && tokens >= fallTokens && surelyAbove(tokens, span, def*exactLeaseAbove)
}

// untrackedMarked returns the keys held here that are marked (decided in
// Redis, whose records Redis may hold) and that the engine does not track.
func (e *engine) untrackedMarked() []string {
	var keys []string
	var buf []local.KeyStats // a shard's keys at a time
	for i := range e.shares.Shards() {
		buf = e.shares.AppendShardStats(i, buf[:0])
		for j := range buf {
			if st := &buf[j]; st.Mark != 0 && e.keys[st.Key] == nil {
				keys = append(keys, st.Key)
			}
		}
	}
	return keys
}

// track starts the engine's state of st's key at now, as of its first
// decision. A key in the share placement left untracked for longer than
// an idle period (UncontendedTTL/renewDivisor, after which a leased key
// stops renewing) has its demand measured from now: its few tokens may
// have come long before (a few requests, then a minute of quiet), and
// measured over its whole life it would look far lighter than it is now.
func (e *engine) track(now instant, st *local.KeyStats) *lease {
	le := &lease{sentAt: e.clock.instant(st.Created)}
	if st.Mark == 0 && now.Sub(le.sentAt) > e.t.uncontendedTTL/renewDivisor {
		le.demand.restart(now, st.Attempted)
	} else {
		le.demand.open(le.sentAt)
	}
	if st.Mark != 0 {
		le.state = stateExact
	}
	e.keys[st.Key] = le
	return le
}

// measure measures, once a second, the demand of a key without a lease:
// what it would yield to if asked. If no decision came since the last
// tick, its window starts anew here: a burst that comes next is measured
// from here, not diluted over the quiet before it.
func (e *engine) measure(now instant, def float64, st *local.KeyStats, le *lease) {
	if (le.state == stateDefault || le.state == stateYielded) && now.Sub(le.demand.lastAt()) >= time.Second {
		d, tokens, _ := le.demand.measured(now, st, def)
		le.demandNow, le.measured, le.measuredOn = d, true, tokens >= fallTokens
		if st.Attempted == le.quietAt {
			le.demand.restart(now, st.Attempted)
		} else {
			le.demand.record(now, st.Attempted)
		}
	}
}

// step appends the requests due at now for one key.
func (e *engine) step(now instant, n int, def float64, st *local.KeyStats, le *lease, calls []call) []call {
	denied := st.Denied != le.deniedAt
	le.deniedAt = st.Denied
	e.denied = denied
	e.measure(now, def, st, le)
	quietPrev := le.quietPrev()
	le.quietGap = uint32(min(st.Attempted-le.quietAt, math.MaxUint32))
	le.quietAt = st.Attempted
	if e.degraded && le.state != stateDefault && le.state != stateHeld && le.state != stateAsking {
		// Redis is down: a key that runs less than its default share (a
		// lapsed grant, yielded, exact, on its way out of either) runs
		// that share, for the outage policy (FailLocal admits rate/N-hat
		// per instance), and releases its record once Redis is back.
		le.state, le.recovering, le.returning = stateDefault, true, false
		e.shares.SetMark(st.Key, 0)
		e.shares.Unassign(now, st.Key)
		return calls
	}
	if le.recovering && !e.degraded && le.state == stateDefault {
		le.recovering = false
		le.state, le.renewAt = stateReleasing, now.Add(e.t.tick)
		return append(calls, e.release(st.Key, n, le))
	}
	switch le.state {
	case stateDefault:
		if e.exactBursts {
			// Back from an outage: decide exactly again.
			if !e.degraded {
				e.toExact(now, st.Key, le, markExact)
			}
			return calls
		}
		// The share placement costs nothing while the key's demand fits
		// its share: it asks only once that share turned requests away
		// (and not while Redis is down: no grant could follow).
		if !le.measured && !e.degraded && !le.askedAt.IsZero() && now.Sub(le.askedAt) < askEvery {
			// A peer asked it to yield lately (yieldAsked).
			if d, ok := youngDemand(now, st, &le.demand); ok && d < def*youngYieldBelow {
				e.yieldTo(now, st.Key, le, d, n)
				return e.stepYielded(now, n, def, st, le, false, calls)
			}
		}
		if !denied || e.degraded || e.ignoreDenial(now, st, le, def) {
			return calls
		}
		e.asks = append(e.asks, st.Key)
		return append(calls, e.leaseCall(now, n, def, st, le))
	case stateYielded:
		return e.stepYielded(now, n, def, st, le, denied, calls)
	case stateReleasing:
		switch {
		case le.returning && !now.Before(le.until):
			// Released, and every lease granted while Redis counted this
			// instance lower has ended.
			e.returned(now, st.Key, le)
		case !le.returning && !now.Before(le.renewAt):
			le.renewAt = now.Add(e.t.tick)
			return append(calls, e.release(st.Key, n, le))
		}
		return calls
	case stateLeaving:
		return e.stepLeaving(now, n, def, st, le, calls)
	case stateExact:
		return e.stepExact(now, n, def, st, le, calls)
	}
	// Asking, held or lapsed.
	if !e.degraded && le.state == stateHeld && le.lastWant > def &&
		((le.peersCouldYield(e.rate) && le.granted < le.lastWant*askPeersAfterGap) || le.granted > def) &&
		now.Sub(le.askedPeers) >= askEvery {
		// Starved while it wants more than its share, or running on what
		// its peers yielded: keep asking them (no Redis), so that their
		// yields stand while it needs them; the renewals pick up what
		// they give.
		e.asks = append(e.asks, st.Key)
		le.askedPeers = now
		le.askGap = max(le.askGap, soonTicks)
	}
	if !e.degraded && le.state == stateHeld {
		if want, ok := e.fell(now, st, le, quietPrev); ok {
			return append(calls, e.giveBack(now, n, def, st, le, want, quietPrev))
		}
	}
	if !e.due(now, st, le, def) {
		return calls
	}
	if now.Sub(e.clock.instant(st.LastSeen)) >= e.t.uncontendedTTL/renewDivisor {
		return e.idle(now, n, st, le, calls)
	}
	if kept, ok := e.heldYields(now, n, def, st, le); ok {
		return e.yieldHeld(now, n, def, st, le, kept, calls)
	}
	c := e.leaseCall(now, n, def, st, le)
	if le.state == stateHeld && le.peersCouldYield(e.rate) && c.req.Want > def && le.granted < c.req.Want*askPeersAfterGap {
		if now.Sub(le.askedPeers) >= soonTicks*e.t.tick {
			e.asks = append(e.asks, st.Key)
			le.askedPeers = now
		}
		le.askGap = max(le.askGap, soonTicks)
	} else {
		le.askGap = 0
	}
	return append(calls, c)
}

// fell reports whether a held key's contended demand fell far below what
// it last asked for over the last two ticks (from e.ticks[1], when its
// Attempted counter was prev), to below its grant or its fair share, and
// returns its want at the demand since: a pulse that ended, or traffic
// that moved to another instance. Two ticks, not one, so that a stall of a
// tick or so is not taken for a fall.
func (e *engine) fell(now instant, st *local.KeyStats, le *lease, prev int64) (float64, bool) {
	from := e.ticks[1]
	if !le.contended || from.IsZero() || e.clock.instant(st.Created).After(from) || now.Sub(le.sentAt) < e.t.tick ||
		!e.onTime(now.Sub(e.ticks[0])) || !e.onTime(e.ticks[0].Sub(from)) {
		return 0, false
	}
	elapsed := now.Sub(from).Seconds()
	expected := le.lastWant / headroom * elapsed
	got := float64(st.Attempted - prev)
	if expected < fallTokens || got >= expected*fallBelow {
		return 0, false
	}
	want := max(got/elapsed*headroom, e.rate*minWantFraction)
	if want >= max(le.granted, le.fair) {
		// Still above the water level Redis filled to: the fall frees
		// nothing and changes no one's share (the split is max-min fair),
		// so telling Redis would only cost a command and the lease's
		// settled lifetime. The demand before the fall is not asked for
		// again, though: the window restarts at the tick before, as at a
		// give-back, and the next renewal carries the want since.
		le.demand.restart(e.ticks[1], prev)
		le.lastWant = want
		return 0, false
	}
	return want, true
}

// demandNow is the key's demand at now: measured over its window, or, if
// more, over the last tick when it was denied in it. The window reaches
// back to demandTokens decisions and lags a jump by a renewal or two; a
// denial says the last tick's demand is real, not a lull's rebound. Only
// for keys that existed a tick ago (a new key's first burst says nothing
// of its rate) and that the lag costs: a contended lease, whose want is
// its share, and a yielded key; an uncontended lease takes a client's
// burst over a tick for no rate. And only when the tick holds fallTokens
// decisions or more: a sparse key's one request in a tick is no rate.
func (e *engine) demandNow(now instant, st *local.KeyStats, le *lease, def float64) float64 {
	d := le.demand.rate(now, st, def)
	if got := st.Attempted - le.quietPrev(); e.denied && got >= fallTokens &&
		((le.state == stateHeld && le.contended) || le.state == stateYielded) && !e.ticks[0].IsZero() &&
		!e.clock.instant(st.Created).After(e.ticks[0]) && e.onTime(now.Sub(e.ticks[0])) {
		d = max(d, float64(got)/now.Sub(e.ticks[0]).Seconds())
	}
	return d
}

// onTime reports whether gap, between two ticks, was about a tick: a tick
// that came late, or right after a late one, says the process was stalled,
// and a stall holds back the decisions too, which is no fall of demand.
func (e *engine) onTime(gap time.Duration) bool {
	return gap >= e.t.tick-e.t.tick/4 && gap <= e.t.tick+e.t.tick/4
}

// giveBack records at once that a held key's demand fell to want, with a
// renewal sent at now: Redis then stops counting the want it had (a
// starved key's want cuts the others' fair shares). If want is below the
// grant, the key lowers to want first, and tells the peers (freed) so
// that those that want more ask for it at once rather than at their next
// renewal: a contended grant that nobody uses is rate the cluster loses.
// The demand window restarts at the tick before (from which want was
// measured), so that the demand before the fall is not asked for again.
func (e *engine) giveBack(now instant, n int, def float64, st *local.KeyStats, le *lease, want float64, prev int64) call {
	if want < le.granted {
		le.granted = want
		e.shares.Assign(now, st.Key, e.heldShare(want, le), le.until)
		e.frees = append(e.frees, st.Key)
	}
	le.stable, le.askGap = 0, 0
	le.demand.restart(e.ticks[1], prev)
	return e.leaseCall(now, n, def, st, le)
}

// freed handles a peer's word that it gave up part of its grant of key at
// now: a held key here that wants notably more than its grant renews at
// once, to take it.
func (e *engine) freed(t time.Time, key string) {
	now := e.clock.instant(t)
	le := e.keys[key]
	if e.degraded || le == nil || le.state != stateHeld || le.granted >= le.lastWant*askPeersAfterGap ||
		now.Sub(le.sentAt) < e.t.tick {
		return
	}
	le.renewAt = minTime(le.renewAt, now)
}

// stepYielded renews a yielded key's record while its peers ask, lets it
// go back to its default share once the record has certainly ended, and
// asks for a lease when its own demand outgrows what it kept.
func (e *engine) stepYielded(now instant, n int, def float64, st *local.KeyStats, le *lease, denied bool, calls []call) []call {
	life := e.t.uncontendedTTL * yieldLife
	if e.exactBursts && st.Mark != 0 && le.measured && le.demand.lastAt() == now &&
		le.demandNow*headroom > le.granted && (le.measuredOn || le.granted == 0) {
		// With exact bursts a yielded key decides exactly, and its share
		// denies nothing: its demand says when it outgrew what it kept,
		// measured on fallTokens decisions or more, or on any if it kept
		// nothing (it yielded before its first request here, as a key it
		// did not know). Redis counts its yield record at what it kept,
		// so the pool leaves it no more, and its starved peers ask again
		// and again (such a key, then wanting 34/s, was denied everything
		// for good while its peers leased the whole rate). It decides as
		// an exact user from now on: its next take drops the record and
		// has it counted at its demand, and it leaves for a lease if it
		// is heavy (stepExact).
		e.toExact(now, st.Key, le, markExactDropLease)
		return calls
	}
	if denied && e.ignoreDenial(now, st, le, def) {
		denied = false // what it kept serves it (sparseDenial)
	}
	if d := le.demandNow * headroom; !denied && !le.wantsLease && le.measured && now.Sub(le.askedAt) < life/2 &&
		d < le.granted*yieldLower && le.demand.lastAt() == now && le.measuredOn &&
		e.shares.Assign(now, st.Key, e.yieldShare(d, n), now.Add(2*life)) {
		// It kept more than it needs (a young key yields on what its
		// first requests showed): lower to what it measured, then say so,
		// to Redis and to the peers (freed), which take the difference.
		// Only at a measurement (once a second, see measure) resting on
		// fallTokens decisions or more: a client's burst and the quiet
		// after it say nothing of its rate.
		le.granted, le.renewAt = d, now
		e.frees = append(e.frees, st.Key)
	}
	switch {
	case (denied || (le.wantsLease && !now.Before(le.renewAt))) && now.Sub(le.sentAt) > 0:
		// Raise only after a grant: it keeps what it kept until then, and
		// asks again at the next tick if the request fails.
		le.wantsLease = true
		return append(calls, e.leaseCall(now, n, def, st, le))
	case now.Sub(le.askedAt) < life/2:
		if !now.Before(le.renewAt) {
			le.renewAt = now.Add(e.t.tick) // until answered
			le.sentAt = now
			req := e.request(st.Key, le.granted, n, life)
			req.Yield, req.Running, req.RunningFor = true, le.granted, life
			// With split bursts a yield gives up rate, not its default
			// part of the burst: its record keeps that part counted (at
			// least what it runs, which is less), so that when its clients
			// come back and it asks for a lease, the part is there for it,
			// not held by the asker until the asker renews (pulse with
			// Poisson arrivals: 0.96 against 0.99 when yields recorded only
			// what they run). Not with exact bursts, whose keys start
			// exact: the part would be taken from the pool they use
			// (keys with exact bursts: 0.976 against 0.988).
			b := e.yieldBurst(le.granted, n)
			req.WantBurst, req.RunningBurst = b, b
			return append(calls, call{req: req, lease: le, kind: callYield})
		}
	case !now.Before(le.renewAt):
		// Nobody asks any more: release the record, and go back to the
		// default share once that is acknowledged and every lease granted
		// against the record has ended.
		le.state, le.renewAt = stateReleasing, now.Add(e.t.tick)
		return append(calls, e.release(st.Key, n, le))
	}
	return calls
}

// stepExact moves an exact key back to its share when its demand falls
// well below it, or asks for a lease when its demand is far above it.
func (e *engine) stepExact(now instant, n int, def float64, st *local.KeyStats, le *lease, calls []call) []call {
	if now.Before(le.renewAt) {
		return calls
	}
	d, tokens, span := le.demand.measured(now, st, def)
	if e.exactBursts || now.Sub(le.demand.lastAt()) >= exactSampleEvery {
		// With split bursts, a sample a second: the window's samples then
		// span seconds, enough to show a key of a request or two a second
		// light beyond chance. At one per look they spanned 1.6 s, where a
		// light key shows a few tokens, never enough: it stayed exact,
		// counted at its default share, for good.
		le.demand.record(now, st.Attempted)
	}
	le.renewAt = now.Add(e.t.contendedTTL / renewDivisor)
	if e.exactBursts {
		// Exact is where these keys live. They move to a lease after the
		// same pause as below.
		if !e.exactLeaves(d, tokens, span, def) {
			return calls
		}
		le.state = stateLeaving
		if st.Mark == markExactDropLease {
			// Its takes drop a lease record: one that lands after the
			// lease request would drop the new lease. From now on they
			// keep it, and the request waits until those sent before
			// have ended.
			e.shares.SetMark(st.Key, markExact)
			le.renewAt = now.Add(e.t.redisTimeout + e.t.tick)
			return calls
		}
		le.renewAt = now
		return e.stepLeaving(now, n, def, st, le, calls)
	}
	if d*headroom > def*exactAskAbove && now.Sub(le.askedPeers) >= askEvery && !e.degraded {
		// It wants far more than its share, so its traffic concentrates
		// here: keep asking the peers to yield theirs (no Redis), as a
		// starved lease does. The pool is what the leases and the
		// instances without a record leave, so what they yield goes to
		// it. Asked once, when the key's share first denied a request,
		// peers whose demand was not measured yet kept their shares, and
		// the key stayed at its own for good (a key 60/40 over four
		// instances at 1.2x its limit: 0.73 of an exact bucket in some
		// runs, 0.94 in others).
		e.asks = append(e.asks, st.Key)
		le.askedPeers = now
	}
	// Light or heavy only beyond chance (surelyBelow): a key that wants a
	// few requests a second, sprayed over the instances, sees a second
	// here with a request or none now and then, and each move out and
	// back costs it the pool's burst and Redis three commands. A key too
	// sparse to show either leaves once idle.
	// Not while the default share's part of the burst is under a token (a
	// burst below the instance count): the share would admit nothing, and
	// the key would wait out the release of its record, counted at that
	// share, while the others' pool went without it.
	// A key a few times lighter than that, at a request a second or so,
	// shows a handful of tokens over its window of seconds, never surely
	// below; over its life, tens of seconds, it does, if its window agrees
	// (a key at 0.7/s against a share of 2.5/s stayed exact for good,
	// counted at that share, while a peer wanting 18/s of a 10/s limit ran
	// 6/s: 0.79-0.80 of an exact bucket; leaving, and then yielding,
	// 0.87-0.92).
	light := !e.tokenless(def) && d*headroom < def*exactLeaveBelow &&
		(surelyBelow(tokens, span, def*exactLeaveBelow/headroom) || e.lightOverLife(now, st, def))
	heavy := e.exactHeavy(d, def, tokens, span)
	if now.Sub(e.clock.instant(st.LastSeen)) < e.t.uncontendedTTL/renewDivisor && !light && !heavy {
		return calls
	}
	// Idle, or so light that its share serves it, or so heavy that a
	// lease would: leave through the share placement. Lower first: the
	// key decides nothing until the release is acknowledged, which is
	// sent once any exact decision still on its way has ended (a take
	// after the release would record the key as exact again).
	e.shares.SetMark(st.Key, 0)
	e.shares.Assign(now, st.Key, local.Share{}, now.Add(e.t.uncontendedTTL))
	le.state, le.renewAt = stateReleasing, now.Add(e.t.redisTimeout+e.t.tick)
	return calls
}

// stepLeaving asks for the lease of a key on its way from the exact
// placement, once due, and again at every tick until a grant is in force.
// The key keeps deciding exactly meanwhile: Redis counts it as an exact
// user until the lease request turns that record into a lease record, and
// at the lease from then on, while its takes keep and count that lease.
func (e *engine) stepLeaving(now instant, n int, def float64, st *local.KeyStats, le *lease, calls []call) []call {
	if now.Before(le.renewAt) {
		return calls
	}
	c := e.leaseCall(now, n, def, st, le)
	// It runs nothing locally until the grant is in force. What the pool
	// holds for it comes along with the grant (a client's burst goes on).
	c.req.Running, c.req.RunningFor, c.req.Held = 0, 0, false
	c.req.Drain = e.burst
	le.renewAt = now.Add(e.t.tick)
	return append(calls, c)
}

// toExact moves key to the exact placement at now with mark (markExact, or
// markExactDropLease for a key that stopped running a lease): it decides
// nothing locally from then on.
func (e *engine) toExact(now instant, key string, le *lease, mark uint8) {
	e.shares.Assign(now, key, local.Share{}, now.Add(e.t.uncontendedTTL))
	e.shares.SetMark(key, mark)
	le.state, le.renewAt, le.granted = stateExact, now.Add(e.t.contendedTTL), 0
}

// returned puts a released key where it lives without a record: its
// default share, or, with exact bursts, the exact placement.
func (e *engine) returned(now instant, key string, le *lease) {
	le.returning, le.granted = false, 0
	if e.exactBursts && !e.degraded {
		e.toExact(now, key, le, markExact)
		return
	}
	le.state = stateDefault
	e.shares.SetMark(key, 0)
	e.shares.Unassign(now, key)
}

// leaseCall builds the lease request of a key and records it as sent.
func (e *engine) leaseCall(now instant, n int, def float64, st *local.KeyStats, le *lease) call {
	return call{req: e.renewal(now, n, st, le, def), lease: le}
}

// due reports whether a leased key's request is due at now: on schedule,
// or early when its demand moved far from its grant.
func (e *engine) due(now instant, st *local.KeyStats, le *lease, def float64) bool {
	elapsed := now.Sub(le.sentAt)
	switch {
	case elapsed <= 0:
		return false
	case !now.Before(le.renewAt):
		return true
	case elapsed < soonTicks*e.t.tick:
		return false
	case le.contended && le.fair >= le.lastWant*settledFair &&
		e.demandNow(now, st, le, def)*headroom > le.lastWant*settledGrow:
		// It was granted its whole want, and its demand grew well past it:
		// the want is what holds it back, so it asks again at once.
		return true
	case elapsed < earlyEvery*e.t.tick:
		return false
	case !le.contended:
		// Demand outgrew an uncontended grant: ask now.
		demand := float64(st.Attempted-le.attemptedAt) / elapsed.Seconds()
		return demand > le.granted*earlyGrowth
	case le.settled():
		// A settled contended lease renews rarely; ask now if this
		// instance's demand fell enough to free part of its share.
		return le.demand.rate(now, st, def)*headroom < le.granted*settledShrink
	}
	return false
}

// heldYields reports whether a held contended key, due to renew, serves
// its clients as well yielded, and what it keeps then: its demand with
// headroom, measured over a second and heldYieldTokens decisions or more
// (over its life on this instance if its window holds fewer: a window of
// eight renewals of a contended lease spans about 2.4 s), is within its
// grant and below yieldBelow of its default share, a peer asked it to
// yield lately, and the yield record's part of the burst is within the one
// its grant holds (split bursts only; with exact bursts a light instance
// decides exactly). Such a key is a light instance of a key
// that a peer wants far more of: as a contended lease it renews every few
// ticks for as long as the peer is starved, while a yield record lasts
// yieldLife UncontendedTTLs and renews at a third of that while the peers
// ask. It asks for a lease again once its share denies a request. (A key
// at 1.3x its limit of 400/s, 60% of it on one of sixteen instances: 101
// Redis commands per 1000 decisions as contended leases, 37 yielded, at
// the same accuracy.)
func (e *engine) heldYields(now instant, n int, def float64, st *local.KeyStats, le *lease) (float64, bool) {
	if e.exactBursts || e.degraded || !le.contended || le.askedAt.IsZero() ||
		now.Sub(le.askedAt) >= e.t.uncontendedTTL*yieldLife/2 {
		return 0, false
	}
	d, tokens, span := le.demand.measured(now, st, def)
	if tokens < heldYieldTokens {
		d, tokens, span = lifeDemand(now, st, &e.clock)
	}
	kept := d * headroom
	if span < time.Second || tokens < heldYieldTokens || kept >= def*yieldBelow || kept > le.granted {
		return 0, false
	}
	if b := e.yieldBurst(kept, n); b > float64(le.burst) {
		return 0, false
	}
	return kept, true
}

// lightOverLife reports whether an exact key's demand over its life at now
// is below exactLeaveBelow of its default share def, with headroom,
// beyond chance (surelyBelow).
func (e *engine) lightOverLife(now instant, st *local.KeyStats, def float64) bool {
	d, tokens, span := lifeDemand(now, st, &e.clock)
	return d*headroom < def*exactLeaveBelow && surelyBelow(tokens, span, def*exactLeaveBelow/headroom)
}

// sparseDenial reports whether a denial at now of a key in the share
// placement, or yielded, says nothing of its demand, so that the key asks
// for nothing: its window holds fewer than heldYieldTokens decisions, and
// over its life on this instance, a second or more, it wants less than
// yieldBelow of its default share def with headroom, and, yielded, no more
// than it kept with headroom. Its bucket, refilling at what it runs,
// serves such a key, which sees a request every second or more. The
// request found the bucket empty because the key came back from the
// exact placement with none, or yielded while it was low: that is no
// rate. Asking for a lease with the want of a request over a tick, the
// key was answered contended and went exact (a part of the burst under
// exactBurstBelow tokens), where Redis counts it at its default share, and
// it left again with an empty bucket, round after round: 3 keys at 3/s,
// burst 6, 80% of 2x their limit on one of six instances, were 0.49-0.69
// of an exact bucket after 20 s, at 780-1 050 commands per 1000
// decisions; without the round (and with yieldDemand), 0.73-0.78 at
// 590-690, and 0.64-0.71 at 630-670 with ignoreDenial's cap.
func (e *engine) sparseDenial(now instant, st *local.KeyStats, le *lease, def float64) bool {
	if _, tokens, _ := le.demand.measured(now, st, def); tokens >= heldYieldTokens {
		return false
	}
	d, ok := lifeRate(now, st, &e.clock)
	if !ok || d*headroom >= def*yieldBelow {
		return false
	}
	return le.state == stateDefault || d <= le.granted*headroom
}

// ignoreDenial reports whether the key asks for nothing after a denial at
// now that sparseDenial says nothing of its demand, and counts it: at most
// ignoredDenials in a row, after which the key asks, as it does at any
// denial sparseDenial does not pass. Its life rate lags a demand that grew
// after a long light life (a key yielded to 0.55/s after 40 s at 0.5/s
// that then sees a request every 700 ms passes sparseDenial for 7 s, one
// every 1.5 s for over a minute, denied all along); a key its bucket serves
// is denied rarely, only when it came back with an empty bucket.
func (e *engine) ignoreDenial(now instant, st *local.KeyStats, le *lease, def float64) bool {
	if le.ignored >= ignoredDenials || !e.sparseDenial(now, st, le, def) {
		le.ignored = 0
		return false
	}
	le.ignored++
	return true
}

// lifeRate is a key's rate over its life on this instance at now, false
// until that is a second or more: its decisions over the time since its
// first, and no more than the gaps between its decisions show (a key's
// first decision is where its life starts, not a request of a second
// before, see demandWindow.measured).
func lifeRate(now instant, st *local.KeyStats, clock *epoch) (float64, bool) {
	d, tokens, span := lifeDemand(now, st, clock)
	if tokens == 0 || span < time.Second {
		return 0, false
	}
	if gaps := st.LastSeen.Sub(st.Created); tokens > 1 && gaps > 0 {
		d = min(d, float64(tokens-1)/gaps.Seconds())
	}
	return d, true
}

// lifeDemand is a key's demand over its life on this instance: the tokens
// asked for since its first decision, over the time since.
func lifeDemand(now instant, st *local.KeyStats, clock *epoch) (float64, int64, time.Duration) {
	span := now.Sub(clock.instant(st.Created))
	if span <= 0 {
		return 0, 0, 0
	}
	return float64(st.Attempted) / span.Seconds(), st.Attempted, span
}

// yieldHeld moves a held key to the yielded state at kept, at most its
// grant: lower first, locally, then record the yield. heldYields saw that
// the record's part of the burst is within the grant's, which Redis counts
// until the record is written.
func (e *engine) yieldHeld(now instant, n int, def float64, st *local.KeyStats, le *lease, kept float64, calls []call) []call {
	life := e.t.uncontendedTTL * yieldLife
	s := e.yieldShare(kept, n)
	s.Burst = min(s.Burst, int(le.burst))
	if !e.shares.Assign(now, st.Key, runnable(s, float64(le.burst)), now.Add(2*life)) {
		return calls
	}
	le.state, le.granted, le.until, le.contended, le.stable, le.askGap = stateYielded, kept, 0, false, 0, 0
	le.renewAt = now
	return e.stepYielded(now, n, def, st, le, false, calls)
}

// idle stops renewing a key that has gone idle and releases its record.
// The key runs the smaller of its grant and its default share until the
// release is acknowledged: Redis may hold a smaller record of it until then.
func (e *engine) idle(now instant, n int, st *local.KeyStats, le *lease, calls []call) []call {
	// Decisions since the last request are not news.
	le.attemptedAt = st.Attempted
	if !e.exactBursts && now.Sub(le.askedAt) < e.t.uncontendedTTL*yieldLife/2 {
		// A peer asked for this key lately: rather than take its default
		// share back, give everything up, first here, then in Redis.
		e.shares.Assign(now, st.Key, local.Share{}, now.Add(2*e.t.uncontendedTTL*yieldLife))
		le.state, le.granted, le.until, le.contended, le.stable = stateYielded, 0, 0, false, 0
		le.renewAt = now
		return e.stepYielded(now, n, e.rate/float64(n), st, le, false, calls)
	}
	// Lower first: once Redis has the release it counts this instance at
	// its default share at most.
	def := e.rate / float64(n)
	e.shares.Assign(now, st.Key, e.heldShare(min(le.granted, def), le), le.until)
	le.state, le.renewAt = stateReleasing, now.Add(e.t.tick)
	return append(calls, e.release(st.Key, n, le))
}

// renewal builds the lease request of a due key and records it as sent at
// now.
func (e *engine) renewal(now instant, n int, st *local.KeyStats, le *lease, def float64) global.LeaseRequest {
	want := max(e.demandNow(now, st, le, def)*headroom, e.rate*minWantFraction)
	if le.state == stateDefault || le.state == stateAsking {
		// Its default share turned requests away: it wants more than
		// that, whatever its few decisions so far measure.
		want = max(want, def*headroom)
	}
	le.demand.record(now, st.Attempted)
	// A key's first lease is asked for as uncontended: most keys are, and a
	// contended one renews soonTicks later anyway.
	ttl := e.t.uncontendedTTL
	if le.state != stateDefault && le.contended {
		// A contended lease whose share has settled grows its lifetime
		// settledGrowth times at each further unchanged renewal, up to an
		// uncontended lease's: Redis commands then follow the keys whose
		// shares move, not every contended key.
		ttl = e.t.contendedTTL
		for range max(int(le.stable)-settleAfter+1, 0) {
			if ttl >= e.t.uncontendedTTL {
				break
			}
			ttl *= settledGrowth
		}
		ttl = min(ttl, e.t.uncontendedTTL)
	}
	req := e.request(st.Key, want, n, ttl)
	// Until the answer arrives (if ever) the key runs what it runs now:
	// Redis counts that until it ends, or, for the default share, until
	// the new record ends, after which the key is unrecorded and counted
	// at that share again.
	running, held := le.running(def)
	req.Running, req.Held = running, held
	req.WantBurst, req.RunningBurst = e.wantBurst(want, n), runningBurst(st, le)
	// Demand above what the key runs that is younger than youngFor takes
	// only what the others leave: cutting them for it would lose more
	// than it brings if it ends soon. Not for a limit whose default share
	// splits the burst below exactBurstBelow: its contended keys go to the
	// exact placement, where what a young want holds back is the move.
	switch {
	case want <= running*headroom+e.rate*minWantFraction:
		// Within what it runs, give or take the headroom and the least
		// want: a key at a grant of 0 that asks for the least want does
		// not want more.
		le.wantsMoreAt = 0
	case le.wantsMoreAt.IsZero():
		le.wantsMoreAt = now
	}
	req.Young = !le.wantsMoreAt.IsZero() && now.Sub(le.wantsMoreAt) < e.youngFor() &&
		e.share(def).Burst >= exactBurstBelow
	switch le.state {
	case stateHeld:
		req.RunningFor = le.until.Sub(now)
	default:
		req.RunningFor = ttl
	}
	if le.state == stateDefault {
		le.state = stateAsking
	}
	le.lastWant, le.sentAt, le.attemptedAt = want, now, st.Attempted
	return req
}

// answered puts the answer res to c, sent at sent, in force at at. It
// reports whether the key's local limiter took a grant, and whether the
// key had been failing until this answer.
func (e *engine) answered(atTime, sentTime time.Time, c *call, res *global.Lease) (assigned, recovered bool) {
	at, sent := e.clock.instant(atTime), e.clock.instant(sentTime)
	le := c.lease
	recovered = e.setFailed(c.req.Key, le, false)
	switch c.kind {
	case callRelease:
		if le.state == stateReleasing && !le.returning {
			// Leases granted while Redis counted this instance at its
			// record may run until ReturnAfter: until then it runs no
			// more than that record.
			le.returning, le.until = true, at.Add(res.In)
			le.contended, le.stable = false, 0
			e.shares.SetMark(c.req.Key, 0)
			if res.In <= 0 {
				e.returned(at, c.req.Key, le)
			}
		}
		return false, recovered
	case callYield:
		if le.state == stateYielded {
			life := e.t.uncontendedTTL * yieldLife
			// Redis wrote the record no later than now: it has certainly
			// ended one lifetime from now.
			le.until = at.Add(life)
			le.renewAt = sent.Add(life / 3)
			e.shares.Assign(at, c.req.Key, e.yieldShare(le.granted, c.req.Instances), le.until)
		}
		return false, recovered
	}
	return e.granted(at, sent, c, res), recovered
}

// granted puts a lease grant in force, or moves the key to the exact
// placement when the grant would split the burst too finely.
func (e *engine) granted(at, sent instant, c *call, res *global.Lease) bool {
	le := c.lease
	le.wantsLease = false
	first := le.state != stateHeld && le.granted == 0
	settled := res.Contended && res.Granted >= res.Fair*settledFair && le.granted > 0 &&
		math.Abs(res.Granted-le.granted) <= settledWithin*le.granted
	if settled {
		if le.stable < math.MaxInt16 {
			le.stable++
		}
	} else {
		le.stable = 0
	}
	moved := math.Abs(res.Granted-le.granted) > le.granted*0.01
	le.granted, le.fair, le.contended = res.Granted, res.Fair, res.Contended
	le.unrecorded = res.Unrecorded > 0
	le.until = sent.Add(time.Duration(float64(c.req.TTL) * endEarly))
	le.renewAt = sent.Add(e.renewIn(c.req.TTL, res, first, settled))
	if le.askGap > 0 {
		// It asked its peers to yield: look again soon for what they
		// gave, backing off while they give nothing (they need it).
		if moved {
			le.askGap = soonTicks
		} else {
			le.askGap = min(le.askGap*2, maxAskGap)
		}
		le.renewAt = minTime(le.renewAt, sent.Add(time.Duration(le.askGap)*e.t.tick))
	}
	if c.req.Running-res.Granted > ackShrink*e.rate {
		// Redis counts this instance at what it ran when it asked, until
		// that ends: now that the smaller grant is in force, say so, so
		// that what it gave up goes to the others.
		// At the next tick: the loop's ticks are about a tick after sent.
		le.renewAt = sent.Add(e.t.tick / 2)
	}
	// The grant holds the part of the burst Redis gave it, counted apart
	// from the rate (request gives the limit's burst): rounded down, and
	// none if the answer has none.
	share := local.Share{Limit: rate.Limit(res.Granted), Burst: int(math.Floor(max(res.Burst, 0) + 1e-9))}
	// The fair share's part of the burst says whether the split is too
	// fine, not the grant: a grant starved until others shrink is not.
	// Only an instance that wants more than its default share moves: one
	// that wants less is served by its lease, and would hand its share to
	// the pool for nothing.
	def := e.rate / float64(c.req.Instances)
	// A grant of a rate with less than a whole token of the burst cannot
	// admit at that rate here: a bucket needs a token to admit anything,
	// and running one that Redis did not grant would put the burst parts
	// run above the burst (the others are granted what this grant leaves).
	// Where the default share's part is under a token too (a burst below
	// the instance count), no lease will ever hold one: the key decides
	// against the pool, which holds the tokens. Otherwise the others hold
	// nearly all of the burst for now (a young or starved grant): the key
	// admits nothing until a grant with a token, and asks again soon.
	noToken := share.Limit > 0 && share.Burst < 1
	share = runnable(share, max(res.Burst, 0))
	if noToken && !e.tokenless(def) {
		le.renewAt = minTime(le.renewAt, sent.Add(soonTicks*e.t.tick))
	}
	if (noToken && e.tokenless(def)) || (res.Contended && c.req.Want > def && e.exactSuits(res.Fair, c.req.Want)) {
		// Lower first (the key stops running its grant), then the first
		// exact decision tells Redis, which drops the lease record then.
		e.toExact(at, c.req.Key, le, markExactDropLease)
		return false
	}
	leaving := le.state == stateLeaving
	e.shares.SetMark(c.req.Key, 0)
	if e.shares.Assign(at, c.req.Key, share, le.until) {
		le.burst = uint16(min(share.Burst, math.MaxUint16))
		if leaving {
			// The tokens the exact pool held for it, now its own, and
			// any credit it holds.
			e.shares.Give(at, c.req.Key, res.Drained)
		}
		le.state = stateHeld
		return true
	}
	return false
}

// renewIn is how long after its request a grant renews.
func (e *engine) renewIn(ttl time.Duration, res *global.Lease, first, settled bool) time.Duration {
	switch {
	case res.Contended && (first || starved(res.Granted, res.Fair, e.rate)):
		// A first grant, or a starved one, waits for the others to say what
		// they want or to free what they hold: ask again soon.
		return soonTicks * e.t.tick
	case res.Contended && !settled:
		// A share that moved renews on the contended schedule, even if this
		// request was for a longer, settled lease.
		return min(ttl, e.t.contendedTTL) / renewDivisor
	}
	return ttl / renewDivisor
}

// couldFree reports whether a held key's demand now, with headroom, is
// below its grant by more than ackShrink of the rate: what a renewal now
// would give the peer that asked. A key that is not held, or whose stats
// are gone, renews as before, and so does every key of a limit with exact
// bursts: there, renewing on each ask keeps a busy key's leases full
// (without it, balanced with exact bursts measured 0.985-0.990 of an exact
// bucket in three runs, against 1.000, and the outage scenario 0.80 in
// three of three, against 0.82-1.00). On sweeps of slow keys, where a
// starved peer's asks made each light instance renew every few ticks: a
// 10/s key 90% on one of four instances, 662 -> 475 Redis commands per
// 1000 decisions at the same accuracy.
func (e *engine) couldFree(now instant, key string, le *lease, def float64) bool {
	if e.exactBursts || le.state != stateHeld {
		return true
	}
	st, ok := e.shares.Stats(key)
	if !ok {
		return true
	}
	return le.granted-e.demandNow(now, &st, le, def)*headroom > ackShrink*e.rate
}

// yieldAsked handles a peer's ask to give up the unused default share of
// key at now: a key this instance does not know is lowered to nothing, one
// whose demand is well below its share to that demand, first here and then
// in Redis at the next tick; a key that needs its share keeps it.
func (e *engine) yieldAsked(t time.Time, key string, n int) {
	now := e.clock.instant(t)
	if e.degraded {
		// Nothing could be recorded, and no grant could follow.
		return
	}
	def := e.rate / float64(n)
	life := e.t.uncontendedTTL * yieldLife
	le := e.keys[key]
	if le == nil {
		if st, ok := e.shares.Stats(key); ok && !e.tickAt.IsZero() && !e.clock.instant(st.Created).After(e.tickAt) {
			// A key that the last tick left untracked: its demand since
			// its first decision says whether it yields. (A key new
			// since the last tick is unknown to the engine, as it was
			// before keys went untracked: it yields everything.) Its
			// decisions from now on count from its Attempted counter
			// now, a lower bound of what the next tick sees of them.
			le = e.track(now, &st)
			e.measure(now, def, &st, le)
			le.quietAt = st.Attempted
		}
	}
	switch {
	case le == nil:
		// Until the record is written and has ended, a first decision here
		// runs at nothing and asks for a lease.
		if !e.shares.AssignNew(now, key, local.Share{}, now.Add(2*life)) {
			return
		}
		le = &lease{state: stateYielded, sentAt: now}
		le.demand.open(now)
		e.keys[key] = le
	case le.state == stateDefault && !le.measured:
		// Its demand has not been measured over a second yet: the tick
		// (step, right after) yields if what it has seen so far shows it
		// needs little of its share (youngDemand), and so does every tick
		// while the ask stands; until then it keeps its share.
		le.askedAt = now
		return
	case le.state == stateDefault:
		d := e.yieldDemand(now, key, le)
		if d >= def*yieldBelow {
			return
		}
		e.yieldTo(now, key, le, d, n)
		return
	case le.state == stateYielded:
	case le.state == stateHeld || le.state == stateLapsed:
		// A lease renews at once with the demand it has now, so that what
		// it holds and no longer uses goes to the asker, if it holds any
		// (couldFree): a starved peer asks every few ticks; and if it
		// goes idle, or is light, it yields rather than renew or return
		// to its default share.
		le.askedAt = now
		if now.Sub(le.sentAt) >= soonTicks*e.t.tick && e.couldFree(now, key, le, def) {
			le.renewAt = now
		}
		return
	default:
		return
	}
	le.askedAt = now
	if le.until.IsZero() {
		le.renewAt = now
	}
}

// yieldDemand is what a key in the share placement whose demand was
// measured yields to when asked at now: that demand with headroom, and,
// when it rests on fewer than fallTokens decisions, at least the key's
// demand over its life on this instance (a second or more) with headroom.
// A key that sees a request every few seconds measures none in the second
// since its window last started anew (at a tick without a decision, see
// measure): it yielded everything, and its next request was denied.
func (e *engine) yieldDemand(now instant, key string, le *lease) float64 {
	d := le.demandNow * headroom
	if le.measuredOn {
		return d
	}
	st, ok := e.shares.Stats(key)
	if !ok {
		return d
	}
	if life, ok := lifeRate(now, &st, &e.clock); ok {
		d = max(d, life*headroom)
	}
	return d
}

// yieldTo lowers a key in the share placement to d, asked at now by a
// peer, and has it record the yield at once: lower before telling.
func (e *engine) yieldTo(now instant, key string, le *lease, d float64, n int) {
	if !e.shares.Assign(now, key, e.yieldShare(d, n), now.Add(2*e.t.uncontendedTTL*yieldLife)) {
		return
	}
	le.state, le.granted, le.until = stateYielded, d, 0
	le.askedAt, le.renewAt = now, now
}

// exactSuits reports whether the exact placement serves a key better than
// a lease of fair with want (its demand with headroom): fair's part of the
// burst splits too finely (below exactBurstBelow tokens), and the demand
// is not so far above fair (exactDemandUpTo times) that a lease, cut at
// its part of the burst, admits as well for far fewer commands.
func (e *engine) exactSuits(fair, want float64) bool {
	return e.share(fair).Burst < exactBurstBelow && want <= fair*exactDemandUpTo*headroom
}

// youngDemand is what a key in the share placement whose demand has not
// been measured over a second yet is taken to need at now, with headroom,
// or false while its window w is younger than youngYieldAfter: its
// requests since w opened plus youngSlack more, over w's age. A peer that asks it to yield then
// need not wait for a second of measurement (a fresh key's heavy instance
// would run its default share until then), while a key that has seen a
// request or two keeps its share.
func youngDemand(now instant, st *local.KeyStats, w *demandWindow) (float64, bool) {
	age := now.Sub(w.opened())
	if age < youngYieldAfter {
		return 0, false
	}
	return (float64(w.since(0, st.Attempted)) + youngSlack) / age.Seconds() * headroom, true
}

// failed records that c, sent at sent, got no answer: the key tries again
// at the next tick, its grant stays in force until it ends, and it runs the
// smaller of that and its default share after that. It reports whether the
// key starts failing.
func (e *engine) failed(sent time.Time, c *call) bool {
	c.lease.renewAt = e.clock.instant(sent).Add(e.t.tick)
	return e.setFailed(c.req.Key, c.lease, true)
}

// setFailed marks key failing or not and reports whether that changed (the
// limit counts its failing keys for Status and logs).
func (e *engine) setFailed(key string, le *lease, on bool) bool {
	if le.failed == on {
		return false
	}
	le.failed = on
	return true
}

// evict forgets key, which the local limiter evicted, and appends its
// release to calls if Redis may hold a record of it. It reports whether the
// key was failing. An untracked key of a limit with exact bursts sends no
// release: its record, if any, ends UncontendedTTL after its last take.
func (e *engine) evict(key string, n int, calls []call) ([]call, bool) {
	le := e.keys[key]
	if le == nil {
		return calls, false
	}
	delete(e.keys, key)
	if le.state != stateDefault {
		calls = append(calls, e.release(key, n, nil))
	}
	return calls, le.failed
}

// compact gives back the memory of evicted keys once most are gone.
func (e *engine) compact() { e.keys = shrink.Map(e.keys, &e.size) }

// resettle makes every settled lease renew at now: the instance count
// changed, so every share is about to move.
func (e *engine) resettle(t time.Time) {
	now := e.clock.instant(t)
	for _, le := range e.keys {
		if le.stable > 0 {
			le.stable = 0
			le.renewAt = now
		}
	}
}

// setLimit makes the engine follow a limit of rate and burst: requests ask
// Redis to split the new rate, and grants carry their part of the new
// burst.
func (e *engine) setLimit(rate float64, burst int, exactBursts bool) {
	e.rate, e.burst, e.exactBursts = rate, burst, exactBursts
}

// renewAll makes every key that holds or asked for a lease ask again at
// now, as a contended key whose share moved: its limit changed.
func (e *engine) renewAll(t time.Time) {
	now := e.clock.instant(t)
	for _, le := range e.keys {
		if le.state != stateDefault {
			le.stable = 0
			le.renewAt = now
		}
	}
}

// drop appends the release of every record Redis may hold, moves every key
// back to its default share at now and forgets them all: the limit stops
// being Hybrid, and its keys stay.
func (e *engine) drop(t time.Time, n int, calls []call) []call {
	now := e.clock.instant(t)
	e.shares.SetNewMark(0)
	marked := e.untrackedMarked()
	for _, k := range marked {
		e.shares.SetMark(k, 0)
		e.shares.Unassign(now, k)
		calls = append(calls, e.release(k, n, nil))
	}
	for k, le := range e.keys {
		if le.state != stateDefault {
			e.shares.SetMark(k, 0)
			e.shares.Unassign(now, k)
		}
	}
	return e.releaseTracked(n, calls)
}

// releaseAll appends the release of every record Redis may hold and forgets
// every key.
func (e *engine) releaseAll(n int, calls []call) []call {
	for _, k := range e.untrackedMarked() {
		calls = append(calls, e.release(k, n, nil))
	}
	return e.releaseTracked(n, calls)
}

// releaseTracked appends the release of every record Redis may hold of a
// key the engine tracks, and forgets every key.
func (e *engine) releaseTracked(n int, calls []call) []call {
	for k, le := range e.keys {
		if le.state != stateDefault {
			calls = append(calls, e.release(k, n, nil))
		}
	}
	clear(e.keys)
	return calls
}

func minTime(a, b instant) instant {
	if b.Before(a) {
		return b
	}
	return a
}
