package hybrid

import (
	"fmt"
	"math"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/local"
)

// The lease policy in step tables, as x/time/rate and package local are
// tested: a fixed t0, steps at t0 + k·d, each step one call to the engine
// and what it must return and leave behind. No Redis and no clock: the
// answers are written in the table, and the keys' limiters are real
// local.Limiters driven at the same instants.

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// The limit and timings of every table: 100/s, burst 20, over 4 instances
// (a default share of 25/s), the Config defaults for the loop.
const (
	eRate  = 100.0
	eBurst = 20
	eN     = 4
	eTick  = 50 * time.Millisecond
	eCTTL  = 600 * time.Millisecond
	eUTTL  = 5 * time.Second
	ms     = time.Millisecond
)

// rig is one instance's engine and key limiters for one limit.
type rig struct {
	t     *testing.T
	loc   *local.Limiter
	flags map[string]bool // what the engine flagged through SetFlag
	eng   *engine
	n     int
	// The calls of the last tick, and when they went out: answers go to
	// them.
	pending []call
	sentAt  time.Time
	// What the last answer reported.
	assigned, recovered, failing bool
	expired                      int
}

func newRig(t *testing.T) *rig {
	t.Helper()
	loc, err := local.New(local.Config{Limit: eRate, Burst: eBurst, Instances: eN})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, loc: loc, flags: map[string]bool{}, n: eN}
	r.eng = newEngine(Limit{Name: "api", Rate: eRate, Burst: eBurst}, "me",
		timings{tick: eTick, contendedTTL: eCTTL, uncontendedTTL: eUTTL}, flagRecorder{r})
	return r
}

// flagRecorder passes the engine's calls to the rig's limiter, and records
// the flags it sets, which decisions only report.
type flagRecorder struct{ r *rig }

func (f flagRecorder) Assign(t time.Time, key string, s local.Share, until time.Time) bool {
	return f.r.loc.Assign(t, key, s, until)
}
func (f flagRecorder) AssignNew(t time.Time, key string, s local.Share, until time.Time) bool {
	return f.r.loc.AssignNew(t, key, s, until)
}
func (f flagRecorder) Unassign(t time.Time, key string) bool { return f.r.loc.Unassign(t, key) }
func (f flagRecorder) SetMark(key string, m uint8) bool      { return f.r.loc.SetMark(key, m) }
func (f flagRecorder) SetNewMark(m uint8)                    { f.r.loc.SetNewMark(m) }
func (f flagRecorder) SetFlag(key string, on bool) bool {
	f.r.flags[key] = on
	return f.r.loc.SetFlag(key, on)
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

// grant answers the last tick's request of "k".
func grant(granted, fair float64, contended bool) op {
	return op{fmt.Sprintf("grant(%v, fair %v, contended %v)", granted, fair, contended), func(r *rig, now time.Time) []call {
		res := global.Lease{Granted: granted, Fair: fair, Contended: contended}
		r.assigned, r.recovered = r.eng.answered(now, r.sentAt, r.onlyPending(), &res)
		return nil
	}}
}

// fail answers the last tick's request of "k" with a failure: an error, or
// an answer lost on the way, which the loop sees as a timeout.
func fail() op {
	return op{"fail", func(r *rig, now time.Time) []call {
		r.failing = r.eng.failed(r.sentAt, r.onlyPending())
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

// instances changes the instance count to n, as membership reports it.
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

// req is an expected lease request of key "k" (Limit, Instance, Rate and
// Cold are checked once, in check).
type req struct {
	want        float64
	ttl         time.Duration
	running     float64
	runningFor  time.Duration
	instances   int // 0 means eN
	releaseOnly bool
}

// anyWant in a req leaves its want unchecked: the tables about the
// schedule leave demand to those about demand.
const anyWant = -1

// release is the expected release of "k".
var release = req{ttl: eCTTL, releaseOnly: true}

// step is one row of a table: at t0+at, run do; it must return exactly
// calls, and leave "k" in state with its local share.
type step struct {
	at    time.Duration
	do    op
	calls []req
	state keyState
	// share is the share "k" runs at on this instance; zero means the
	// default share.
	share local.Share
}

// table is a test's steps, with an optional steady load: perTick
// decisions on "k" at every tick instant t0 + k·eTick up to each step's, so
// that the key's demand is a known 20·perTick/s.
type table struct {
	perTick int
	steps   []step
	// after, if set, runs after step i has been checked.
	after func(r *rig, i int)
}

func run(t *testing.T, tb table) *rig {
	t.Helper()
	r := newRig(t)
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
		r.checkCalls(where, now, calls, s.calls)
		r.checkKey(where, now, s)
		if tb.after != nil {
			tb.after(r, i)
		}
	}
	return r
}

func (r *rig) checkCalls(where string, now time.Time, got []call, want []req) {
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
		ok := g.Key == "k" && g.Limit == "api" && g.Instance == "me" && g.Rate == eRate && g.MaxTTL == yieldLife*eUTTL &&
			g.Instances == n && g.TTL == w.ttl && g.Running == w.running && g.RunningFor == w.runningFor &&
			(w.want == anyWant || math.Abs(g.Want-w.want) < 1e-9) && (got[i].lease == nil) == w.releaseOnly
		if !ok {
			r.t.Fatalf("%s: request %d is %+v (release %v); want %+v", where, i, g, got[i].lease == nil, w)
		}
	}
}

func (r *rig) checkKey(where string, now time.Time, s step) {
	r.t.Helper()
	le := r.eng.keys["k"]
	switch {
	case le == nil && s.state != stateDefault:
		r.t.Fatalf("%s: key unknown to the engine; want %v", where, s.state)
	case le != nil && le.state != s.state:
		r.t.Fatalf("%s: state %v; want %v", where, le.state, s.state)
	}
	want := s.share
	if want == (local.Share{}) {
		want = r.loc.Default()
	}
	for _, st := range r.loc.AppendStats(nil) {
		if st.Key != "k" {
			continue
		}
		share := st.Share
		if st.Assigned && !now.Before(st.Until) {
			share = r.loc.Default() // ended: the next decision runs the default
		}
		if share != want {
			r.t.Fatalf("%s: the key runs at %+v; want %+v", where, share, want)
		}
	}
}

// leased is a share granted at g tokens/s: its burst is in proportion.
func leased(g float64) local.Share {
	return local.Share{Limit: rate.Limit(g), Burst: int(eBurst * g / eRate)}
}

// coldWant is the want of a key whose only decision was at t0, asked for
// at t0+at: one request says nothing of its rate, so its gap to now is
// taken as its period (at most the default share), with headroom.
func coldWant(at time.Duration) float64 { return min(eRate/eN, 1/at.Seconds()) * headroom }

// TestEngineColdStartAndFirstGrant: a key asks for its first lease at the
// tick after its first decision, as uncontended and at its default share
// until it is granted; the grant is in force at once, renews at half its
// lifetime, and says what it runs until the answer arrives.
func TestEngineColdStartAndFirstGrant(t *testing.T) {
	run(t, table{steps: []step{
		{at: 0, do: tick()}, // no key yet
		{at: 0, do: decide(1)},
		{at: 0, do: tick()}, // decided at this instant: nothing measured yet
		{at: 50 * ms, do: tick(), calls: []req{{want: coldWant(50 * ms), ttl: eUTTL}}, state: stateAsking},
		{at: 50 * ms, do: grant(25, 25, false), state: stateHeld, share: leased(25)},
		{at: 100 * ms, do: tick(), state: stateHeld, share: leased(25)},
		{at: 1000 * ms, do: decide(1), state: stateHeld, share: leased(25)},
		{at: 2500 * ms, do: tick(), state: stateHeld, share: leased(25)},
		// Renews at half its lifetime, running its grant until 90% of it.
		// Its want: two decisions a second apart, over 2.55 s.
		{at: 2550 * ms, do: tick(), calls: []req{{want: 2 / 2.55 * headroom, ttl: eUTTL, running: 25, runningFor: 2000 * ms}},
			state: stateHeld, share: leased(25)},
	}})
}

// contendedSteps: a key at a steady 40/s, above its fair share of 25/s,
// granted that share three times in a row: settled, renewing at 1650 ms on
// a lease of 2·ContendedTTL that runs until 2130 ms.
func contendedSteps() []step {
	held, share := stateHeld, leased(25)
	c := func(ttl, runningFor time.Duration) []req {
		return []req{{want: anyWant, ttl: ttl, running: 25, runningFor: runningFor}}
	}
	return []step{
		{at: 0, do: tick()},
		{at: 50 * ms, do: tick(), calls: []req{{want: anyWant, ttl: eUTTL}}, state: stateAsking},
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
		{at: 1050 * ms, do: tick(), calls: c(2*eCTTL, 240*ms), state: held, share: share},
		{at: 1050 * ms, do: grant(25, 25, true), state: held, share: share},
	}
}

// TestEngineRenewalSchedule: a contended key renews two ticks after its
// first grant (the others have not said what they want yet), then every
// half ContendedTTL while its share moves; once unchanged settleAfter times
// in a row its lifetime doubles at each renewal, up to UncontendedTTL. A
// share that moves again goes back to the contended schedule, and a starved
// one asks again two ticks later.
func TestEngineRenewalSchedule(t *testing.T) {
	held := stateHeld
	c := func(ttl, runningFor time.Duration, running float64) []req {
		return []req{{want: anyWant, ttl: ttl, running: running, runningFor: runningFor}}
	}
	run(t, table{perTick: 2, steps: append(contendedSteps(),
		step{at: 1600 * ms, do: tick(), state: held, share: leased(25)},
		step{at: 1650 * ms, do: tick(), calls: c(4*eCTTL, 480*ms, 25), state: held, share: leased(25)},
		step{at: 1650 * ms, do: grant(25, 25, true), state: held, share: leased(25)},
		step{at: 2800 * ms, do: tick(), state: held, share: leased(25)},
		step{at: 2850 * ms, do: tick(), calls: c(8*eCTTL, 960*ms, 25), state: held, share: leased(25)},
		step{at: 2850 * ms, do: grant(25, 25, true), state: held, share: leased(25)},
		step{at: 5200 * ms, do: tick(), state: held, share: leased(25)},
		step{at: 5250 * ms, do: tick(), calls: c(eUTTL, 1920*ms, 25), state: held, share: leased(25)}, // capped
		// The share moves: back to the contended schedule at once.
		step{at: 5250 * ms, do: grant(30, 30, true), state: held, share: leased(30)},
		step{at: 5500 * ms, do: tick(), state: held, share: leased(30)},
		step{at: 5550 * ms, do: tick(), calls: c(eCTTL, 4200*ms, 30), state: held, share: leased(30)},
		// Starved: others hold more than their share; ask again two ticks on.
		step{at: 5550 * ms, do: grant(27, 32, true), state: held, share: leased(27)},
		step{at: 5600 * ms, do: tick(), state: held, share: leased(27)},
		step{at: 5650 * ms, do: tick(), calls: c(eCTTL, 440*ms, 27), state: held, share: leased(27)},
	)})
}

// TestEngineSettledRenewsEarlyWhenDemandMoves: a settled contended lease
// renews early, at most every earlyEvery ticks, when its demand falls far
// below its grant or, having asked for less than its fair share, grows well
// past what it asked for.
func TestEngineSettledRenewsEarlyWhenDemandMoves(t *testing.T) {
	// At 40/s (wanting 44/s) this instance asks for more than its fair
	// share of 25/s; at 10/s it would free more than a quarter of it.
	t.Run("demand falls", func(t *testing.T) {
		// Settled at 40/s, granted 25/s; the renewal at 1650 ms is for
		// 2.4 s, and the next due at 2850 ms. Then the decisions stop: the
		// demand measured back to 1050 ms (24 decisions) falls below 75% of
		// the grant, with headroom, after 2458 ms.
		r := run(t, table{perTick: 2, steps: append(contendedSteps(),
			step{at: 1650 * ms, do: tick(), calls: []req{{want: anyWant, ttl: 4 * eCTTL, running: 25, runningFor: 480 * ms}},
				state: stateHeld, share: leased(25)},
			step{at: 1650 * ms, do: grant(25, 25, true), state: stateHeld, share: leased(25)},
		)})
		for at := 1700 * ms; at <= 2500*ms; at += eTick {
			calls, _ := r.eng.collect(t0.Add(at), eN, r.loc.AppendStats(nil), nil)
			if at < 2500*ms && len(calls) != 0 {
				t.Fatalf("at %v: renewed %v while demand was still measured above the threshold", at, calls)
			}
			if at == 2500*ms && (len(calls) != 1 || calls[0].req.Want >= 25*settledShrink) {
				t.Fatalf("at %v: got %v; want an early renewal asking for less than 75%% of the grant", at, calls)
			}
		}
	})
	t.Run("demand grows past a want below the fair share", func(t *testing.T) {
		r := newRig(t)
		for at := time.Duration(0); at <= 1050*ms; at += eTick {
			r.loc.Allow(t0.Add(at), "k") // 20/s, wanting 22/s
		}
		le := &lease{state: stateHeld, granted: 22, fair: 30, contended: true, stable: settleAfter,
			lastWant: 22, sentAt: t0.Add(1050 * ms), attemptedAt: 22, until: t0.Add(2130 * ms), renewAt: t0.Add(1650 * ms)}
		le.demand.open(t0)
		le.demand.record(t0.Add(1050*ms), 22)
		r.eng.keys["k"] = le
		for at := 1100 * ms; at <= 1250*ms; at += eTick {
			for range 3 {
				r.loc.Allow(t0.Add(at), "k") // 60/s
			}
			calls, _ := r.eng.collect(t0.Add(at), eN, r.loc.AppendStats(nil), nil)
			switch {
			case at < 1250*ms && len(calls) != 0:
				t.Fatalf("at %v, less than earlyEvery ticks after its request: renewed %v", at, calls)
			case at == 1250*ms && (len(calls) != 1 || calls[0].req.Want <= 22*settledGrow):
				t.Fatalf("at %v demand had tripled past its want of 22/s: got %v, want an early renewal asking for more", at, calls)
			}
		}
	})
}

// TestEngineEarlyRenewalOnGrowth: an uncontended key whose demand since its
// last request outgrows its grant asks again at once, at most every
// earlyEvery ticks, with a want that follows the new demand; demand within
// its grant waits for the schedule.
func TestEngineEarlyRenewalOnGrowth(t *testing.T) {
	share := leased(10)
	run(t, table{steps: []step{
		{at: 0, do: decide(1)},
		{at: 50 * ms, do: tick(), calls: []req{{want: coldWant(50 * ms), ttl: eUTTL}}, state: stateAsking},
		{at: 50 * ms, do: grant(10, 10, false), state: stateHeld, share: share},
		{at: 100 * ms, do: decide(1), state: stateHeld, share: share},
		{at: 200 * ms, do: tick(), state: stateHeld, share: share}, // too soon after the request
		{at: 250 * ms, do: tick(), state: stateHeld, share: share}, // 1 in 200 ms: within its grant
		{at: 260 * ms, do: decide(19), state: stateHeld, share: share},
		// 20 decisions in 250 ms since the request: 80/s > 10/s.
		{at: 300 * ms, do: tick(), calls: []req{{want: 20 / 0.25 * headroom, ttl: eUTTL, running: 10, runningFor: 4250 * ms}},
			state: stateHeld, share: share},
		{at: 300 * ms, do: grant(88, 88, false), state: stateHeld, share: leased(88)},
	}})
}

// TestEngineShrinkToldAtNextTick: a grant that shrinks by at least
// ackShrink of the rate is told to Redis at the next tick, which counts the
// old grant until then; a smaller shrink waits for the schedule.
func TestEngineShrinkToldAtNextTick(t *testing.T) {
	first := func() []step {
		return []step{
			{at: 50 * ms, do: tick(), calls: []req{{want: anyWant, ttl: eUTTL}}, state: stateAsking},
			{at: 50 * ms, do: grant(80, 80, false), state: stateHeld, share: leased(80)},
			{at: 2550 * ms, do: tick(), calls: []req{{want: anyWant, ttl: eUTTL, running: 80, runningFor: 2000 * ms}},
				state: stateHeld, share: leased(80)},
		}
	}
	t.Run("large", func(t *testing.T) {
		run(t, table{perTick: 1, steps: append(first(),
			step{at: 2550 * ms, do: grant(40, 40, true), state: stateHeld, share: leased(40)},
			step{at: 2600 * ms, do: tick(), calls: []req{{want: anyWant, ttl: eCTTL, running: 40, runningFor: 4450 * ms}},
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
}

// failingSteps: a key at 20/s granted 25/s at 50 ms (until 4550 ms) whose
// renewals fail from 2550 ms to 4550 ms, then are answered at 4600 ms.
func failingSteps() []step {
	w := func(time.Duration) float64 { return anyWant }
	return []step{
		{at: 0, do: tick()},
		{at: 50 * ms, do: tick(), calls: []req{{want: w(50 * ms), ttl: eUTTL}}, state: stateAsking},
		{at: 50 * ms, do: grant(25, 25, false), state: stateHeld, share: leased(25)},
		{at: 2550 * ms, do: tick(), calls: []req{{want: w(2550 * ms), ttl: eUTTL, running: 25, runningFor: 2000 * ms}}, state: stateHeld, share: leased(25)},
		{at: 2550 * ms, do: fail(), state: stateHeld, share: leased(25)},
		{at: 2600 * ms, do: tick(), calls: []req{{want: w(2600 * ms), ttl: eUTTL, running: 25, runningFor: 1950 * ms}}, state: stateHeld, share: leased(25)},
		{at: 2600 * ms, do: fail(), state: stateHeld, share: leased(25)},
		// The grant ends at 50 ms + 90% of 5 s: the key lapses, and asks
		// running nothing.
		{at: 4550 * ms, do: tick(), calls: []req{{want: w(4550 * ms), ttl: eUTTL}}, state: stateLapsed},
		{at: 4550 * ms, do: fail(), state: stateLapsed},
		{at: 4600 * ms, do: tick(), calls: []req{{want: w(4600 * ms), ttl: eUTTL}}, state: stateLapsed},
		{at: 4600 * ms, do: grant(25, 25, false), state: stateHeld, share: leased(25)},
	}
}

// TestEngineFailedAndLostAnswers: a request that fails, or whose answer is
// lost (the loop sees a timeout), leaves the grant in force until it ends,
// flags the key (it follows the outage policy once its grant has ended),
// and asks again at every tick, saying what it still runs; the grant lapses
// at its local end, counted once as expired, and the next answer puts a
// grant back and clears the flag.
func TestEngineFailedAndLostAnswers(t *testing.T) {
	var flagged []bool
	var expired []int
	r := run(t, table{perTick: 1, steps: failingSteps(), after: func(r *rig, i int) {
		flagged = append(flagged, r.flags["k"])
		expired = append(expired, r.expired)
	}})
	wantFlagged := []bool{false, false, false, false, true, true, true, true, true, true, false}
	for i := range wantFlagged {
		if flagged[i] != wantFlagged[i] {
			t.Errorf("after step %d the key is flagged %v; want %v (all: %v)", i, flagged[i], wantFlagged[i], flagged)
		}
	}
	if !r.recovered {
		t.Error("the grant after the failures did not report the key recovered")
	}
	// Ticks are steps 1, 3, 5, 7 and 9; the grant ends at step 7.
	for _, i := range []int{1, 3, 5, 7, 9} {
		if want := b2i(i == 7); expired[i] != want {
			t.Errorf("tick of step %d counted %d grants expired; want %d", i, expired[i], want)
		}
	}
}

// TestEngineIdleRelease: a leased key without decisions for half
// UncontendedTTL stops renewing at its next due renewal: a contended one
// releases its share for the others, an uncontended one lets its lease run
// out, at no command. It runs its default share again, and asks anew only
// for decisions made after that.
func TestEngineIdleRelease(t *testing.T) {
	for _, contended := range []bool{true, false} {
		t.Run(fmt.Sprintf("contended=%v", contended), func(t *testing.T) {
			steps := []step{
				{at: 0, do: decide(1)},
				{at: 50 * ms, do: tick(), calls: []req{{want: coldWant(50 * ms), ttl: eUTTL}}, state: stateAsking},
				{at: 50 * ms, do: grant(25, 25, contended), state: stateHeld, share: leased(25)},
				// A decision after the request, then none: not news once
				// the key is idle.
				{at: 60 * ms, do: decide(1), state: stateHeld, share: leased(25)},
			}
			var idle []req
			idleAt := 5050 * ms
			if contended {
				// A contended share that keeps moving renews every 300 ms
				// until the key has been idle for 2.5 s.
				idle, idleAt = []req{release}, 2850*ms
				until, prev := 4550*ms, 25.0
				for at := 150 * ms; at < idleAt; at += 300 * ms {
					g := 49 - prev // 24, 25, 24, ...: never settled
					steps = append(steps,
						step{at: at, do: tick(), calls: []req{{want: anyWant, ttl: eCTTL, running: prev, runningFor: until - at}}, state: stateHeld, share: leased(prev)},
						step{at: at, do: grant(g, g, true), state: stateHeld, share: leased(g)})
					until, prev = at+540*ms, g
				}
			} else {
				steps = append(steps,
					step{at: 2550 * ms, do: tick(), calls: []req{{want: anyWant, ttl: eUTTL, running: 25, runningFor: 2000 * ms}}, state: stateHeld, share: leased(25)},
					step{at: 2550 * ms, do: grant(25, 25, false), state: stateHeld, share: leased(25)})
			}
			run(t, table{steps: append(steps,
				step{at: idleAt, do: tick(), calls: idle, state: stateDefault},
				step{at: idleAt + eTick, do: tick(), state: stateDefault},
				step{at: 9000 * ms, do: tick(), state: stateDefault},
				step{at: 9000 * ms, do: decide(1), state: stateDefault},
				// Three decisions, the last 9 s after the first.
				step{at: 9050 * ms, do: tick(), calls: []req{{want: 2 / 9.0 * headroom, ttl: eUTTL}}, state: stateAsking},
			)})
		})
	}
}

// TestEngineEviction: a key the local limiter evicts is forgotten; if Redis
// may hold a lease of it, that is released; a failing key says so, for the
// limit's count of failing keys.
func TestEngineEviction(t *testing.T) {
	t.Run("leased", func(t *testing.T) {
		run(t, table{steps: []step{
			{at: 0, do: decide(1)},
			{at: 50 * ms, do: tick(), calls: []req{{want: coldWant(50 * ms), ttl: eUTTL}}, state: stateAsking},
			{at: 50 * ms, do: grant(25, 25, false), state: stateHeld, share: leased(25)},
			{at: 500 * ms, do: evictIdle(time.Second), state: stateHeld, share: leased(25)},
			{at: 1500 * ms, do: evictIdle(time.Second), calls: []req{release}, state: stateDefault},
			{at: 1550 * ms, do: tick(), state: stateDefault},
		}})
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
			{at: 0, do: decide(1)},
			{at: 50 * ms, do: tick(), calls: []req{{want: coldWant(50 * ms), ttl: eUTTL}}, state: stateAsking},
			{at: 50 * ms, do: fail(), state: stateAsking},
			{at: 2050 * ms, do: evictIdle(2 * time.Second), calls: []req{release}, state: stateDefault},
		}})
		if !r.failing {
			t.Error("a failing key was evicted without saying it was failing")
		}
	})
}

// TestEngineInstancesChange: when N changes, a settled lease renews at the
// next tick, on the contended schedule, and every request carries the new
// count; a new key's want is capped by the new default share.
func TestEngineInstancesChange(t *testing.T) {
	run(t, table{perTick: 2, steps: append(contendedSteps(),
		step{at: 1100 * ms, do: tick(), state: stateHeld, share: leased(25)}, // settled: renews at 1650 ms
		step{at: 1100 * ms, do: instances(2), state: stateHeld, share: leased(25)},
		step{at: 1150 * ms, do: tick(), calls: []req{{want: anyWant, ttl: eCTTL, running: 25, runningFor: 980 * ms, instances: 2}},
			state: stateHeld, share: leased(25)},
	)})

	for _, n := range []int{4, 2} {
		// One decision 10 ms ago says 100/s; a key is taken to want at most
		// its default share until it has more to go on.
		r := newRig(t)
		r.n = n
		r.loc.SetInstances(t0, n)
		r.loc.Allow(t0, "k")
		calls, _ := r.eng.collect(t0.Add(10*ms), r.n, r.loc.AppendStats(nil), nil)
		want := eRate / float64(n) * headroom
		if len(calls) != 1 || calls[0].req.Instances != n || math.Abs(calls[0].req.Want-want) > 1e-9 {
			t.Fatalf("a new key at N=%d asked %v; want %.4g/s", n, calls, want)
		}
	}
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
	return fmt.Sprintf("{%s want %.4g ttl %v running %v for %v release %v}",
		c.req.Key, c.req.Want, c.req.TTL, c.req.Running, c.req.RunningFor, c.lease == nil)
}
