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
	// settledFair of it) before its lease lifetime starts to grow, doubling
	// at each further one (at most maxDoublings times, and never beyond
	// UncontendedTTL).
	settleAfter   = 3
	settledWithin = 0.01
	settledFair   = 0.99
	maxDoublings  = 16
	// starvedFair: a contended grant below this part of its fair share
	// means others still hold more than theirs until their next renewal;
	// such a key, and a key's first contended grant, ask again after
	// soonTicks ticks to pick up what they free.
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

// keyState is where one key's lease stands on this instance.
type keyState uint8

const (
	// stateDefault: no lease asked for; the key runs its default share. A
	// new key, or one that went idle and let its lease go.
	stateDefault keyState = iota
	// stateAsking: a lease was asked for and no grant has been in force
	// since: the first answer is on its way, was lost, or failed.
	stateAsking
	// stateHeld: a grant is in force until lease.until.
	stateHeld
	// stateLapsed: the last grant ran out before a renewal was answered;
	// the key runs its default share, or its outage policy if flagged.
	stateLapsed
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
	}
	return fmt.Sprintf("keyState(%d)", int(s))
}

// lease is this instance's view of one key's rate lease.
type lease struct {
	state keyState
	// failed: the last request for this key failed on its own. Orthogonal
	// to state: a held grant stays in force until it ends, and the key is
	// flagged so that it follows the outage policy after that.
	failed bool
	// The last grant: its rate and this instance's fair share, both in
	// tokens per second, and whether the key's instances want more than its
	// rate (contended).
	granted, fair float64
	contended     bool
	stable        int       // contended renewals in a row that changed nothing
	until         time.Time // local end of the grant
	renewAt       time.Time // when the next renewal is due
	lastWant      float64   // the want of the last request
	sentAt        time.Time // when the last request went out
	attemptedAt   int64     // the key's Attempted counter at sentAt
	demand        demandWindow
}

// settled reports whether the key's contended share has stopped moving.
func (le *lease) settled() bool { return le.stable >= settleAfter }

// keyShares puts the engine's decisions into force in the keys' local
// limiters. *local.Limiter implements it.
type keyShares interface {
	Assign(t time.Time, key string, s local.Share, until time.Time) bool
	Unassign(t time.Time, key string) bool
	SetFlag(key string, on bool) bool
}

// timings are the lease loop's periods, see Config.
type timings struct {
	tick, contendedTTL, uncontendedTTL time.Duration
}

// engine is the lease policy of one Hybrid limit. It is not safe for
// concurrent use: the loop goroutine owns it.
type engine struct {
	limit, instance string
	rate            float64
	burst           int
	t               timings
	shares          keyShares

	keys map[string]*lease
	size shrink.Tracker // of keys
}

func newEngine(limit Limit, instance string, t timings, shares keyShares) *engine {
	return &engine{
		limit: limit.Name, instance: instance, rate: limit.Rate, burst: limit.Burst,
		t: t, shares: shares, keys: make(map[string]*lease),
	}
}

// call is one lease request the engine wants sent, with the lease it is for
// (nil for a release, which needs no answer).
type call struct {
	req   global.LeaseRequest
	lease *lease
}

// tickStats sums up a limit's leases at a tick, for its gauges.
type tickStats struct {
	leased    float64 // tokens/s held by grants in force
	contended int     // keys with a contended grant in force
	expired   int     // grants that ran out since the last tick
}

// request builds the lease request of one key. Instances that hold no lease
// on the key yet are counted at rate/N for UncontendedTTL after its lease
// hash is created (or re-created, after a FLUSHALL or a restart): every live
// instance renews within half that, so none can be running on a share Redis
// does not know of by then.
func (e *engine) request(key string, want float64, n int, ttl time.Duration) global.LeaseRequest {
	return global.LeaseRequest{
		Limit: e.limit, Key: key, Instance: e.instance,
		Want: want, Rate: e.rate, Instances: n, TTL: ttl, Cold: e.t.uncontendedTTL,
	}
}

// release builds the request that gives key's lease back.
func (e *engine) release(key string, n int) call {
	return call{req: e.request(key, 0, n, e.t.contendedTTL)}
}

// collect appends to calls the requests due at now for the keys in stats
// (a snapshot of the limit's keys), n being the live instance count, and
// returns them with the limit's gauges.
func (e *engine) collect(now time.Time, n int, stats []local.KeyStats, calls []call) ([]call, tickStats) {
	var ts tickStats
	def := e.rate / float64(n)
	for i := range stats {
		st := &stats[i]
		le := e.keys[st.Key]
		if le == nil {
			le = &lease{sentAt: st.Created}
			le.demand.open(st.Created)
			e.keys[st.Key] = le
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
		if !e.due(now, st, le, def) {
			continue
		}
		if le.state != stateDefault && now.Sub(st.LastSeen) >= e.t.uncontendedTTL/renewDivisor {
			calls = e.idle(now, n, st, le, calls)
			continue
		}
		calls = append(calls, call{req: e.renewal(now, n, st, le, def), lease: le})
	}
	e.size.Grew(len(e.keys))
	return calls, ts
}

// due reports whether key's lease request is due at now: a key without a
// lease asks as soon as it sees decisions, a leased one renews on schedule,
// or early when its demand moved far from its grant.
func (e *engine) due(now time.Time, st *local.KeyStats, le *lease, def float64) bool {
	elapsed := now.Sub(le.sentAt)
	switch {
	case elapsed <= 0:
		return false
	case le.state == stateDefault:
		return st.Attempted > le.attemptedAt
	case !now.Before(le.renewAt):
		return true
	case elapsed < earlyEvery*e.t.tick:
		return false
	case !le.contended:
		// Demand outgrew an uncontended grant: ask now.
		demand := float64(st.Attempted-le.attemptedAt) / elapsed.Seconds()
		return demand > le.granted*earlyGrowth
	case le.settled():
		// A settled contended lease renews rarely; ask now if this
		// instance's demand moved enough to change its share.
		d := le.demand.rate(now, st, def) * headroom
		return d < le.granted*settledShrink || (le.lastWant < le.fair && d > le.lastWant*settledGrow)
	}
	return false
}

// idle stops renewing a key that has gone idle: a contended key gives its
// share back at once, for the others; an uncontended one lets its lease run
// out, which costs no command. The key runs its default share again, and
// asks anew when it is used.
func (e *engine) idle(now time.Time, n int, st *local.KeyStats, le *lease, calls []call) []call {
	if le.contended {
		calls = append(calls, e.release(st.Key, n))
	}
	le.state, le.granted = stateDefault, 0
	// Decisions since the last request are not news: the key asks again
	// only for decisions after this.
	le.attemptedAt = st.Attempted
	e.shares.Unassign(now, st.Key)
	return calls
}

// renewal builds the lease request of a due key and records it as sent at
// now.
func (e *engine) renewal(now time.Time, n int, st *local.KeyStats, le *lease, def float64) global.LeaseRequest {
	want := max(le.demand.rate(now, st, def)*headroom, e.rate*minWantFraction)
	le.demand.record(now, st.Attempted)
	// A key's first lease is asked for as uncontended: most keys are, and a
	// contended one renews soonTicks later anyway.
	ttl := e.t.uncontendedTTL
	if le.state != stateDefault && le.contended {
		// A contended lease whose share has settled doubles its lifetime at
		// each further unchanged renewal, up to an uncontended lease's:
		// Redis commands then follow the keys whose shares move, not every
		// contended key.
		doublings := min(max(le.stable-settleAfter+1, 0), maxDoublings)
		ttl = min(e.t.contendedTTL<<doublings, e.t.uncontendedTTL)
	}
	req := e.request(st.Key, want, n, ttl)
	if le.state == stateHeld {
		// Until the answer arrives (if ever) this grant stays in force:
		// Redis counts it until it ends.
		req.Running, req.RunningFor = le.granted, le.until.Sub(now)
	}
	if le.state == stateDefault {
		le.state = stateAsking
	}
	le.lastWant, le.sentAt, le.attemptedAt = want, now, st.Attempted
	return req
}

// granted puts the answer res to c, sent at sent, in force at at. It reports
// whether the key's local limiter took the grant, and whether the key had
// been failing until this answer.
func (e *engine) granted(at, sent time.Time, c *call, res *global.Lease) (assigned, recovered bool) {
	le := c.lease
	recovered = e.setFailed(c.req.Key, le, false)
	first := le.state != stateHeld && le.granted == 0
	settled := res.Contended && res.Granted >= res.Fair*settledFair && le.granted > 0 &&
		math.Abs(res.Granted-le.granted) <= settledWithin*le.granted
	if settled {
		le.stable++
	} else {
		le.stable = 0
	}
	le.granted, le.fair, le.contended = res.Granted, res.Fair, res.Contended
	le.until = sent.Add(time.Duration(float64(c.req.TTL) * endEarly))
	le.renewAt = sent.Add(e.renewIn(c.req.TTL, res, first, settled))
	if c.req.Running-res.Granted > ackShrink*e.rate {
		// Redis counts this instance at the grant it ran when it asked,
		// until that ends: now that the smaller one is in force, say so, so
		// that what it gave up goes to the others.
		le.renewAt = at.Add(e.t.tick)
	}
	share := local.Share{
		Limit: rate.Limit(res.Granted),
		Burst: int(float64(e.burst) * res.Granted / e.rate),
	}
	if e.shares.Assign(at, c.req.Key, share, le.until) {
		le.state = stateHeld
		return true, recovered
	}
	return false, recovered
}

// renewIn is how long after its request a grant renews.
func (e *engine) renewIn(ttl time.Duration, res *global.Lease, first, settled bool) time.Duration {
	switch {
	case res.Contended && (first || res.Granted < res.Fair*starvedFair):
		// The first grant counts instances not heard from yet at rate/N, and
		// a starved one waits for others to shrink: they will soon say what
		// they want or free what they hold, so ask again soon.
		return soonTicks * e.t.tick
	case res.Contended && !settled:
		// A share that moved renews on the contended schedule, even if this
		// request was for a longer, settled lease.
		return min(ttl, e.t.contendedTTL) / renewDivisor
	}
	return ttl / renewDivisor
}

// failed records that c, sent at sent, got no answer: the key tries again
// at the next tick, its grant stays in force until it ends, and it follows
// the outage policy after that. It reports whether the key starts failing.
func (e *engine) failed(sent time.Time, c *call) bool {
	c.lease.renewAt = sent.Add(e.t.tick)
	return e.setFailed(c.req.Key, c.lease, true)
}

// setFailed flags or unflags key and reports whether that changed.
func (e *engine) setFailed(key string, le *lease, on bool) bool {
	if le.failed == on {
		return false
	}
	le.failed = on
	e.shares.SetFlag(key, on)
	return true
}

// evict forgets key, which the local limiter evicted, and appends its
// release to calls if Redis may hold a lease of it. It reports whether the
// key was failing.
func (e *engine) evict(key string, n int, calls []call) ([]call, bool) {
	le := e.keys[key]
	if le == nil {
		return calls, false
	}
	delete(e.keys, key)
	if le.state != stateDefault {
		calls = append(calls, e.release(key, n))
	}
	return calls, le.failed
}

// compact gives back the memory of evicted keys once most are gone.
func (e *engine) compact() { e.keys = shrink.Map(e.keys, &e.size) }

// resettle makes every settled lease renew at now: the instance count
// changed, so every share is about to move.
func (e *engine) resettle(now time.Time) {
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
func (e *engine) setLimit(rate float64, burst int) {
	e.rate, e.burst = rate, burst
}

// renewAll makes every key that holds or asked for a lease ask again at
// now, as a contended key whose share moved: its limit changed.
func (e *engine) renewAll(now time.Time) {
	for _, le := range e.keys {
		if le.state != stateDefault {
			le.stable = 0
			le.renewAt = now
		}
	}
}

// drop appends the release of every lease Redis may hold, moves every key
// back to its default share at now, unflags the failing ones and forgets
// them all: the limit stops being Hybrid, and its keys stay.
func (e *engine) drop(now time.Time, n int, calls []call) []call {
	for k, le := range e.keys {
		if le.state != stateDefault {
			e.shares.Unassign(now, k)
		}
		if le.failed {
			e.shares.SetFlag(k, false)
		}
	}
	return e.releaseAll(n, calls)
}

// releaseAll appends the release of every lease Redis may hold and forgets
// every key.
func (e *engine) releaseAll(n int, calls []call) []call {
	for k, le := range e.keys {
		if le.state != stateDefault {
			calls = append(calls, e.release(k, n))
		}
	}
	clear(e.keys)
	return calls
}
