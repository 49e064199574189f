package hybrid

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/local"
)

// The placement policy in step tables, as x/time/rate and package local
// are tested: a fixed t0, steps at t0 + k·d, each step one call to the
// engine and what it must return and leave behind. No Redis and no clock:
// the answers are written in the table, and the keys' limiters are real
// local.Limiters driven at the same instants.

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// The limit and timings of every table: 100/s, burst 20, over 4 instances
// (a default share of 25/s, burst 5), the Config defaults for the loop.
const (
	eRate  = 100.0
	eBurst = 20
	eN     = 4
	eDef   = eRate / eN
	eTick  = 50 * time.Millisecond
	eCTTL  = 600 * time.Millisecond
	eUTTL  = 5 * time.Second
	eRTO   = 150 * time.Millisecond
	eLife  = yieldLife * eUTTL // a yield record's lifetime
	ms     = time.Millisecond
)

// rig is one instance's engine and key limiters for one limit.
type rig struct {
	t   *testing.T
	loc *local.Limiter
	eng *engine
	n   int
	// The calls of the last tick, and when they went out: answers go to
	// them.
	pending []call
	sentAt  time.Time
	// What the last answer reported.
	assigned, recovered, failing bool
	expired                      int
}

func newRig(t *testing.T, exactBursts bool) *rig {
	t.Helper()
	return rigFor(t, eRate, eBurst, exactBursts)
}

// rigFor is newRig for a limit of lim tokens per second and burst over eN
// instances.
func rigFor(t *testing.T, lim float64, burst int, exactBursts bool) *rig {
	t.Helper()
	loc, err := local.New(local.Config{Limit: rate.Limit(lim), Burst: burst, Instances: eN})
	if err != nil {
		t.Fatal(err)
	}
	if exactBursts {
		// As New does: from the first decision.
		loc.SetNewMark(markExact)
	}
	r := &rig{t: t, loc: loc, n: eN}
	r.eng = newEngine(Limit{Name: "api", Rate: lim, Burst: burst, ExactBursts: exactBursts}, "me",
		timings{tick: eTick, contendedTTL: eCTTL, uncontendedTTL: eUTTL, redisTimeout: eRTO}, rigShares{r})
	return r
}

// rigShares passes the engine's calls to the rig's limiter.
type rigShares struct{ r *rig }

func (f rigShares) Assign(t time.Time, key string, s local.Share, until time.Time) bool {
	return f.r.loc.Assign(t, key, s, until)
}
func (f rigShares) AssignNew(t time.Time, key string, s local.Share, until time.Time) bool {
	return f.r.loc.AssignNew(t, key, s, until)
}
func (f rigShares) Unassign(t time.Time, key string) bool { return f.r.loc.Unassign(t, key) }
func (f rigShares) SetMark(key string, m uint8) bool      { return f.r.loc.SetMark(key, m) }
func (f rigShares) SetNewMark(m uint8)                    { f.r.loc.SetNewMark(m) }
func (f rigShares) Give(t time.Time, key string, tokens int) bool {
	return f.r.loc.Give(t, key, tokens)
}
func (f rigShares) Stats(key string) (local.KeyStats, bool) { return f.r.loc.Stats(key) }
func (f rigShares) Shards() int                             { return f.r.loc.Shards() }
func (f rigShares) AppendShardStats(i int, dst []local.KeyStats) []local.KeyStats {
	return f.r.loc.AppendShardStats(i, dst)
}

// op is one step's call: it runs at now and returns the lease requests the
// engine made, if any.
type op struct {
	name string
	run  func(r *rig, now time.Time) []call
}

// decide makes k decisions on key "k".
func decide(k int) op {
	return op{fmt.Sprintf("decide(%d)", k), func(r *rig, now time.Time) []call {
		for range k {
			r.loc.Allow(now, "k")
		}
		return nil
	}}
}

// decideOne makes one decision on "k", which must be allowed or not as
// allowed says and carry mark: a marked key is decided in Redis, not here.
func decideOne(allowed bool, mark uint8) op {
	return op{fmt.Sprintf("decideOne(allowed %v, mark %d)", allowed, mark), func(r *rig, now time.Time) []call {
		r.t.Helper()
		if res := r.loc.Allow(now, "k"); res.Allowed != allowed || res.Mark != mark {
			r.t.Fatalf("at %v the decision is %+v; want allowed %v, mark %d", now.Sub(t0), res, allowed, mark)
		}
		return nil
	}}
}

// tick runs one round of the loop: the requests due now.
func tick() op {
	return op{"tick", func(r *rig, now time.Time) []call {
		stats := r.loc.AppendStats(nil)
		calls, ts := r.eng.collect(now, r.n, stats, nil)
		r.expired = ts.expired
		r.pending, r.sentAt = nil, now
		for _, c := range calls {
			if c.lease != nil {
				r.pending = append(r.pending, c)
			}
		}
		return calls
	}}
}

// answer answers the last tick's request of "k" with res, as the loop does.
func answer(name string, res global.Lease) op {
	return op{name, func(r *rig, now time.Time) []call {
		r.assigned, r.recovered = r.eng.answered(now, r.sentAt, r.onlyPending(), &res)
		return nil
	}}
}

// grant answers the last tick's lease request of "k".
func grant(granted, fair float64, contended bool) op {
	return answer(fmt.Sprintf("grant(%v, fair %v, contended %v)", granted, fair, contended),
		global.Lease{Granted: granted, Fair: fair, Contended: contended, Burst: eBurst * granted / eRate})
}

// ack answers the last tick's release of "k": the instance may run its
// default share again in.
func ack(in time.Duration) op {
	return answer(fmt.Sprintf("ack(in %v)", in), global.Lease{In: in})
}

// recorded answers the last tick's yield of "k".
func recorded() op { return answer("recorded", global.Lease{}) }

// fail answers the last tick's request of "k" with a failure: an error, or
// an answer lost on the way, which the loop sees as a timeout.
func fail() op {
	return op{"fail", func(r *rig, now time.Time) []call {
		r.failing = r.eng.failed(r.sentAt, r.onlyPending())
		return nil
	}}
}

// peerAsks hands the engine a peer's ask to yield "k", as the loop does at
// a tick.
func peerAsks() op {
	return op{"peerAsks", func(r *rig, now time.Time) []call {
		r.eng.yieldAsked(now, "k", r.n)
		return nil
	}}
}

// degrade degrades the limit, or restores it, as the loop does before a
// tick.
func degrade(on bool) op {
	return op{fmt.Sprintf("degrade(%v)", on), func(r *rig, now time.Time) []call {
		r.eng.degraded = on
		return nil
	}}
}

// recordEnds checks that the engine takes "k"'s record to have certainly
// ended at t0+at.
func recordEnds(at time.Duration) op {
	return op{fmt.Sprintf("recordEnds(%v)", at), func(r *rig, now time.Time) []call {
		r.t.Helper()
		le := r.eng.keys["k"]
		if le == nil {
			r.t.Fatal("key unknown to the engine")
		}
		if until := r.eng.clock.time(le.until); !until.Equal(t0.Add(at)) {
			r.t.Fatalf("the record of k ends at %v; want %v", until.Sub(t0), at)
		}
		return nil
	}}
}

// evictIdle evicts the keys without a decision for idle, as the loop does.
func evictIdle(idle time.Duration) op {
	return op{fmt.Sprintf("evictIdle(%v)", idle), func(r *rig, now time.Time) []call {
		var calls []call
		for _, k := range r.loc.EvictIdle(now, idle, nil) {
			calls, r.failing = r.eng.evict(k, r.n, calls)
		}
		return calls
	}}
}

// instances changes the instance count N-hat to n, as membership reports
// it (a larger count at once, a smaller one after PeakWindow).
func instances(n int) op {
	return op{fmt.Sprintf("instances(%d)", n), func(r *rig, now time.Time) []call {
		r.n = n
		r.loc.SetInstances(now, n)
		r.eng.resettle(now)
		return nil
	}}
}

func (r *rig) onlyPending() *call {
	r.t.Helper()
	if len(r.pending) != 1 {
		r.t.Fatalf("an answer to %d pending requests; the tables answer exactly one", len(r.pending))
	}
	return &r.pending[0]
}

// req is an expected request of key "k" (Limit, Instance, Rate, MaxTTL and
// ExactBursts are checked once, in checkCalls).
type req struct {
	want        float64
	ttl         time.Duration
	running     float64
	runningFor  time.Duration
	held, yield bool
	kind        callKind
	instances   int // 0 means the rig's
	releaseOnly bool
}

// anyWant in a req leaves its want unchecked: the tables about the
// schedule leave demand to those about demand.
const anyWant = -1

// release is the expected release of "k" that nothing waits on (an
// evicted key's); released is one the key waits on the ack of.
var (
	release  = req{ttl: eCTTL, kind: callRelease, releaseOnly: true}
	released = req{ttl: eCTTL, kind: callRelease}
)

// asking is the request of a key that asks for a lease from the share
// placement: uncontended, saying it runs its default share.
// A key that asks because its default share denied it wants at least that
// share, with headroom, whatever its few decisions measure.
func asking(want float64) req {
	if want != anyWant {
		want = max(want, eDef*headroom)
	}
	return req{want: want, ttl: eUTTL, running: eDef, runningFor: eUTTL}
}

// yielding is the request that records a yield of "k" down to kept.
func yielding(kept float64) req {
	return req{want: kept, ttl: eLife, running: kept, runningFor: eLife, yield: true, kind: callYield}
}

// step is one row of a table: at t0+at, run do; it must return exactly
// calls, and leave "k" in state with its local share and mark.
type step struct {
	at    time.Duration
	do    op
	calls []req
	state keyState
	// share is the share "k" runs at on this instance; zero means the
	// default share, unless none is set: the key admits nothing.
	share local.Share
	none  bool
	mark  uint8
}

// table is a test's steps, with an optional steady load: perTick
// decisions on "k" at every tick instant t0 + k·eTick up to each step's, so
// that the key's demand is a known 20·perTick/s.
type table struct {
	perTick int
	steps   []step
	// after, if set, runs after step i has been checked.
	after func(r *rig, i int)
	// exactBursts runs the table on a limit with Limit.ExactBursts.
	exactBursts bool
}

func run(t *testing.T, tb table) *rig {
	t.Helper()
	r := newRig(t, tb.exactBursts)
	next := t0 // the next tick instant the load has not decided at
	for i, s := range tb.steps {
		now := t0.Add(s.at)
		for ; tb.perTick > 0 && !next.After(now); next = next.Add(eTick) {
			for range tb.perTick {
				r.loc.Allow(next, "k")
			}
		}
		calls := s.do.run(r, now)
		where := fmt.Sprintf("step %d (%v %s)", i, s.at, s.do.name)
		r.checkCalls(where, calls, s.calls)
		r.checkRunningBurst(where, calls)
		r.checkKey(where, now, s)
		if tb.after != nil {
			tb.after(r, i)
		}
	}
	return r
}

// checkRunningBurst checks that every request that asks for or records a
// share says it runs at least the part of the burst its key's bucket runs
// now (lower before telling): Redis counts the instance at that until the
// answer is in force, and the burst parts held never sum above the burst
// only if it does. A key marked for the exact placement runs nothing here.
func (r *rig) checkRunningBurst(where string, calls []call) {
	r.t.Helper()
	for _, c := range calls {
		if c.kind == callRelease || c.req.RunningFor <= 0 {
			continue
		}
		st, ok := r.loc.Stats(c.req.Key)
		if !ok || st.Mark != 0 {
			continue
		}
		if c.req.Burst != eBurst || c.req.RunningBurst < float64(st.Share.Burst) {
			r.t.Fatalf("%s: request %+v says it runs %v tokens of a burst of %d; the key runs %d",
				where, c.req, c.req.RunningBurst, c.req.Burst, st.Share.Burst)
		}
	}
}

func (r *rig) checkCalls(where string, got []call, want []req) {
	r.t.Helper()
	if len(got) != len(want) {
		r.t.Fatalf("%s: %d requests %v; want %d %v", where, len(got), got, len(want), want)
	}
	for i, w := range want {
		g := got[i].req
		n := w.instances
		if n == 0 {
			n = r.n
		}
		ok := g.Key == "k" && g.Limit == "api" && g.Instance == "me" && g.Rate == eRate && g.MaxTTL == eLife && g.ExactBursts == r.eng.exactBursts &&
			g.Instances == n && g.TTL == w.ttl && g.Running == w.running && g.RunningFor == w.runningFor &&
			g.Held == w.held && g.Yield == w.yield && got[i].kind == w.kind &&
			(w.want == anyWant || math.Abs(g.Want-w.want) < 1e-9) && (got[i].lease == nil) == w.releaseOnly
		if !ok {
			r.t.Fatalf("%s: request %d is %v; want %+v", where, i, got[i], w)
		}
	}
}

func (r *rig) checkKey(where string, now time.Time, s step) {
	r.t.Helper()
	le := r.eng.keys["k"]
	// An untracked key is where it started: in the share placement, or
	// exact with exact bursts.
	untracked := stateDefault
	if st, ok := r.loc.Stats("k"); ok && r.eng.exactBursts && st.Mark == markExact {
		untracked = stateExact
	}
	switch {
	case le == nil && s.state != stateDefault && s.state != untracked:
		r.t.Fatalf("%s: key unknown to the engine; want %v", where, s.state)
	case le != nil && le.state != s.state:
		r.t.Fatalf("%s: state %v; want %v", where, le.state, s.state)
	}
	want := s.share
	if want == (local.Share{}) && !s.none {
		want = r.loc.Default()
	}
	for _, st := range r.loc.AppendStats(nil) {
		if st.Key != "k" {
			continue
		}
		share := st.Share
		if !st.Until.IsZero() && !now.Before(st.Until) {
			// Ended: the next decision runs the smaller of it and the
			// default share.
			def := r.loc.Default()
			share = local.Share{Limit: min(share.Limit, def.Limit), Burst: min(share.Burst, def.Burst)}
		}
		if share != want {
			r.t.Fatalf("%s: the key runs at %+v; want %+v", where, share, want)
		}
		if st.Mark != s.mark {
			r.t.Fatalf("%s: the key is marked %d; want %d", where, st.Mark, s.mark)
		}
	}
}

// leased is a share granted at g tokens/s: its burst is in proportion.
func leased(g float64) local.Share {
	return local.Share{Limit: rate.Limit(g), Burst: int(eBurst * g / eRate)}
}

// yielded is the local share of a key that yielded to g with split
// bursts: g, and its burst in proportion but at least its default part,
// which its yield record keeps counted (yieldShare).
func yielded(g float64) local.Share {
	s := leased(g)
	s.Burst = max(s.Burst, eBurst/eN)
	return s
}

// coldWant is the want of a key whose decisions were all at t0, asked for
// at t0+at: they say nothing of its rate, so its gap to now is taken as its
// period (at most the default share), with headroom.
func coldWant(at time.Duration) float64 { return min(eDef, 1/at.Seconds()) * headroom }

// overShare is a burst that a key's default share (burst 5) cuts: one of
// its decisions is denied.
const overShare = eBurst/eN + 1

// TestEngineAskAndFirstGrant: a key in the share placement asks for its
// first lease at the tick after its share denied a request, as uncontended
// and saying it runs its default share (not a grant) for the new lease's
// lifetime; the grant is in force at once, renews at half its lifetime,
// and says what it runs until the answer arrives.
func TestEngineAskAndFirstGrant(t *testing.T) {
	run(t, table{steps: []step{
		{at: 0, do: tick()}, // no key yet
		{at: 0, do: decide(overShare)},
		// Decided at this instant: nothing measured yet, and a denial
		// asks at the next tick, not this one.
		{at: 50 * ms, do: tick(), calls: []req{asking(coldWant(50 * ms))}, state: stateAsking},
		{at: 50 * ms, do: grant(25, 25, false), state: stateHeld, share: leased(25)},
		{at: 100 * ms, do: tick(), state: stateHeld, share: leased(25)},
		{at: 1000 * ms, do: decide(1), state: stateHeld, share: leased(25)},
		{at: 2500 * ms, do: tick(), state: stateHeld, share: leased(25)},
		// Renews at half its lifetime, running its grant until 90% of it.
		// Its want: seven decisions, the last a second after the first,
		// over 2.55 s.
		{at: 2550 * ms, do: tick(), calls: []req{{want: 7 / 2.55 * headroom, ttl: eUTTL, running: 25, runningFor: 2000 * ms, held: true}},
			state: stateHeld, share: leased(25)},
	}})
}

// contendedSteps: a key at a steady 40/s, above its fair share of 25/s,
// which a burst at t0 makes ask at 50 ms, granted that share three times in
// a row: settled, renewing at 1650 ms on a lease of 2·ContendedTTL that
// runs until 2130 ms.
func contendedSteps() []step {
	held, share := stateHeld, leased(25)
	c := func(ttl, runningFor time.Duration) []req {
		return []req{{want: anyWant, ttl: ttl, running: 25, runningFor: runningFor, held: true}}
	}
	return []step{
		{at: 0, do: tick()},                // 2 decisions: within the share
		{at: 0, do: decide(overShare - 2)}, // a burst: one denied
		{at: 50 * ms, do: tick(), calls: []req{asking(anyWant)}, state: stateAsking},
		// The first contended grant counts instances not heard from yet:
		// ask again two ticks on.
		{at: 50 * ms, do: grant(25, 25, true), state: held, share: share},
		{at: 100 * ms, do: tick(), state: held, share: share},
		{at: 150 * ms, do: tick(), calls: c(eCTTL, 4400*ms), state: held, share: share},
		{at: 150 * ms, do: grant(25, 25, true), state: held, share: share}, // unchanged: 1
		{at: 400 * ms, do: tick(), state: held, share: share},              // renews at half a lease
		{at: 450 * ms, do: tick(), calls: c(eCTTL, 240*ms), state: held, share: share},
		{at: 450 * ms, do: grant(25, 25, true), state: held, share: share}, // 2
		{at: 750 * ms, do: tick(), calls: c(eCTTL, 240*ms), state: held, share: share},
		{at: 750 * ms, do: grant(25, 25, true), state: held, share: share}, // 3: settled
		{at: 1050 * ms, do: tick(), calls: c(settledGrowth*eCTTL, 240*ms), state: held, share: share},
		{at: 1050 * ms, do: grant(25, 25, true), state: held, share: share},
	}
}

// TestEngineRenewalSchedule: a contended key renews two ticks after its
// first grant (the others have not said what they want yet), then every
// half ContendedTTL while its share moves; once unchanged settleAfter times
// in a row its lifetime grows settledGrowth (4) times at each renewal, up
// to UncontendedTTL. A share that moves again goes back to the contended
// schedule, and a starved one asks again two ticks later.
func TestEngineRenewalSchedule(t *testing.T) {
	held := stateHeld
	c := func(ttl, runningFor time.Duration, running float64) []req {
		return []req{{want: anyWant, ttl: ttl, running: running, runningFor: runningFor, held: true}}
	}
	run(t, table{perTick: 2, steps: append(contendedSteps(),
		// The 2.4 s lease of 1050 ms renews at half its life, for 9.6 s:
		// capped at UncontendedTTL.
		step{at: 2200 * ms, do: tick(), state: held, share: leased(25)},
		step{at: 2250 * ms, do: tick(), calls: c(eUTTL, 960*ms, 25), state: held, share: leased(25)},
		step{at: 2250 * ms, do: grant(25, 25, true), state: held, share: leased(25)},
		step{at: 4700 * ms, do: tick(), state: held, share: leased(25)},
		step{at: 4750 * ms, do: tick(), calls: c(eUTTL, 2000*ms, 25), state: held, share: leased(25)},
		// The share moves: back to the contended schedule at once.
		step{at: 4750 * ms, do: grant(30, 30, true), state: held, share: leased(30)},
		step{at: 5000 * ms, do: tick(), state: held, share: leased(30)},
		step{at: 5050 * ms, do: tick(), calls: c(eCTTL, 4200*ms, 30), state: held, share: leased(30)},
		// Starved: others hold more than their share; ask again two ticks on.
		step{at: 5050 * ms, do: grant(27, 32, true), state: held, share: leased(27)},
		step{at: 5100 * ms, do: tick(), state: held, share: leased(27)},
		step{at: 5150 * ms, do: tick(), calls: c(eCTTL, 440*ms, 27), state: held, share: leased(27)},
	)})
}

// TestEngineSettledRenewsEarlyWhenDemandMoves: a settled contended lease
// renews early, at most every earlyEvery ticks, when its demand falls far
// below its grant; and a contended lease granted all it asked for, settled
// or not, renews soonTicks after its request when its demand grows well
// past what it asked for.
func TestEngineSettledRenewsEarlyWhenDemandMoves(t *testing.T) {
	// At 40/s (wanting 44/s) this instance asks for more than its fair
	// share of 25/s; at 10/s it would free more than a quarter of it.
	t.Run("demand falls", func(t *testing.T) {
		// Settled at 40/s, granted 25/s; the renewal at 1050 ms is for
		// 2.4 s, and the next due at 2250 ms. Then the decisions stop: the
		// demand measured over the key's window falls below 75% of the
		// grant, with headroom, at 1900 ms.
		const early = 1900 * ms
		r := run(t, table{perTick: 2, steps: contendedSteps()})
		for at := 1100 * ms; at <= early; at += eTick {
			calls, _ := r.eng.collect(t0.Add(at), eN, r.loc.AppendStats(nil), nil)
			if at < early && len(calls) != 0 {
				t.Fatalf("at %v: renewed %v while demand was still measured above the threshold", at, calls)
			}
			if at == early && (len(calls) != 1 || calls[0].req.Want >= 25*settledShrink) {
				t.Fatalf("at %v: got %v; want an early renewal asking for less than 75%% of the grant", at, calls)
			}
		}
	})
	t.Run("demand grows past a want below the fair share", func(t *testing.T) {
		// Granted all it asked for, whether or not its share has settled:
		// its want is what holds it back, so it asks again as soon as its
		// demand, measured over demandTokens decisions, is past
		// settledGrow times that want, soonTicks ticks after its request
		// at the earliest.
		for _, stable := range []int{0, settleAfter} {
			r := newRig(t, false)
			for at := time.Duration(0); at <= 1050*ms; at += eTick {
				r.loc.Allow(t0.Add(at), "k") // 20/s, wanting 22/s
			}
			in := r.eng.clock.instant
			le := &lease{state: stateHeld, granted: 22, fair: 22, contended: true, stable: int16(stable),
				lastWant: 22, sentAt: in(t0.Add(1050 * ms)), attemptedAt: 22, until: in(t0.Add(2130 * ms)), renewAt: in(t0.Add(1650 * ms))}
			le.demand.open(in(t0))
			le.demand.record(in(t0.Add(1050*ms)), 22)
			r.eng.keys["k"] = le
			for at := 1100 * ms; at <= 1200*ms; at += eTick {
				for range 3 {
					r.loc.Allow(t0.Add(at), "k") // 60/s
				}
				calls, _ := r.eng.collect(t0.Add(at), eN, r.loc.AppendStats(nil), nil)
				switch {
				case at < 1200*ms && len(calls) != 0:
					t.Fatalf("stable %d, at %v, before its demand was measured past its want: renewed %v", stable, at, calls)
				case at == 1200*ms && (len(calls) != 1 || calls[0].req.Want <= 22):
					t.Fatalf("stable %d, at %v demand was measured past 1.25 times its want of 22/s: got %v, want an early renewal asking for more", stable, at, calls)
				}
			}
		}
	})
}

// TestEngineEarlyRenewalOnGrowth: an uncontended key whose demand since its
// last request outgrows its grant asks again at once, at most every
// earlyEvery ticks, with a want that follows the new demand; demand within
// its grant waits for the schedule.
func TestEngineEarlyRenewalOnGrowth(t *testing.T) {
	share := leased(30)
	run(t, table{steps: []step{
		{at: 0, do: decide(overShare)},
		{at: 50 * ms, do: tick(), calls: []req{asking(coldWant(50 * ms))}, state: stateAsking},
		{at: 50 * ms, do: grant(30, 30, false), state: stateHeld, share: share},
		{at: 100 * ms, do: decide(1), state: stateHeld, share: share},
		{at: 200 * ms, do: tick(), state: stateHeld, share: share}, // too soon after the request
		{at: 250 * ms, do: tick(), state: stateHeld, share: share}, // 1 in 200 ms: within its grant
		{at: 260 * ms, do: decide(19), state: stateHeld, share: share},
		// 20 decisions in 250 ms since the request: 80/s > 30/s.
		{at: 300 * ms, do: tick(), calls: []req{{want: 20 / 0.25 * headroom, ttl: eUTTL, running: 30, runningFor: 4250 * ms, held: true}},
			state: stateHeld, share: share},
		{at: 300 * ms, do: grant(88, 88, false), state: stateHeld, share: leased(88)},
	}})
}

// TestEngineShrinkToldAtNextTick: a grant that shrinks by at least
// ackShrink of the rate is told to Redis at the next tick, which counts the
// old grant until then; a smaller shrink waits for the schedule. The first
// grant of a key that asked from its default share is such a shrink when it
// is below that share.
func TestEngineShrinkToldAtNextTick(t *testing.T) {
	first := func() []step {
		return []step{
			{at: 0, do: tick()},                // one decision: within the share
			{at: 0, do: decide(overShare - 1)}, // a burst: one denied
			{at: 50 * ms, do: tick(), calls: []req{asking(anyWant)}, state: stateAsking},
			{at: 50 * ms, do: grant(80, 80, false), state: stateHeld, share: leased(80)},
			{at: 100 * ms, do: tick(), state: stateHeld, share: leased(80)},
			{at: 2550 * ms, do: tick(), calls: []req{{want: anyWant, ttl: eUTTL, running: 80, runningFor: 2000 * ms, held: true}},
				state: stateHeld, share: leased(80)},
		}
	}
	t.Run("large", func(t *testing.T) {
		run(t, table{perTick: 1, steps: append(first(),
			step{at: 2550 * ms, do: grant(40, 40, true), state: stateHeld, share: leased(40)},
			step{at: 2600 * ms, do: tick(), calls: []req{{want: anyWant, ttl: eCTTL, running: 40, runningFor: 4450 * ms, held: true}},
				state: stateHeld, share: leased(40)},
		)})
	})
	t.Run("small", func(t *testing.T) {
		run(t, table{perTick: 1, steps: append(first(),
			step{at: 2550 * ms, do: grant(76, 76, false), state: stateHeld, share: leased(76)},
			step{at: 2600 * ms, do: tick(), state: stateHeld, share: leased(76)},
			step{at: 5000 * ms, do: tick(), state: stateHeld, share: leased(76)},
		)})
	})
	t.Run("first grant below the default share", func(t *testing.T) {
		run(t, table{perTick: 1, steps: []step{
			{at: 0, do: tick()},
			{at: 0, do: decide(overShare - 1)},
			{at: 50 * ms, do: tick(), calls: []req{asking(anyWant)}, state: stateAsking},
			// Redis counts it at 25/s until 5050 ms, as the request said.
			{at: 50 * ms, do: grant(15, 15, false), state: stateHeld, share: leased(15)},
			{at: 100 * ms, do: tick(), calls: []req{{want: anyWant, ttl: eUTTL, running: 15, runningFor: 4450 * ms, held: true}},
				state: stateHeld, share: leased(15)},
		}})
	})
}

// failingSteps: a key at 20/s that a burst at t0 makes ask, granted 25/s at
// 50 ms (until 4550 ms), whose renewals fail from 2550 ms to 4550 ms, then
// are answered at 4600 ms.
func failingSteps() []step {
	renewal := func(runningFor time.Duration) []req {
		return []req{{want: anyWant, ttl: eUTTL, running: 25, runningFor: runningFor, held: true}}
	}
	return []step{
		{at: 0, do: tick()},
		{at: 0, do: decide(overShare - 1)},
		{at: 50 * ms, do: tick(), calls: []req{asking(anyWant)}, state: stateAsking},
		{at: 50 * ms, do: grant(25, 25, false), state: stateHeld, share: leased(25)},
		{at: 2550 * ms, do: tick(), calls: renewal(2000 * ms), state: stateHeld, share: leased(25)},
		{at: 2550 * ms, do: fail(), state: stateHeld, share: leased(25)},
		{at: 2600 * ms, do: tick(), calls: renewal(1950 * ms), state: stateHeld, share: leased(25)},
		{at: 2600 * ms, do: fail(), state: stateHeld, share: leased(25)},
		// The grant ends at 50 ms + 90% of 5 s: the key lapses, running the
		// smaller of its grant and its default share, and says so for the
		// lifetime of the lease it asks for.
		{at: 4550 * ms, do: tick(), calls: renewal(eUTTL), state: stateLapsed},
		{at: 4550 * ms, do: fail(), state: stateLapsed},
		{at: 4600 * ms, do: tick(), calls: renewal(eUTTL), state: stateLapsed},
		{at: 4600 * ms, do: grant(25, 25, false), state: stateHeld, share: leased(25)},
	}
}

// TestEngineFailedAndLostAnswers: a request that fails, or whose answer is
// lost (the loop sees a timeout), leaves the grant in force until it ends,
// marks the key failing (it follows the outage policy once its grant has ended,
// and only if the limit is degraded), and asks again at every tick, saying
// what it still runs; the grant lapses at its local end, counted once as
// expired, and the next answer puts a grant back and clears the flag.
func TestEngineFailedAndLostAnswers(t *testing.T) {
	var flagged []bool
	var expired []int
	r := run(t, table{perTick: 1, steps: failingSteps(), after: func(r *rig, i int) {
		flagged = append(flagged, r.eng.keys["k"] != nil && r.eng.keys["k"].failed)
		expired = append(expired, r.expired)
	}})
	wantFlagged := []bool{false, false, false, false, false, true, true, true, true, true, true, false}
	for i := range wantFlagged {
		if flagged[i] != wantFlagged[i] {
			t.Errorf("after step %d the key is flagged %v; want %v (all: %v)", i, flagged[i], wantFlagged[i], flagged)
		}
	}
	if !r.recovered {
		t.Error("the grant after the failures did not report the key recovered")
	}
	// Ticks are steps 0, 2, 4, 6, 8 and 10; the grant ends at step 8.
	for _, i := range []int{0, 2, 4, 6, 8, 10} {
		if want := b2i(i == 8); expired[i] != want {
			t.Errorf("tick of step %d counted %d grants expired; want %d", i, expired[i], want)
		}
	}
}

// TestEngineFailedFirstAsk: a key whose first request fails stays at its
// default share, which Redis counts (it asked saying so), and asks again
// at the next tick, still from that share.
func TestEngineFailedFirstAsk(t *testing.T) {
	run(t, table{steps: []step{
		{at: 0, do: decide(overShare)},
		{at: 50 * ms, do: tick(), calls: []req{asking(coldWant(50 * ms))}, state: stateAsking},
		{at: 50 * ms, do: fail(), state: stateAsking},
		{at: 100 * ms, do: tick(), calls: []req{asking(coldWant(100 * ms))}, state: stateAsking},
		{at: 100 * ms, do: fail(), state: stateAsking},
		{at: 150 * ms, do: tick(), calls: []req{asking(coldWant(150 * ms))}, state: stateAsking},
		{at: 150 * ms, do: grant(40, 40, false), state: stateHeld, share: leased(40)},
	}})
}

// TestEngineIdleRelease: a leased key without decisions for half
// UncontendedTTL stops renewing at its next due renewal and releases its
// record, contended or not. It runs the smaller of its grant and its
// default share from then on, and goes back to its default share only once
// the release is acknowledged, and then only after the ack's In; it asks
// anew only when that share denies a request.
func TestEngineIdleRelease(t *testing.T) {
	for _, contended := range []bool{true, false} {
		t.Run(fmt.Sprintf("contended=%v", contended), func(t *testing.T) {
			first := 25.0
			if !contended {
				first = 40 // above the default share
			}
			steps := []step{
				{at: 0, do: decide(overShare)},
				{at: 50 * ms, do: tick(), calls: []req{asking(coldWant(50 * ms))}, state: stateAsking},
				{at: 50 * ms, do: grant(first, first, contended), state: stateHeld, share: leased(first)},
				// A decision after the request, then none: not news once
				// the key is idle.
				{at: 60 * ms, do: decide(1), state: stateHeld, share: leased(first)},
			}
			idleAt := 5050 * ms
			if contended {
				// A contended share that keeps moving renews every 300 ms
				// until the key has been idle for 2.5 s.
				idleAt = 2850 * ms
				until, prev := 4550*ms, 25.0
				for at := 150 * ms; at < idleAt; at += 300 * ms {
					g := 49 - prev // 24, 25, 24, ...: never settled
					steps = append(steps,
						step{at: at, do: tick(), calls: []req{{want: anyWant, ttl: eCTTL, running: prev, runningFor: until - at, held: true}},
							state: stateHeld, share: leased(prev)},
						step{at: at, do: grant(g, g, true), state: stateHeld, share: leased(g)})
					until, prev = at+540*ms, g
				}
			} else {
				steps = append(steps,
					step{at: 2550 * ms, do: tick(), calls: []req{{want: anyWant, ttl: eUTTL, running: 40, runningFor: 2000 * ms, held: true}},
						state: stateHeld, share: leased(40)},
					step{at: 2550 * ms, do: grant(40, 40, false), state: stateHeld, share: leased(40)})
			}
			// Lapsed: the smaller of the last grant (24, or 40) and the
			// default share (25).
			lapsed := leased(24)
			if !contended {
				lapsed = leased(25)
			}
			// Acknowledged: a record below the default share (24) may
			// have let others take more until the ack's In, 100 ms; one at
			// or above it (40) returns to the default share at once.
			back := []step{{at: idleAt + eTick, do: ack(0), state: stateDefault}}
			if contended {
				back = []step{
					{at: idleAt + eTick, do: ack(100 * ms), state: stateReleasing, share: lapsed},
					{at: idleAt + 2*eTick, do: tick(), state: stateReleasing, share: lapsed},
					{at: idleAt + 3*eTick - 1, do: tick(), state: stateReleasing, share: lapsed},
					{at: idleAt + 3*eTick, do: tick(), state: stateDefault},
				}
			}
			steps = append(steps,
				step{at: idleAt, do: tick(), calls: []req{released}, state: stateReleasing, share: lapsed},
				// The answer is lost: the release goes again at the next
				// tick, and the key stays where it is.
				step{at: idleAt, do: fail(), state: stateReleasing, share: lapsed},
				step{at: idleAt + eTick, do: tick(), calls: []req{released}, state: stateReleasing, share: lapsed})
			steps = append(steps, back...)
			run(t, table{steps: append(steps,
				step{at: 9000 * ms, do: tick(), state: stateDefault},
				step{at: 9000 * ms, do: decide(1), state: stateDefault},
				step{at: 9050 * ms, do: tick(), state: stateDefault}, // within its share
				step{at: 9100 * ms, do: decide(overShare), state: stateDefault},
				step{at: 9150 * ms, do: tick(), calls: []req{asking(anyWant)}, state: stateAsking},
			)})
		})
	}
}

// TestEngineEviction: a key the local limiter evicts is forgotten; if Redis
// may hold a record of it, that is released; a failing key says so, for the
// limit's count of failing keys. A key with a grant in force is not
// evicted.
func TestEngineEviction(t *testing.T) {
	t.Run("leased", func(t *testing.T) {
		r := run(t, table{steps: []step{
			{at: 0, do: decide(overShare)},
			{at: 50 * ms, do: tick(), calls: []req{asking(coldWant(50 * ms))}, state: stateAsking},
			{at: 50 * ms, do: grant(25, 25, false), state: stateHeld, share: leased(25)},
			{at: 1500 * ms, do: evictIdle(time.Second), state: stateHeld, share: leased(25)}, // its grant is in force
			{at: 2550 * ms, do: tick(), calls: []req{released}, state: stateReleasing, share: leased(25)},
			{at: 2550 * ms, do: ack(0), state: stateDefault},
			{at: 2600 * ms, do: evictIdle(time.Second)},
			{at: 2650 * ms, do: tick()},
		}})
		if len(r.eng.keys) != 0 || r.loc.Len() != 0 {
			t.Errorf("the engine still holds %d keys, the limiter %d", len(r.eng.keys), r.loc.Len())
		}
	})
	t.Run("never asked", func(t *testing.T) {
		r := run(t, table{steps: []step{
			{at: 0, do: decide(1)},
			{at: 0, do: tick()},
			{at: 10 * ms, do: evictIdle(0)},
		}})
		if len(r.eng.keys) != 0 {
			t.Errorf("the engine still holds %d keys", len(r.eng.keys))
		}
	})
	t.Run("failing", func(t *testing.T) {
		r := run(t, table{steps: []step{
			{at: 0, do: decide(overShare)},
			{at: 50 * ms, do: tick(), calls: []req{asking(coldWant(50 * ms))}, state: stateAsking},
			{at: 50 * ms, do: fail(), state: stateAsking},
			// The answer may have been lost after Redis wrote a record.
			{at: 2050 * ms, do: evictIdle(2 * time.Second), calls: []req{release}},
		}})
		if !r.failing {
			t.Error("a failing key was evicted without saying it was failing")
		}
	})
	t.Run("release failing", func(t *testing.T) {
		r := run(t, table{steps: []step{
			{at: 0, do: decide(overShare)},
			{at: 50 * ms, do: tick(), calls: []req{asking(coldWant(50 * ms))}, state: stateAsking},
			{at: 50 * ms, do: grant(25, 25, false), state: stateHeld, share: leased(25)},
			{at: 2550 * ms, do: tick(), calls: []req{released}, state: stateReleasing, share: leased(25)},
			{at: 2550 * ms, do: fail(), state: stateReleasing, share: leased(25)},
			{at: 4500 * ms, do: evictIdle(time.Second), state: stateReleasing, share: leased(25)}, // in force
			{at: 4550 * ms, do: evictIdle(time.Second), calls: []req{release}},
		}})
		if !r.failing {
			t.Error("a failing key was evicted without saying it was failing")
		}
	})
}

// TestEngineInstancesChange: when N-hat changes, a settled lease renews at
// the next tick, on the contended schedule, and every request carries the
// new count; a new key's want is capped by the new default share, which it
// says it runs.
func TestEngineInstancesChange(t *testing.T) {
	run(t, table{perTick: 2, steps: append(contendedSteps(),
		step{at: 1100 * ms, do: tick(), state: stateHeld, share: leased(25)}, // settled: renews at 2250 ms
		step{at: 1100 * ms, do: instances(8), state: stateHeld, share: leased(25)},
		step{at: 1150 * ms, do: tick(), calls: []req{{want: anyWant, ttl: eCTTL, running: 25, runningFor: 2060 * ms, held: true, instances: 8}},
			state: stateHeld, share: leased(25)},
	)})

	for _, n := range []int{4, 8} {
		// A burst 10 ms ago says 100/s; a key is taken to want at most
		// its default share until it has more to go on.
		r := newRig(t, false)
		r.n = n
		r.loc.SetInstances(t0, n)
		def := eRate / float64(n)
		for range eBurst/n + 1 {
			r.loc.Allow(t0, "k")
		}
		calls, _ := r.eng.collect(t0.Add(10*ms), r.n, r.loc.AppendStats(nil), nil)
		if len(calls) != 1 || calls[0].req.Instances != n || math.Abs(calls[0].req.Want-def*headroom) > 1e-9 ||
			calls[0].req.Running != def || calls[0].req.Held {
			t.Fatalf("a new key at N=%d asked %v; want %.4g/s, running %v", n, calls, def*headroom, def)
		}
	}
}

// ticks returns a tick at every tick instant from from to to, each
// returning nothing and leaving "k" as s says (s.at and s.do are set here).
func ticks(from, to time.Duration, s step) []step {
	var steps []step
	for at := from; at <= to; at += eTick {
		s.at, s.do = at, tick()
		steps = append(steps, s)
	}
	return steps
}

// TestEngineShareCostsNothing: a key whose demand stays within its default
// share, bursts within its burst share included, never makes a request
// nor asks its peers, however long it runs.
func TestEngineShareCostsNothing(t *testing.T) {
	steps := ticks(0, 5*time.Second, step{})
	steps = append(steps, step{at: 5 * time.Second, do: decide(3)}) // with the load's one: 4 of the 5 tokens
	steps = append(steps, ticks(5*time.Second+eTick, 20*time.Second, step{})...)
	run(t, table{perTick: 1, steps: steps, after: func(r *rig, i int) {
		if len(r.eng.asks) != 0 {
			t.Fatalf("after step %d the engine asks its peers about %v", i, r.eng.asks)
		}
	}})
}

// TestEngineUntrackedKeys: the engine keeps no state of a key in the share
// placement with fewer than demandTokens tokens asked for in all and no
// denial (BenchmarkMemory's share placement); it starts one at the first
// tick after either, as it would have at the key's first tick, and
// keeps it. A peer's ask of such a key is TestEngineYieldDefaultKey's.
// With exact bursts the same holds of a key in the exact placement until
// the policy moves it (TestEngineExactBurstsLeave), and Close and a limit
// that stops being Hybrid release its record all the same.
func TestEngineUntrackedKeys(t *testing.T) {
	tracked := func(r *rig) bool { return r.eng.keys["k"] != nil }
	t.Run("light", func(t *testing.T) {
		// A decision every 200 ms: 19 of them by 3.6 s, the 20th at 3.8 s.
		var steps []step
		for at := time.Duration(0); at <= 4*time.Second; at += eTick {
			if at%(200*ms) == 0 {
				steps = append(steps, step{at: at, do: decide(1)})
			}
			steps = append(steps, step{at: at, do: tick()})
		}
		run(t, table{steps: steps, after: func(r *rig, i int) {
			at := steps[i].at
			if want := at > 3800*ms || (at == 3800*ms && steps[i].do.name == "tick"); tracked(r) != want {
				t.Fatalf("at %v (%s) the engine tracks k: %v; want %v", at, steps[i].do.name, tracked(r), want)
			}
		}})
	})
	t.Run("denied", func(t *testing.T) {
		var at []bool
		run(t, table{steps: []step{
			{at: 0, do: tick()},
			{at: 0, do: decide(overShare)},
			{at: 50 * ms, do: tick(), calls: []req{asking(coldWant(50 * ms))}, state: stateAsking},
		}, after: func(r *rig, i int) { at = append(at, tracked(r)) }})
		if !slices.Equal(at, []bool{false, false, true}) {
			t.Errorf("tracked after each step: %v; want only after the tick that saw the denial", at)
		}
	})
	t.Run("exact bursts", func(t *testing.T) {
		// A key decided once stays exact, untracked: at 2/s, a look due
		// every 300 ms finds it far below half its default share.
		var steps []step
		for at := time.Duration(0); at <= 3*time.Second; at += eTick {
			if at%(500*ms) == 0 {
				steps = append(steps, step{at: at, do: decideOne(false, markExact), state: stateExact, mark: markExact})
			}
			steps = append(steps, step{at: at, do: tick(), state: stateExact, mark: markExact})
		}
		run(t, table{exactBursts: true, steps: steps, after: func(r *rig, i int) {
			if tracked(r) {
				t.Fatalf("at %v (%s) the engine tracks k", steps[i].at, steps[i].do.name)
			}
		}})
	})
	for _, drop := range []bool{false, true} {
		// Closing (releaseAll) releases the record of an untracked exact
		// key, and a limit that stops being Hybrid (drop) also unmarks it.
		t.Run(fmt.Sprintf("exact bursts/drop %v", drop), func(t *testing.T) {
			r := run(t, table{exactBursts: true, steps: []step{
				{at: 0, do: decideOne(false, markExact), mark: markExact},
				{at: 0, do: tick(), state: stateExact, mark: markExact},
				{at: 50 * ms, do: tick(), state: stateExact, mark: markExact},
			}})
			var calls []call
			if drop {
				calls = r.eng.drop(t0.Add(100*ms), r.n, nil)
			} else {
				calls = r.eng.releaseAll(r.n, nil)
			}
			r.checkCalls("after", calls, []req{release})
			want := uint8(markExact)
			if drop {
				want = 0
			}
			if st, _ := r.loc.Stats("k"); st.Mark != want {
				t.Errorf("k is marked %d; want %d", st.Mark, want)
			}
		})
	}
	t.Run("asked before a tick saw it", func(t *testing.T) {
		// New since the last tick: unknown to the engine, it yields
		// everything (TestEngineYieldUnknownKey), as when every key was
		// tracked from its first tick.
		run(t, table{steps: []step{
			{at: 0, do: tick()},
			{at: 10 * ms, do: decide(1)},
			{at: 20 * ms, do: peerAsks(), state: stateYielded, none: true},
			{at: 50 * ms, do: tick(), calls: []req{yielding(0)}, state: stateYielded, none: true},
		}})
	})
}

// TestEngineExactYieldedKeyOutgrows: with exact bursts, a key asked to
// yield before its first request here yields everything and then decides
// exactly, where its share denies nothing. Once its demand is measured
// above what it kept (nothing: any demand is), it becomes an exact user:
// its next take drops the yield record, so that Redis counts it at its
// demand rather than at nothing while its peers lease the whole rate. A
// sparse key does too, at its first measurement; one that kept part of
// its share needs fallTokens decisions to show it outgrew that.
func TestEngineExactYieldedKeyOutgrows(t *testing.T) {
	y := func(at time.Duration, do op, calls ...req) step {
		return step{at: at, do: do, calls: calls, state: stateYielded, none: true, mark: markExact}
	}
	// Asked before its first request here: it yields everything, and the
	// yield is recorded.
	asked := func() []step {
		return []step{
			y(50*ms, peerAsks()),
			y(100*ms, tick(), yielding(0)),
			y(100*ms, recorded()),
		}
	}
	steps := asked()
	// A request a tick, 20/s, decided in Redis; the demand window opened
	// at the ask and is measured once it spans a second, at 1050 ms.
	for at := 150 * ms; at <= 1300*ms; at += eTick {
		d, s := y(at, decide(1)), y(at, tick())
		if at > 1050*ms {
			d.state, d.mark = stateExact, markExactDropLease
		}
		if at >= 1050*ms {
			s.state, s.mark = stateExact, markExactDropLease
		}
		steps = append(steps, d, s)
	}
	run(t, table{exactBursts: true, steps: steps})

	t.Run("a few requests", func(t *testing.T) {
		steps := append(asked(), y(200*ms, decide(3)))
		steps = append(steps, ticks(200*ms, 1000*ms, step{state: stateYielded, none: true, mark: markExact})...)
		steps = append(steps, ticks(1050*ms, 1300*ms, step{state: stateExact, none: true, mark: markExactDropLease})...)
		run(t, table{exactBursts: true, steps: steps})
	})
	t.Run("kept part of its share", func(t *testing.T) {
		// Kept 2/s (set by hand, as a key that yielded to its measured
		// demand would): 4/s, with headroom, is above it, but four
		// decisions a second say too little to raise on.
		steps := asked()
		for at := 150 * ms; at <= 2300*ms; at += eTick {
			if at%(250*ms) == 0 {
				steps = append(steps, y(at, decide(1)))
			}
			steps = append(steps, y(at, tick()))
		}
		run(t, table{exactBursts: true, steps: steps, after: func(r *rig, i int) {
			if i == 2 {
				r.eng.keys["k"].granted = 2
			}
		}})
	})
}

// TestEngineAsksAfterDenial: a key in the share placement asks for a lease
// at the first tick after its share denied a request, and only then: for
// its measured demand with headroom, as uncontended, saying it runs its
// default share (not a grant) for the new lease's lifetime; it asks its
// peers to yield at the same tick, and runs its default share until the
// grant is in force.
func TestEngineAsksAfterDenial(t *testing.T) {
	// At 40/s the burst share of 5 runs out at 250 ms (5 + 1.25 tokens a
	// tick, 2 taken): 12 decisions, 11 gaps over 250 ms, 44/s.
	steps := ticks(0, 200*ms, step{})
	steps = append(steps,
		step{at: 250 * ms, do: tick(), calls: []req{asking(44 * headroom)}, state: stateAsking},
		step{at: 250 * ms, do: grant(50, 50, false), state: stateHeld, share: leased(50)},
	)
	var asks [][]string
	run(t, table{perTick: 2, steps: steps, after: func(r *rig, i int) {
		asks = append(asks, slices.Clone(r.eng.asks))
	}})
	for i, a := range asks {
		want := []string(nil)
		if i >= len(asks)-2 {
			want = []string{"k"} // the tick at 250 ms, and still after its answer
		}
		if !slices.Equal(a, want) {
			t.Errorf("after step %d the engine asks its peers about %q; want %q", i, a, want)
		}
	}
}

// TestEngineYieldUnknownKey: asked by a peer to yield a key it has never
// seen, an instance creates it at share zero at once, then records a yield
// of 0 at the next tick, for yieldLife·UncontendedTTL; the answer tells it
// when the record has certainly ended. While peers keep asking it renews
// the record at a third of its life; once they stop (half a life without
// an ask) it releases the record at its next renewal, and runs nothing
// until the release is acknowledged and the ack's In has passed.
func TestEngineYieldUnknownKey(t *testing.T) {
	z := func(at time.Duration, do op, calls ...req) step {
		return step{at: at, do: do, calls: calls, state: stateYielded, none: true}
	}
	rel := func(at time.Duration, do op, calls ...req) step {
		return step{at: at, do: do, calls: calls, state: stateReleasing, none: true}
	}
	run(t, table{steps: []step{
		z(50*ms, peerAsks()),
		z(100*ms, tick(), yielding(0)),
		z(100*ms, recorded()),
		z(100*ms, recordEnds(100*ms+eLife)),
		z(150*ms, tick()),
		z(1000*ms, peerAsks()),
		z(2000*ms, peerAsks()),
		z(3000*ms, peerAsks()),
		// Renews at 100 ms + 10 s/3.
		z(3400*ms, tick()),
		z(3450*ms, tick(), yielding(0)),
		z(3450*ms, recorded()),
		z(3450*ms, recordEnds(3450*ms+eLife)),
		z(4000*ms, peerAsks()), // the last ask
		z(6750*ms, tick()),
		z(6800*ms, tick(), yielding(0)),
		z(6800*ms, recorded()),
		z(6800*ms, recordEnds(6800*ms+eLife)),
		// Nobody asked for 5 s: the record goes at its next renewal,
		// 6800 ms + 10 s/3.
		z(9000*ms, tick()),
		z(10100*ms, tick()),
		rel(10150*ms, tick(), released),
		rel(10150*ms, fail()),
		rel(10200*ms, tick(), released),
		rel(10200*ms, ack(100*ms)),
		rel(10250*ms, tick()),
		rel(10300*ms-1, tick()),
		{at: 10300 * ms, do: tick(), state: stateDefault},
		{at: 10350 * ms, do: tick(), state: stateDefault},
	}})
}

// lowDemand is a key at 5/s, measured at its tick at 1 s (six decisions,
// five gaps over a second): 5.5/s with headroom, below yieldBelow of its
// share (and below youngYieldBelow).
func lowDemand() []step {
	var steps []step
	for at := time.Duration(0); at <= time.Second; at += eTick {
		if at%(200*ms) == 0 {
			steps = append(steps, step{at: at, do: decide(1)})
		}
		steps = append(steps, step{at: at, do: tick()})
	}
	return steps
}

// TestEngineYieldDefaultKey: asked by a peer to yield, a key in the share
// placement whose demand measured over a second (with headroom) is below
// yieldBelow of its share lowers it to that demand at once, keeping its
// default part of the burst, then records the yield at the next tick; one
// that needs more, or whose demand has not been measured over a second yet
// and shows half its share or more, keeps it and sends nothing.
func TestEngineYieldDefaultKey(t *testing.T) {
	kept := yielded(5.5)
	t.Run("low demand", func(t *testing.T) {
		run(t, table{steps: append(lowDemand(),
			step{at: time.Second, do: peerAsks(), state: stateYielded, share: kept},
			step{at: 1050 * ms, do: tick(), calls: []req{yielding(5.5)}, state: stateYielded, share: kept},
			step{at: 1050 * ms, do: recorded(), state: stateYielded, share: kept},
			step{at: 1050 * ms, do: recordEnds(1050*ms + eLife), state: stateYielded, share: kept},
		)})
	})
	t.Run("most of its share", func(t *testing.T) {
		// 15/s, about two thirds of its share with headroom: it yields to
		// that. Below half its share only, as first built, it kept it all
		// while a heavy peer was held to what the others left.
		var steps []step
		for at := time.Duration(0); at <= time.Second; at += eTick {
			if at%(200*ms) == 0 {
				steps = append(steps, step{at: at, do: decide(3)})
			}
			steps = append(steps, step{at: at, do: tick()})
		}
		r := run(t, table{steps: steps})
		peerAsks().run(r, t0.Add(time.Second))
		le := r.eng.keys["k"]
		st, _ := r.loc.Stats("k")
		if le == nil || le.state != stateYielded || le.granted < eDef*youngYieldBelow || le.granted >= eDef*yieldBelow ||
			st.Share != yielded(le.granted) {
			t.Fatalf("after the ask: %+v, running %+v; want yielded to between half and %v of its share %v, with its default part of the burst",
				le, st.Share, yieldBelow, eDef)
		}
	})
	t.Run("young", func(t *testing.T) {
		// Asked at 100 ms, before it is youngYieldAfter old; at each tick
		// after, (requests + youngSlack) / age with headroom: 22/s at
		// 200 ms, 13.75/s at 400 ms, 12.2/s at 450 ms, below half its
		// share. It yields then, and records the yield at once.
		young := youngAt450()
		steps := append(lowDemand()[:4], step{at: 100 * ms, do: peerAsks()})
		steps = append(steps, lowDemand()[4:12]...) // the ticks from 150 to 400 ms
		run(t, table{steps: append(steps,
			step{at: 450 * ms, do: tick(), calls: []req{yielding(young)}, state: stateYielded, share: yielded(young)},
		)})
	})
	t.Run("young and busy", func(t *testing.T) {
		// 20/s: asked at 300 ms, it never shows less than half its share.
		run(t, table{perTick: 1, steps: append(ticks(0, 250*ms, step{}),
			append([]step{{at: 300 * ms, do: peerAsks()}}, ticks(300*ms, 1500*ms, step{})...)...)})
	})
	t.Run("needs its share", func(t *testing.T) {
		// 20/s: 22/s with headroom, above yieldBelow of its share.
		run(t, table{perTick: 1, steps: append(ticks(0, time.Second, step{}),
			step{at: time.Second, do: peerAsks()},
			step{at: 1050 * ms, do: tick()},
			step{at: 2050 * ms, do: tick()},
		)})
	})
}

// youngAt450 is youngDemand of the low-demand key (lowDemand) at its tick
// at 450 ms: three requests, plus youngSlack, over 450 ms, with headroom;
// worked out as the engine does, in float64 arithmetic.
func youngAt450() float64 {
	requests := 3.0
	return (requests + youngSlack) / (450 * ms).Seconds() * headroom
}

// yieldedStep is a step that leaves "k" yielded, running share.
func yieldedStep(at time.Duration, do op, share float64, calls ...req) step {
	return step{at: at, do: do, calls: calls, state: stateYielded, share: yielded(share)}
}

// youngYieldSteps are the steps of a key at 5/s asked to yield at 100 ms,
// which yields to young, its young demand, at 450 ms and records it, up to
// the tick at 500 ms.
func youngYieldSteps(young float64) []step {
	y := yieldedStep
	steps := append(lowDemand()[:4], step{at: 100 * ms, do: peerAsks()})
	steps = append(steps, lowDemand()[4:12]...)
	return append(steps,
		y(450*ms, tick(), young, yielding(young)),
		y(450*ms, recorded(), young),
		y(500*ms, tick(), young),
	)
}

// TestEngineYieldedKeyLowers: a key that yielded young keeps what its
// first requests showed; once its demand is measured over a second on
// fallTokens decisions or more and falls below yieldLower of that, it
// lowers to it with headroom, records the lower yield at once, and tells
// the peers (freed), which may take the difference. At 1 s its six
// decisions are too few; at 2 s, eleven are enough.
func TestEngineYieldedKeyLowers(t *testing.T) {
	young := youngAt450()
	y := yieldedStep
	steps := youngYieldSteps(young)
	steps = append(steps, y(500*ms, recordEnds(450*ms+eLife), young))
	for at := 550 * ms; at < 2*time.Second; at += eTick {
		if at%(200*ms) == 0 {
			steps = append(steps, y(at, decide(1), young))
		}
		steps = append(steps, y(at, tick(), young))
	}
	// Eleven decisions, ten gaps over two seconds: 5.5/s with headroom.
	steps = append(steps, y(2*time.Second, decide(1), young))
	var frees [][]string
	run(t, table{steps: append(steps, y(2*time.Second, tick(), 5.5, yielding(5.5))), after: func(r *rig, i int) {
		frees = append(frees, slices.Clone(r.eng.frees))
	}})
	if got := frees[len(frees)-1]; !slices.Equal(got, []string{"k"}) {
		t.Errorf("after lowering the engine tells its peers about %q; want [k]", got)
	}
	for i, f := range frees[:len(frees)-1] {
		if len(f) != 0 {
			t.Errorf("after step %d the engine tells its peers about %q; want nothing", i, f)
		}
	}
}

// TestEngineYieldedKeyLowersAfterAQuietTick: the same, with the last
// request a tick before the measurement: a tick with no request restarts
// the demand window, and the lowering still rests on the measurement's
// own decisions (before, it counted those since the restart, none, and a
// key with Poisson arrivals a few times a second kept what it yielded to
// for seconds).
func TestEngineYieldedKeyLowersAfterAQuietTick(t *testing.T) {
	young := youngAt450()
	y := yieldedStep
	steps := youngYieldSteps(young)
	// Two decisions every 250 ms, the last at 1.9 s: 8/s, and quiet
	// from there to the measurement at 2 s.
	for at := 550 * ms; at < 2*time.Second; at += eTick {
		if at%(250*ms) == 150*ms {
			steps = append(steps, y(at, decide(2), young))
		}
		steps = append(steps, y(at, tick(), young))
	}
	r := run(t, table{steps: steps})
	calls := tick().run(r, t0.Add(2*time.Second))
	le := r.eng.keys["k"]
	if len(calls) != 1 || calls[0].kind != callYield || le.state != stateYielded || !(le.granted < young*yieldLower) {
		t.Fatalf("at 2s: calls %+v, state %v, kept %v; want one yield lowering below %v", calls, le.state, le.granted, young*yieldLower)
	}
	if st, _ := r.loc.Stats("k"); float64(st.Share.Limit) != le.granted {
		t.Errorf("the key runs %v; want what it lowered to, %v, before it says so", st.Share.Limit, le.granted)
	}
}

// TestEngineYieldedKeyAsks: a yielded key whose share denies a request asks
// for a lease at the next tick, saying it runs what it kept, a grant of
// Redis's (its yield record); it keeps running that until the grant is in
// force. A request that fails is tried again at the next tick, as for any
// key: the key still wants more than it kept.
func TestEngineYieldedKeyAsks(t *testing.T) {
	kept := yielded(5.5)
	// Thirteen decisions, twelve gaps over 1.1 s.
	ask := []req{{want: 12 / 1.1 * headroom, ttl: eUTTL, running: 5.5, runningFor: eUTTL}}
	steps := func() []step {
		return append(lowDemand(),
			step{at: time.Second, do: peerAsks(), state: stateYielded, share: kept},
			step{at: 1050 * ms, do: tick(), calls: []req{yielding(5.5)}, state: stateYielded, share: kept},
			step{at: 1050 * ms, do: recorded(), state: stateYielded, share: kept},
			step{at: 1100 * ms, do: decide(7), state: stateYielded, share: kept}, // a burst share of 5
			step{at: 1150 * ms, do: tick(), calls: ask, state: stateYielded, share: kept},
		)
	}
	t.Run("granted", func(t *testing.T) {
		run(t, table{steps: append(steps(),
			step{at: 1150 * ms, do: decideOne(false, 0), state: stateYielded, share: kept},
			step{at: 1150 * ms, do: grant(40, 40, false), state: stateHeld, share: leased(40)},
		)})
	})
	t.Run("failed", func(t *testing.T) {
		// No decision since: it still wants more than it kept (thirteen
		// decisions over 1.2 s now), not to record a yield.
		again := []req{{want: 13 / 1.2 * headroom, ttl: eUTTL, running: 5.5, runningFor: eUTTL}}
		run(t, table{steps: append(steps(),
			step{at: 1150 * ms, do: fail(), state: stateYielded, share: kept},
			step{at: 1200 * ms, do: tick(), calls: again, state: stateYielded, share: kept},
			step{at: 1200 * ms, do: grant(40, 40, false), state: stateHeld, share: leased(40)},
		)})
	})
}

// failEachTick: a held key whose renewals fail at every tick from from to
// to, each saying it runs running until its grant ends at end.
func failEachTick(from, to time.Duration, running float64, ttl, end time.Duration, share local.Share) []step {
	var steps []step
	for at := from; at <= to; at += eTick {
		steps = append(steps,
			step{at: at, do: tick(), calls: []req{{want: anyWant, ttl: ttl, running: running, runningFor: end - at, held: true}},
				state: stateHeld, share: share},
			step{at: at, do: fail(), state: stateHeld, share: share})
	}
	return steps
}

// TestEngineLapse: a grant that ends before a renewal is answered lapses:
// the key runs the smaller of it and its default share, and says so (as a
// grant of Redis's) in every request. A grant above the default share
// lapses to that share; one below it lapses to the grant, and stays there,
// never back at the default share while it has no answer.
func TestEngineLapse(t *testing.T) {
	t.Run("above the default share", func(t *testing.T) {
		steps := []step{
			{at: 0, do: tick()},
			{at: 0, do: decide(overShare - 1)},
			{at: 50 * ms, do: tick(), calls: []req{asking(anyWant)}, state: stateAsking},
			{at: 50 * ms, do: grant(40, 40, false), state: stateHeld, share: leased(40)},
		}
		steps = append(steps, failEachTick(2550*ms, 4500*ms, 40, eUTTL, 4550*ms, leased(40))...)
		lapsed := []req{{want: anyWant, ttl: eUTTL, running: eDef, runningFor: eUTTL, held: true}}
		run(t, table{perTick: 1, steps: append(steps,
			step{at: 4550 * ms, do: tick(), calls: lapsed, state: stateLapsed},
			step{at: 4550 * ms, do: fail(), state: stateLapsed},
			step{at: 4600 * ms, do: tick(), calls: lapsed, state: stateLapsed},
			step{at: 4600 * ms, do: grant(40, 40, false), state: stateHeld, share: leased(40)},
		)})
	})
	t.Run("below the default share", func(t *testing.T) {
		steps := []step{
			{at: 0, do: tick()},
			{at: 0, do: decide(overShare - 1)},
			{at: 50 * ms, do: tick(), calls: []req{asking(anyWant)}, state: stateAsking},
			// Contended, 25 - 15 given up: renews at the next tick.
			{at: 50 * ms, do: grant(15, 15, true), state: stateHeld, share: leased(15)},
		}
		steps = append(steps, failEachTick(100*ms, 4500*ms, 15, eCTTL, 4550*ms, leased(15))...)
		lapsed := []req{{want: anyWant, ttl: eCTTL, running: 15, runningFor: eCTTL, held: true}}
		for at := 4550 * ms; at <= 6000*ms; at += eTick {
			steps = append(steps,
				step{at: at, do: tick(), calls: lapsed, state: stateLapsed, share: leased(15)},
				step{at: at, do: fail(), state: stateLapsed, share: leased(15)})
		}
		r := run(t, table{perTick: 1, steps: steps})
		for _, st := range r.loc.AppendStats(nil) {
			if !st.Lapsed || st.Share != leased(15) {
				t.Errorf("the key's local state is %+v; want lapsed at %+v", st, leased(15))
			}
		}
	})
	t.Run("below the default share, then Redis gone", func(t *testing.T) {
		// Degraded, the lapsed key runs its default share for the outage
		// policy (FailLocal: rate/N-hat), not 15; once Redis is back it
		// releases its record before it asks for anything.
		steps := []step{
			{at: 0, do: tick()},
			{at: 0, do: decide(overShare - 1)},
			{at: 50 * ms, do: tick(), calls: []req{asking(anyWant)}, state: stateAsking},
			{at: 50 * ms, do: grant(15, 15, true), state: stateHeld, share: leased(15)},
		}
		steps = append(steps, failEachTick(100*ms, 4500*ms, 15, eCTTL, 4550*ms, leased(15))...)
		lapsed := []req{{want: anyWant, ttl: eCTTL, running: 15, runningFor: eCTTL, held: true}}
		run(t, table{perTick: 1, steps: append(steps,
			step{at: 4550 * ms, do: tick(), calls: lapsed, state: stateLapsed, share: leased(15)},
			step{at: 4550 * ms, do: fail(), state: stateLapsed, share: leased(15)},
			step{at: 4560 * ms, do: degrade(true), state: stateLapsed, share: leased(15)},
			step{at: 4600 * ms, do: tick(), state: stateDefault},
			step{at: 4650 * ms, do: tick(), state: stateDefault},
			step{at: 4660 * ms, do: degrade(false), state: stateDefault},
			step{at: 4700 * ms, do: tick(), calls: []req{released}, state: stateReleasing},
			step{at: 4700 * ms, do: ack(0), state: stateDefault},
		)})
	})
}

// exactSteps: a key that asks at 50 ms and is granted 10/s of a contended
// rate (a burst part of 2 tokens, below exactBurstBelow): it moves to the
// exact placement, where it decides nothing locally.
func exactSteps() []step {
	return []step{
		{at: 0, do: decide(overShare)},
		{at: 50 * ms, do: tick(), calls: []req{asking(coldWant(50 * ms))}, state: stateAsking},
		{at: 50 * ms, do: grant(10, 10, true), state: stateExact, none: true, mark: markExactDropLease},
		{at: 100 * ms, do: decideOne(false, markExactDropLease), state: stateExact, none: true, mark: markExactDropLease},
	}
}

// TestEngineExact: a contended grant whose burst part is below
// exactBurstBelow tokens marks the key exact, at share zero, with no
// request. When its demand falls below exactLeaveBelow of its default
// share (checked every half ContendedTTL) it leaves: unmarked at once,
// deciding nothing locally, and its release goes out only after
// RedisTimeout plus a tick, when every exact decision on its way has
// ended; it returns to its default share when the release is acknowledged.
func TestEngineExact(t *testing.T) {
	steps := exactSteps()
	ex := step{state: stateExact, none: true, mark: markExactDropLease}
	// 20/s from 100 ms to 1 s.
	for at := 150 * ms; at <= 1000*ms; at += eTick {
		steps = append(steps, step{at: at, do: decide(1), state: stateExact, none: true, mark: markExactDropLease})
		ex.at, ex.do = at, tick()
		steps = append(steps, ex)
	}
	// Checked at 650 ms and every 300 ms, with a sample of its demand
	// window once a second. The demand measured since the first decision
	// (25 decisions, the last at 1 s) falls below 12.5/s with headroom at
	// 2450 ms (25/2.45 s · 1.1 = 11.2/s), but not beyond chance: a Poisson
	// count at 11.4/s over 2.35 s falls to 25 often. At 3350 ms the window
	// reaches back to its first sample with 25 decisions in 3.3 s, where
	// 11.4/s would have sent 37 (two standard deviations: 12): it leaves
	// then, before it is idle (2.5 s after its last decision).
	steps = append(steps, ticks(1050*ms, 3300*ms, ex)...)
	rel := step{state: stateReleasing, none: true}
	steps = append(steps,
		step{at: 3350 * ms, do: tick(), state: stateReleasing, none: true},
		step{at: 3400 * ms, do: decideOne(false, 0), state: stateReleasing, none: true},
	)
	// Nothing until RedisTimeout plus a tick after it left.
	steps = append(steps, ticks(3400*ms, 3500*ms, rel)...)
	run(t, table{steps: append(steps,
		step{at: 3550 * ms, do: tick(), calls: []req{released}, state: stateReleasing, none: true},
		step{at: 3550 * ms, do: fail(), state: stateReleasing, none: true},
		step{at: 3600 * ms, do: tick(), calls: []req{released}, state: stateReleasing, none: true},
		step{at: 3600 * ms, do: ack(0), state: stateDefault},
		step{at: 3650 * ms, do: tick(), state: stateDefault},
	)})
}

// TestEngineExactStaysThroughAGap: an exact key at 20/s that pauses for
// 1.6 s and goes on is not moved out by the pause. Over the window at
// 2450 ms its demand with headroom is 11.2/s, below half its default share,
// but within chance of it: leaving then would cost its next requests the
// pool's burst (TestEngineExact: the same key, staying quiet, leaves at
// 3350 ms).
func TestEngineExactStaysThroughAGap(t *testing.T) {
	steps := exactSteps()
	ex := step{state: stateExact, none: true, mark: markExactDropLease}
	busy := func(from, to time.Duration) {
		for at := from; at <= to; at += eTick {
			steps = append(steps, step{at: at, do: decide(1), state: stateExact, none: true, mark: markExactDropLease})
			ex.at, ex.do = at, tick()
			steps = append(steps, ex)
		}
	}
	busy(150*ms, 1000*ms)
	steps = append(steps, ticks(1050*ms, 2550*ms, ex)...)
	busy(2600*ms, 4000*ms)
	run(t, table{steps: steps})
}

// TestEngineExactHeavyLeaves: an exact key leaves for its share (and then
// a lease) when its demand is above exactLeaseAbove default shares (100/s)
// beyond chance, not when a client's burst makes a young key look heavy:
// 77 decisions in its first 650 ms measure 120/s, within two deviations of
// 100/s over that span; 127 are beyond them.
func TestEngineExactHeavyLeaves(t *testing.T) {
	ex := step{state: stateExact, none: true, mark: markExactDropLease}
	t.Run("burst", func(t *testing.T) {
		steps := append(exactSteps(), ticks(150*ms, 600*ms, ex)...)
		steps = append(steps, step{at: 640 * ms, do: decide(70), state: stateExact, none: true, mark: markExactDropLease})
		run(t, table{steps: append(steps, ticks(650*ms, 1000*ms, ex)...)})
	})
	t.Run("heavy", func(t *testing.T) {
		steps := exactSteps()
		for at := 150 * ms; at <= 600*ms; at += eTick {
			steps = append(steps, step{at: at, do: decide(10), state: stateExact, none: true, mark: markExactDropLease})
			ex.at, ex.do = at, tick()
			steps = append(steps, ex)
		}
		run(t, table{steps: append(steps,
			step{at: 650 * ms, do: decide(10), state: stateExact, none: true, mark: markExactDropLease},
			step{at: 650 * ms, do: tick(), state: stateReleasing, none: true},
		)})
	})
}

// TestEngineExactAsksPeers: with split bursts, an exact key whose demand
// (with headroom) is above exactAskAbove default shares asks its peers to
// yield theirs every askEvery while it stays exact: what they yield goes
// to the pool it takes from. Asked only when its share first denied a
// request, peers whose demand had not been measured yet kept their
// shares for good. A key at about its share does not ask: its peers need
// theirs too.
func TestEngineExactAsksPeers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		perTick int // decisions per tick from 150 ms: 20/s each
		asks    []time.Duration
	}{
		// 60/s, 66/s with headroom, above two shares of 25/s: at the
		// first look after the window shows it (650 ms), then every
		// askEvery at the looks every 300 ms.
		{"concentrated", 3, []time.Duration{650 * ms, 1850 * ms}},
		{"near its share", 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			steps := exactSteps()
			first := len(steps)
			for at := 150 * ms; at <= 2000*ms; at += eTick {
				steps = append(steps,
					step{at: at, do: decide(tc.perTick), state: stateExact, none: true, mark: markExactDropLease},
					step{at: at, do: tick(), state: stateExact, none: true, mark: markExactDropLease})
			}
			var asked []time.Duration
			run(t, table{steps: steps, after: func(r *rig, i int) {
				// What each tick from 150 ms asks about.
				if i >= first && (i-first)%2 == 1 && slices.Contains(r.eng.asks, "k") {
					asked = append(asked, steps[i].at)
				}
			}})
			if !slices.Equal(asked, tc.asks) {
				t.Errorf("the key asked its peers at %v; want %v", asked, tc.asks)
			}
		})
	}
}

// TestEngineExactDegraded: an exact key goes back to its default share,
// unmarked, at the first tick of a degraded limit, for its outage policy;
// when the limit recovers it releases its exact record at once (Redis
// counted it there), and then stays at its default share until that
// denies a request.
func TestEngineExactDegraded(t *testing.T) {
	run(t, table{steps: append(exactSteps(),
		step{at: 100 * ms, do: degrade(true), state: stateExact, none: true, mark: markExactDropLease},
		step{at: 100 * ms, do: tick(), state: stateDefault},
		step{at: 300 * ms, do: decideOne(true, 0), state: stateDefault},
		step{at: 300 * ms, do: tick(), state: stateDefault},
		step{at: 350 * ms, do: degrade(false), state: stateDefault},
		step{at: 350 * ms, do: tick(), calls: []req{released}, state: stateReleasing},
		step{at: 350 * ms, do: ack(0), state: stateDefault},
		step{at: 400 * ms, do: decide(overShare), state: stateDefault},
		step{at: 450 * ms, do: tick(), calls: []req{asking(anyWant)}, state: stateAsking},
	)})
}

// TestEngineDegradeAndRecovery: Redis is taken to be gone once no batch has
// been answered for UncontendedTTL/2 plus a tick (every live key renews
// within half that), not at the first failed batch; any answer restores it.
// The keys meanwhile are TestEngineFailedAndLostAnswers's: each keeps its
// grant until it ends, flagged, asks at every tick, and its first answer
// after recovery puts a grant back in force.
func TestEngineDegradeAndRecovery(t *testing.T) {
	h := health{quiet: eUTTL/2 + eTick, answered: t0}
	for _, s := range []struct {
		at     time.Duration
		answer bool
		silent bool
	}{
		{at: 0, silent: false},
		{at: 2549 * ms, silent: false},
		{at: 2550 * ms, silent: true},
		{at: 4000 * ms, silent: true},
		{at: 4000 * ms, answer: true, silent: false},
		{at: 6549 * ms, silent: false},
		{at: 6550 * ms, silent: true},
	} {
		now := t0.Add(s.at)
		if s.answer {
			h.ok(now)
		}
		if got := h.silent(now); got != s.silent {
			t.Fatalf("at %v (answered %v): silent %v; want %v", s.at, s.answer, got, s.silent)
		}
	}
}

func (c call) String() string {
	return fmt.Sprintf("{%s kind %d want %.4g ttl %v running %v for %v held %v yield %v n %d nothing waits %v}",
		c.req.Key, c.kind, c.req.Want, c.req.TTL, c.req.Running, c.req.RunningFor, c.req.Held, c.req.Yield, c.req.Instances, c.lease == nil)
}

// TestEngineExactBurstsLeave: with exact bursts a key starts exact, and
// one whose demand its default share's burst splits well (20/s against a
// share of 25/s, burst 5) leaves for a lease at its first check (half
// ContendedTTL after it came): make before break. It asks at once, keeps
// deciding exactly (still marked) while the request is on its way or
// failed, asks again at the next tick, and decides locally only once the
// grant is in force.
func TestEngineExactBurstsLeave(t *testing.T) {
	ex := step{state: stateExact, mark: markExact}
	steps := []step{{at: 0, do: decideOne(false, markExact), state: stateDefault, mark: markExact}}
	steps = append(steps, ticks(0, 250*ms, ex)...)
	run(t, table{perTick: 1, exactBursts: true, steps: append(steps,
		// Measured over the gaps of its 8 decisions: 7 in 300 ms, with
		// headroom 25.7/s.
		step{at: 300 * ms, do: tick(), calls: []req{{want: 7 / 0.3 * headroom, ttl: eUTTL}}, state: stateLeaving, mark: markExact},
		step{at: 300 * ms, do: decideOne(false, markExact), state: stateLeaving, mark: markExact},
		step{at: 300 * ms, do: fail(), state: stateLeaving, mark: markExact},
		step{at: 320 * ms, do: decideOne(false, markExact), state: stateLeaving, mark: markExact},
		step{at: 350 * ms, do: tick(), calls: []req{{want: anyWant, ttl: eUTTL}}, state: stateLeaving, mark: markExact},
		step{at: 350 * ms, do: grant(30, 30, false), state: stateHeld, share: leased(30)},
		step{at: 400 * ms, do: tick(), state: stateHeld, share: leased(30)},
	)})
}

// TestEngineExactBurstsLeaveAfterDrop: a key that went exact from a lease
// grant (a contended fair share whose burst part is 2 tokens) has takes
// that drop its lease record. When it leaves for a lease it first switches
// its takes to keeping one, and asks only RedisTimeout plus a tick later,
// when every take that could drop the new lease has ended; it decides
// exactly all along.
func TestEngineExactBurstsLeaveAfterDrop(t *testing.T) {
	steps := ticks(0, 250*ms, step{state: stateExact, mark: markExact})
	steps = append(steps,
		// 40/s: 13 gaps in 300 ms, with headroom 47.7/s.
		step{at: 300 * ms, do: tick(), calls: []req{{want: 13 / 0.3 * headroom, ttl: eUTTL}}, state: stateLeaving, mark: markExact},
		step{at: 300 * ms, do: grant(14.5, 14.5, true), state: stateExact, none: true, mark: markExactDropLease},
	)
	steps = append(steps, ticks(350*ms, 850*ms, step{state: stateExact, none: true, mark: markExactDropLease})...)
	steps = append(steps,
		step{at: 900 * ms, do: tick(), state: stateLeaving, none: true, mark: markExact},
		step{at: 900 * ms, do: decideOne(false, markExact), state: stateLeaving, none: true, mark: markExact},
	)
	steps = append(steps, ticks(950*ms, 1050*ms, step{state: stateLeaving, none: true, mark: markExact})...)
	run(t, table{perTick: 2, exactBursts: true, steps: append(steps,
		step{at: 1100 * ms, do: tick(), calls: []req{{want: anyWant, ttl: eCTTL}}, state: stateLeaving, none: true, mark: markExact},
		step{at: 1100 * ms, do: grant(40, 40, true), state: stateHeld, share: leased(40)},
	)})
}

// heldAt puts "k" in the engine as a contended lease granted granted of
// the want lastWant (its demand with headroom), asked for at t0 and
// renewing at t0+renew, in force here until t0+2s.
func heldAt(r *rig, granted, lastWant float64, renew time.Duration) *lease {
	r.t.Helper()
	r.loc.Allow(t0, "k")
	if !r.loc.Assign(t0, "k", leased(granted), t0.Add(2*time.Second)) {
		r.t.Fatal("cannot assign k")
	}
	in := r.eng.clock.instant
	le := &lease{state: stateHeld, granted: granted, fair: granted, contended: true, lastWant: lastWant,
		sentAt: in(t0), attemptedAt: 1, until: in(t0.Add(2 * time.Second)), renewAt: in(t0.Add(renew)), quietAt: 1,
		burst: uint16(leased(granted).Burst)}
	le.demand.open(in(t0))
	r.eng.keys["k"] = le
	return le
}

// TestEngineFallGivesBack: a held contended key whose demand over the last
// two ticks falls below a quarter of what it last asked for (when that
// would have been at least fallTokens decisions) lowers its share to its
// demand since, with headroom, at once, renews with that want (saying it
// runs that, held), restarts its demand window, and tells the peers
// (frees). Two ticks that came late, as after a stall of the process,
// tell nothing. A starved key whose demand falls renews the same way, but
// has nothing to lower nor to give.
func TestEngineFallGivesBack(t *testing.T) {
	// At 80/s (4 a tick, wanting 88/s), granted 60/s; the decisions stop
	// after the tick at 200 ms.
	drive := func(r *rig, at []time.Duration, stop time.Duration) map[time.Duration][]call {
		got := make(map[time.Duration][]call)
		for _, a := range at {
			if a <= stop {
				for range 4 {
					r.loc.Allow(t0.Add(a), "k")
				}
			}
			calls, _ := r.eng.collect(t0.Add(a), eN, r.loc.AppendStats(nil), nil)
			if len(calls) > 0 {
				got[a] = calls
			}
		}
		return got
	}
	every := func(from, to time.Duration) []time.Duration {
		var at []time.Duration
		for a := from; a <= to; a += eTick {
			at = append(at, a)
		}
		return at
	}
	leastWant := eRate * minWantFraction
	gaveBack := func(t *testing.T, r *rig, calls []call, at time.Duration, granted float64) {
		t.Helper()
		want := req{want: leastWant, ttl: eCTTL, running: granted, runningFor: 2*time.Second - at, held: true}
		r.checkCalls(fmt.Sprintf("at %v", at), calls, []req{want})
		le := r.eng.keys["k"]
		st := r.loc.AppendStats(nil)[0]
		if d := le.demand.rate(r.eng.clock.instant(t0.Add(at+eTick)), &st, eDef); le.granted != granted || d != 0 {
			t.Fatalf("at %v: granted %v, demand measured next %v; want %v, and 0 from a window restarted at the tick before", at, le.granted, d, granted)
		}
	}
	t.Run("fall", func(t *testing.T) {
		r := newRig(t, false)
		heldAt(r, 60, 88, time.Second)
		got := drive(r, every(eTick, 300*ms), 200*ms)
		// At 250 ms the window from the tick at 150 ms holds the
		// decisions of 200 ms; at 300 ms it holds none.
		if len(got) != 1 || got[300*ms] == nil {
			t.Fatalf("requests %v; want one, at 300 ms", got)
		}
		gaveBack(t, r, got[300*ms], 300*ms, leastWant)
		if !slices.Equal(r.eng.frees, []string{"k"}) {
			t.Fatalf("frees %v; want [k]", r.eng.frees)
		}
		if s := r.loc.AppendStats(nil)[0].Share; s.Limit != rate.Limit(leastWant) {
			t.Fatalf("the key runs %+v; want %v/s, lowered before the request", s, leastWant)
		}
	})
	t.Run("late ticks", func(t *testing.T) {
		// No tick at 250 ms: the tick at 300 ms comes 100 ms after the one
		// before, and the next one right after it.
		r := newRig(t, false)
		heldAt(r, 60, 88, time.Second)
		at := append(every(eTick, 200*ms), 300*ms, 310*ms, 360*ms, 410*ms)
		got := drive(r, at, 200*ms)
		if len(got) != 1 || got[410*ms] == nil {
			t.Fatalf("requests %v; want one, at 410 ms, after two ticks on time", got)
		}
	})
	t.Run("starved", func(t *testing.T) {
		// Granted next to nothing until the others shrink to their fair
		// shares, of 60/s here: a want below that lowers the water level.
		r := newRig(t, false)
		heldAt(r, leastWant, 88, time.Second).fair = 60
		got := drive(r, every(eTick, 300*ms), 200*ms)
		if len(got) != 1 || got[300*ms] == nil {
			t.Fatalf("requests %v; want one, at 300 ms", got)
		}
		gaveBack(t, r, got[300*ms], 300*ms, leastWant)
		if len(r.eng.frees) != 0 {
			t.Fatalf("frees %v; want none: it gave nothing back", r.eng.frees)
		}
	})
	t.Run("sparse", func(t *testing.T) {
		// 20/s, wanting 22/s: two ticks hold 2 decisions, below
		// fallTokens; it waits for its schedule.
		r := newRig(t, false)
		heldAt(r, 20, 22, time.Second)
		if got := drive(r, every(eTick, 900*ms), 0); len(got) != 0 {
			t.Fatalf("requests %v; want none before the schedule", got)
		}
	})
	t.Run("still above its share", func(t *testing.T) {
		// Granted and fair at 5/s; after 200 ms one decision every 100 ms
		// (10/s, wanting 11/s): a fall from 88/s, but still above the
		// water level Redis filled to, so no one's share would change,
		// and no request goes: the key only forgets the demand before.
		r := newRig(t, false)
		heldAt(r, 5, 88, time.Second)
		for _, a := range every(eTick, 500*ms) {
			n := 4
			if a > 200*ms {
				n = 0
				if a%(100*ms) == 0 {
					n = 1
				}
			}
			for range n {
				r.loc.Allow(t0.Add(a), "k")
			}
			if calls, _ := r.eng.collect(t0.Add(a), eN, r.loc.AppendStats(nil), nil); len(calls) > 0 {
				t.Fatalf("at %v: requests %v; want none before the renewal at 1s", a, calls)
			}
		}
		// The demand before the fall is not asked for again: the want
		// since (10/s with headroom) is what the renewal will carry.
		if le := r.eng.keys["k"]; math.Abs(le.lastWant-11) > 1e-9 {
			t.Fatalf("last want %v; want 11, the demand since the fall", le.lastWant)
		}
	})
}

// TestEngineFreedRenews: told by a peer that it gave up part of a
// contended grant of "k", a held key that wants notably more than its
// grant renews at the next tick; one that has what it wants, or that asked
// less than a tick ago, waits for its schedule.
func TestEngineFreedRenews(t *testing.T) {
	for _, tc := range []struct {
		name          string
		granted, want float64
		at            time.Duration
		renews        bool
	}{
		{"wants more", 25, 88, 100 * ms, true},
		{"has what it wants", 25, 25, 100 * ms, false},
		{"asked just now", 25, 88, 20 * ms, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, false)
			heldAt(r, tc.granted, tc.want, time.Second)
			r.eng.freed(t0.Add(tc.at), "k")
			calls, _ := r.eng.collect(t0.Add(tc.at+eTick), eN, r.loc.AppendStats(nil), nil)
			if got := len(calls) == 1; got != tc.renews {
				t.Fatalf("at %v: requests %v; want a renewal: %v", tc.at+eTick, calls, tc.renews)
			}
		})
	}
}

// TestEngineYoungDemand: a key's requests say its demand is young
// (LeaseRequest.Young) from the first that wants more than it runs (with
// headroom, and more than the least want) until youngFor later; a request
// within what it runs ends that, and the next one that wants more is young
// again.
func TestEngineYoungDemand(t *testing.T) {
	r := newRig(t, false)
	le := heldAt(r, 25, 27.5, time.Hour)
	st := &local.KeyStats{Key: "k", Created: t0}
	young := func(at time.Duration, attempted int64) bool {
		st.Attempted, st.LastSeen = attempted, t0.Add(at)
		return r.eng.renewal(r.eng.clock.instant(t0.Add(at)), eN, st, le, eDef).Young
	}
	// The first request at 100/s over 500 ms (55/s wanted is more than
	// 25/s with headroom) opens the window: young until 800 ms.
	steps := []struct {
		at        time.Duration
		attempted int64
		young     bool
	}{
		{500 * ms, 50, true},
		{700 * ms, 70, true},
		{800 * ms, 80, false}, // youngFor after the first
		{900 * ms, 90, false},
		{1900 * ms, 92, false}, // 2/s: within what it runs
		{2400 * ms, 142, true}, // 100/s again: young again
	}
	for _, s := range steps {
		if got := young(s.at, s.attempted); got != s.young {
			t.Fatalf("at %v: young %v; want %v (wantsMoreAt %v)", s.at, got, s.young, le.wantsMoreAt.Sub(r.eng.clock.instant(t0)))
		}
	}
}

// TestEngineStarvedByRate: a contended grant short of its fair share by
// more than ackShrink of the rate is starved even above starvedFair of it:
// it renews soonTicks after its request and asks its peers, as one below
// starvedFair does.
func TestEngineStarvedByRate(t *testing.T) {
	r := newRig(t, false)
	le := heldAt(r, 50, 88, time.Second)
	c := call{req: global.LeaseRequest{Key: "k", Want: 88, Rate: eRate, Instances: eN, TTL: eCTTL, Running: 50, Held: true}, lease: le}
	// 92% of its fair share, 6/s (6% of the rate) short of it.
	r.eng.answered(t0, t0, &c, &global.Lease{Granted: 74, Fair: 80, Contended: true, Burst: eBurst * 74 / eRate})
	if want := r.eng.clock.instant(t0.Add(soonTicks * eTick)); !le.renewAt.Equal(want) || !le.peersCouldYield(eRate) {
		t.Fatalf("renews at %v, peers could yield %v; want %v and true", le.renewAt.Sub(r.eng.clock.instant(t0)), le.peersCouldYield(eRate), want.Sub(r.eng.clock.instant(t0)))
	}
}

// TestEngineAskedHeldRenews: asked by a peer to yield, a held key renews at
// the next tick with its demand now, if its last request is soonTicks
// ticks old or more; a younger one waits for its schedule.
// One that uses its grant (its demand with headroom within ackShrink of
// the rate of it) has nothing to give: it renews on its schedule, not at
// each ask (a starved peer asks every few ticks, and each ask made every
// light instance of the key renew).
func TestEngineAskedHeldRenews(t *testing.T) {
	for _, tc := range []struct {
		at          time.Duration
		every       time.Duration // between decisions from t0 to at; 0: one at t0
		exactBursts bool
		renews      bool
	}{
		{soonTicks * eTick, 0, false, true},
		{eTick, 0, false, false},
		{soonTicks * eTick, 40 * ms, false, false},
		// With exact bursts it renews on each ask, as before (see couldFree).
		{soonTicks * eTick, 40 * ms, true, true},
	} {
		r := newRig(t, tc.exactBursts)
		heldAt(r, 25, 27.5, time.Second)
		for at := tc.every; tc.every > 0 && at <= tc.at; at += tc.every {
			r.loc.Allow(t0.Add(at), "k") // 25/s: its whole grant
		}
		r.eng.yieldAsked(t0.Add(tc.at), "k", eN)
		calls, _ := r.eng.collect(t0.Add(tc.at), eN, r.loc.AppendStats(nil), nil)
		if got := len(calls) == 1; got != tc.renews {
			t.Fatalf("asked %v after its request, a decision every %v, exact bursts %v: requests %v; want a renewal: %v",
				tc.at, tc.every, tc.exactBursts, calls, tc.renews)
		}
	}
}

// TestEngineDeniedWantsLastTick: a held key denied since the last tick
// asks for at least its demand over that tick, with headroom: its window,
// which reaches back to demandTokens decisions, lags a jump.
func TestEngineDeniedWantsLastTick(t *testing.T) {
	// Granted all it asked for: its demand growing, it asks again.
	r := newRig(t, false)
	heldAt(r, 25, 25, time.Hour)
	r.loc.Allow(t0.Add(eTick), "k")
	if calls, _ := r.eng.collect(t0.Add(eTick), eN, r.loc.AppendStats(nil), nil); len(calls) != 0 {
		t.Fatalf("at %v: requests %v; want none", eTick, calls)
	}
	for range 20 {
		r.loc.Allow(t0.Add(2*eTick), "k") // 400/s over the tick: its burst of 5 runs out
	}
	calls, _ := r.eng.collect(t0.Add(2*eTick), eN, r.loc.AppendStats(nil), nil)
	if len(calls) != 1 || math.Abs(calls[0].req.Want-400*headroom) > 1e-6 {
		t.Fatalf("at %v: requests %v; want one for 440/s", 2*eTick, calls)
	}
}

// TestEngineYoungDemandSplitsWell: a limit whose default share splits the
// burst below exactBurstBelow never says its demand is young: its
// contended keys go to the exact placement instead.
func TestEngineYoungDemandSplitsWell(t *testing.T) {
	r := newRig(t, false)
	r.eng.setLimit(eRate, 8, false) // a default burst share of 2
	le := heldAt(r, 25, 27.5, time.Hour)
	st := &local.KeyStats{Key: "k", Created: t0, Attempted: 50, LastSeen: t0.Add(500 * ms)}
	if r.eng.renewal(r.eng.clock.instant(t0.Add(500*ms)), eN, st, le, eDef).Young {
		t.Fatal("young with a default burst share of 2")
	}
}

// TestEngineTrackedLateMeasuresFromNow: a key that sent a few requests,
// went quiet for a minute and came back at 20/s (within its 25/s share) is
// tracked once it has seen demandTokens tokens, and measures its demand
// from then, not over its whole life (0.3/s): asked to yield a quarter of
// a second later, it needs its share and keeps it.
func TestEngineTrackedLateMeasuresFromNow(t *testing.T) {
	steps := []step{{at: 0, do: decide(5)}, {at: 0, do: tick()}}
	for at := 60 * time.Second; at <= 62*time.Second; at += eTick {
		steps = append(steps, step{at: at, do: decide(1)}, step{at: at, do: tick()})
		if at == 61*time.Second {
			steps = append(steps, step{at: at, do: peerAsks()}, step{at: at, do: tick()})
		}
	}
	run(t, table{steps: steps})
}

// TestEngineBurstPart: the engine has Redis count the burst apart from
// the rate. A request gives the limit's burst, asks for its want's part
// of it but at least the default part (burst/N-hat: a light instance keeps
// what absorbs its uneven arrivals), and says the part its bucket runs
// now; a grant runs the part Redis gave, rounded down, not its rate's; a
// renewal says it runs that part.
func TestEngineBurstPart(t *testing.T) {
	r := newRig(t, false)
	decide(eBurst).run(r, t0) // the default share's 5 tokens, then denials
	calls := tick().run(r, t0)
	if len(calls) != 1 {
		t.Fatalf("%d requests; want the one asking for a lease", len(calls))
	}
	q := calls[0].req
	wantB := max(eBurst*q.Want/eRate, float64(eBurst)/eN)
	if q.Burst != eBurst || q.WantBurst != wantB || q.RunningBurst != eBurst/eN {
		t.Fatalf("request %+v; want burst %d, a part of %v, running %d", q, eBurst, wantB, eBurst/eN)
	}
	// Granted 30/s with 8.9 tokens, where its rate's part would be 6.
	answer("grant", global.Lease{Granted: 30, Fair: 30, Contended: true, Burst: 8.9}).run(r, t0)
	if st, _ := r.loc.Stats("k"); st.Share != (local.Share{Limit: 30, Burst: 8}) {
		t.Fatalf("the key runs %+v; want 30/s with 8 tokens", st.Share)
	}
	for at := eTick; at <= eCTTL; at += eTick {
		decide(2).run(r, t0.Add(at))
		if calls := tick().run(r, t0.Add(at)); len(calls) > 0 {
			if q := calls[0].req; q.RunningBurst != 8 || q.Running != 30 {
				t.Errorf("renewal %+v; want running 30/s with 8 tokens", q)
			}
			return
		}
	}
	t.Fatal("no renewal within a contended lease")
}

// exactByGrant moves "k" of r (split bursts) to the exact placement at t0:
// k decisions, more than its default share's part of the burst, and its
// lease request answered contended at a fair share of fair, whose part of
// the burst r's limit splits too finely (exactBurstBelow).
func exactByGrant(t *testing.T, r *rig, k int, fair float64) *lease {
	t.Helper()
	decide(k).run(r, t0) // its default share's tokens, then denials
	if calls := tick().run(r, t0); len(calls) != 1 {
		t.Fatalf("%d requests; want the one asking for a lease", len(calls))
	}
	answer("grant", global.Lease{Granted: fair / 2, Fair: fair, Contended: true, Burst: 1}).run(r, t0)
	le := r.eng.keys["k"]
	if le.state != stateExact {
		t.Fatalf("state %v after the grant; want exact", le.state)
	}
	return le
}

// TestEngineExactLightKeyLeaves: an exact key (split bursts) whose traffic
// here is light but steady leaves the exact placement within seconds: a
// limit of 20/s burst 10 over 4 instances (a default share of 5/s; an
// exact key leaves below half of it, 2.27/s with headroom) and a request
// every 750 ms (1.33/s). Its demand window takes a sample a second, so
// its samples span seconds, enough tokens to show it light beyond chance.
// With a sample at every look (every 300 ms) they spanned 2.4 s with three
// requests in it, never enough, and a key that was never idle stayed
// exact, counted at its default share, for good.
func TestEngineExactLightKeyLeaves(t *testing.T) {
	r := rigFor(t, 20, 10, false)
	exactByGrant(t, r, 5, 5) // a fair share of 5/s: 2 tokens of burst, too few
	for at := eTick; at < 15*time.Second; at += eTick {
		if at%(750*ms) == 0 {
			r.loc.Allow(t0.Add(at), "k")
		}
		tick().run(r, t0.Add(at))
		if le := r.eng.keys["k"]; le.state != stateExact {
			if le.state != stateReleasing || at > 12*time.Second {
				t.Fatalf("at %v: state %v; want releasing within 12 s", at, le.state)
			}
			t.Logf("left at %v", at)
			return
		}
	}
	t.Fatal("the light key stayed exact for 15 s")
}

// TestEngineGrantWithoutAWholeToken: a grant of a rate whose part of the
// burst is under one token (a young or starved grant while the others hold
// nearly all the burst) runs nothing until a grant with a token, and asks
// again soon. A bucket needs a whole token to admit anything, and the
// local limiter raises an assigned share with a rate to one: the key would
// run a token Redis counts at less, and the parts run would sum above the
// burst. With a burst below the instance count no grant would ever hold a
// token: there the key decides against the pool (exact), which holds them.
// A grant with a whole token runs it as before.
func TestEngineGrantWithoutAWholeToken(t *testing.T) {
	for _, tc := range []struct {
		name  string
		burst int // the limit's, over eN instances
		res   global.Lease
		exact bool
		runs  local.Share
	}{
		{"uncontended, 0.6 tokens", eBurst, global.Lease{Granted: 60, Fair: 60, Burst: 0.6}, false, local.Share{}},
		// A fair share whose part of the burst splits well (6 tokens), so
		// only the starved grant's part is short of a token.
		{"contended, starved at 0.8 tokens", eBurst, global.Lease{Granted: 4, Fair: 30, Contended: true, Burst: 0.8}, false, local.Share{}},
		{"uncontended, 1 token", eBurst, global.Lease{Granted: 60, Fair: 60, Burst: 1}, false, local.Share{Limit: 60, Burst: 1}},
		{"a burst below the instance count, 0.5 tokens", 2, global.Lease{Granted: 60, Fair: 60, Burst: 0.5}, true, local.Share{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rigFor(t, eRate, tc.burst, false)
			decide(3*eBurst).run(r, t0) // the default share's tokens, then denials
			if calls := tick().run(r, t0); len(calls) != 1 {
				t.Fatalf("%d requests; want the one asking for a lease", len(calls))
			}
			answer("grant", tc.res).run(r, t0)
			st, _ := r.loc.Stats("k")
			le := r.eng.keys["k"]
			if (le.state == stateExact) != tc.exact || (!tc.exact && (le.state != stateHeld || st.Share != tc.runs)) {
				t.Fatalf("state %v, running %+v; want exact %v, or held running %+v", le.state, st.Share, tc.exact, tc.runs)
			}
			// Whatever it does, it never admits in process more tokens at
			// once than Redis granted it: the whole part, rounded down.
			admitted := 0
			for range 3 * eBurst {
				if res := r.loc.Allow(t0, "k"); res.Allowed {
					admitted++
				}
			}
			if admitted > int(tc.res.Burst) {
				t.Errorf("admitted %d at once in process; Redis granted a part of %v tokens", admitted, tc.res.Burst)
			}
			if !tc.exact && tc.runs == (local.Share{}) {
				// Held at nothing: it asks again within soonTicks.
				for at := eTick; at <= soonTicks*eTick; at += eTick {
					if calls := tick().run(r, t0.Add(at)); len(calls) == 1 {
						return
					}
				}
				t.Errorf("no request within %d ticks of a grant without a token", soonTicks)
			}
		})
	}
}

// TestEngineExactBelowATokenStays: with a burst below the instance count
// (2 tokens over 4 instances), a lease would hold less than a whole token
// (TestEngineGrantWithoutAWholeToken) and the default share holds none, so
// a key that went exact for that stays exact however heavy or light it is,
// rather than ask for a lease that would send it back at every look, or
// release its record for a share that admits nothing and wait that
// release out, counted at that share, while the pool goes without it.
func TestEngineExactBelowATokenStays(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every time.Duration // a decision every
	}{
		{"heavy", eTick / 5},   // 100/s, 20 default shares
		{"light", time.Second}, // 1/s, a fifth of a default share
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rigFor(t, 20, 2, false)
			decide(5).run(r, t0)
			if calls := tick().run(r, t0); len(calls) != 1 {
				t.Fatalf("%d requests; want the one asking for a lease", len(calls))
			}
			// Half a token: the others count at burst/4 each.
			answer("grant", global.Lease{Granted: 20, Fair: 20, Burst: 0.5}).run(r, t0)
			if le := r.eng.keys["k"]; le.state != stateExact {
				t.Fatalf("state %v after the grant; want exact", le.state)
			}
			next := t0
			for at := eTick; at <= 15*time.Second; at += eTick {
				for ; !next.After(t0.Add(at)); next = next.Add(tc.every) {
					r.loc.Allow(next, "k")
				}
				if calls := tick().run(r, t0.Add(at)); len(calls) > 0 {
					t.Fatalf("at %v: %d requests (%+v); want none, the key deciding exactly", at, len(calls), calls[0].req)
				}
				if le := r.eng.keys["k"]; le.state != stateExact {
					t.Fatalf("at %v: state %v; want exact", at, le.state)
				}
			}
		})
	}
}

// TestEngineYieldBelowATokenKeepsNothing: with a burst below the instance
// count (2 tokens over 4 instances), Redis counts an instance without a
// record at burst/4, half a token, until its yield is recorded. A key
// asked to yield to a rate whose part of the burst is under a token keeps
// nothing, and its record counts no token for it: the local limiter would
// raise a share with a rate to a whole token, which Redis would count at
// half. A limit whose instances each hold a token keeps its rate and its
// default part of the burst, which its record keeps counted.
func TestEngineYieldBelowATokenKeepsNothing(t *testing.T) {
	for _, tc := range []struct {
		burst    int
		runs     local.Share // after the yield, to 1.1/s (1/s with headroom)
		recorded float64     // the part of the burst its record counts
	}{
		{2, local.Share{}, 0},
		{20, local.Share{Limit: 1.1, Burst: 5}, 5},
	} {
		t.Run(fmt.Sprintf("burst=%d", tc.burst), func(t *testing.T) {
			r := rigFor(t, 20, tc.burst, false)
			// A request a second for two seconds: measured at 1/s, below
			// half its default share of 5/s.
			for at := time.Duration(0); at <= 2*time.Second; at += eTick {
				if at%time.Second == 0 {
					r.loc.Allow(t0.Add(at), "k")
				}
				tick().run(r, t0.Add(at))
			}
			peerAsks().run(r, t0.Add(2*time.Second+eTick/2))
			st, _ := r.loc.Stats("k")
			if le := r.eng.keys["k"]; le == nil || le.state != stateYielded || st.Share != tc.runs {
				t.Fatalf("after the ask: %+v running %+v; want yielded, running %+v", le, st.Share, tc.runs)
			}
			calls := tick().run(r, t0.Add(2*time.Second+eTick))
			if len(calls) != 1 || calls[0].kind != callYield {
				t.Fatalf("%d requests (%+v); want the yield's record", len(calls), calls)
			}
			if q := calls[0].req; q.RunningBurst != tc.recorded || q.WantBurst != tc.recorded {
				t.Errorf("the yield's record counts %v tokens (wants %v); want %v, its bucket running %d",
					q.RunningBurst, q.WantBurst, tc.recorded, tc.runs.Burst)
			}
		})
	}
}

// TestEngineHeldLightKeyYields: a held contended key that a peer asked to
// yield, and whose demand with headroom, measured over a second and three
// decisions or more, is within its grant and below yieldBelow of its
// default share, yields to that demand at its next renewal instead of
// renewing its lease: a yield record lasts seconds, a contended lease a
// few ticks. Until the record is written it runs at most its grant's part
// of the burst; then the yield's share. Not when nobody asked, when its
// decisions are too few to say its rate, when it needs more than its
// grant (it is starved, and renews to get it), nor with exact bursts. A
// window that holds too few decisions (a sparse key's, a few renewals
// back) gives way to the key's demand over its life.
func TestEngineHeldLightKeyYields(t *testing.T) {
	// Seven decisions 200 ms apart from t0: six gaps over 1.2 s, 5/s.
	const kept = 5 * headroom
	for _, tc := range []struct {
		name        string
		granted     float64
		every       time.Duration // between decisions, from t0 to 1.2 s
		asked       bool
		exactBursts bool
		yields      bool
	}{
		{"light and asked", 10, 200 * ms, true, false, true},
		{"not asked", 10, 200 * ms, false, false, false},
		{"too few decisions", 10, 1200 * ms, true, false, false},
		{"sparse window, measured over its life", 10, 0, true, false, true},
		{"starved", kept - 1, 200 * ms, true, false, false},
		{"exact bursts", 10, 200 * ms, true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.exactBursts)
			le := heldAt(r, tc.granted, tc.granted*headroom, 1200*ms)
			le.burst = eBurst / eN // a lease asks for its default part at least (wantBurst)
			if !r.loc.Assign(t0, "k", local.Share{Limit: rate.Limit(tc.granted), Burst: eBurst / eN}, t0.Add(2*time.Second)) {
				t.Fatal("cannot assign k")
			}
			for at := tc.every; tc.every > 0 && at <= 1200*ms; at += tc.every {
				r.loc.Allow(t0.Add(at), "k")
			}
			if tc.every == 0 {
				// Six decisions, the last two since its window restarted:
				// too few to measure on, so it measures over its life:
				// six over 1.2 s, 5/s.
				for _, at := range []time.Duration{200 * ms, 400 * ms, 600 * ms, 1050 * ms, 1150 * ms} {
					r.loc.Allow(t0.Add(at), "k")
					if at == 600*ms {
						le.demand.restart(r.eng.clock.instant(t0.Add(time.Second)), 4)
					}
				}
			}
			if tc.asked {
				r.eng.yieldAsked(t0.Add(time.Second), "k", eN)
			}
			now := t0.Add(1200 * ms)
			calls, _ := r.eng.collect(now, eN, r.loc.AppendStats(nil), nil)
			st, _ := r.loc.Stats("k")
			if !tc.yields {
				if len(calls) != 1 || calls[0].kind != callLease || le.state != stateHeld {
					t.Fatalf("requests %+v, state %v; want a lease renewal, held", calls, le.state)
				}
				return
			}
			if len(calls) != 1 || calls[0].kind != callYield || le.state != stateYielded ||
				math.Abs(calls[0].req.Want-kept) > 1e-9 || math.Abs(le.granted-kept) > 1e-9 {
				t.Fatalf("requests %+v, state %v, kept %v; want a yield of %v", calls, le.state, le.granted, kept)
			}
			if c := calls[0].req; c.Running != c.Want || c.RunningBurst != eBurst/eN {
				t.Fatalf("yield request %+v; want it to say it runs %v and the default part of the burst", c, kept)
			}
			if want := (local.Share{Limit: rate.Limit(kept), Burst: eBurst / eN}); st.Share != want {
				t.Fatalf("running %+v until the yield is recorded; want %+v", st.Share, want)
			}
			r.eng.answered(now, now, &calls[0], &global.Lease{Granted: kept, Fair: kept, Contended: true})
			if st, _ := r.loc.Stats("k"); st.Share != yielded(kept) || le.state != stateYielded {
				t.Fatalf("recorded: running %+v, state %v; want %+v, yielded", st.Share, le.state, yielded(kept))
			}
		})
	}
}
