package hybrid_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/faultproxy"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// The gaps of invariant 1 that version 1 of the placement left open while
// Redis is up (issue 11), one real-Redis test each: several real Limiters
// in one process, the admissions of one key counted over sliding windows
// against rate·w + burst. The fixes they were written for, and seen to
// fail without, were versions 1's and 2's; version 3 replaced them, and
// each test now checks the bound in its scenario and says what of version
// 3 holds it there. TestGapYieldsAtWork holds the bound while short bursts
// elsewhere come and go.

// fastTimings shortens the lease loop so that a test sees many renewals,
// releases and lapses within a few seconds.
func fastTimings(c *hybrid.Config) {
	c.Tick = 10 * time.Millisecond
	c.ContendedTTL = 120 * time.Millisecond
	c.UncontendedTTL = 400 * time.Millisecond
	c.RedisTimeout = 40 * time.Millisecond
}

// flow is open-loop traffic on one instance: perSec arrivals per second
// from from until to (offsets from the start of the run). With every set,
// only the first on of each period of every (from from) has arrivals:
// pulses.
type flow struct {
	inst      int
	limit     string // empty: the limit traffic is given
	key       string
	from, to  time.Duration
	perSec    float64
	every, on time.Duration
	// gate, if set, holds the flow back until it is closed: the flow then
	// starts at once, from then on (from is ignored).
	gate <-chan struct{}
}

// event is something done to the cluster at an offset of the run.
type event struct {
	at time.Duration
	do func()
}

// run is what a traffic run admitted: per key (limit/key for the flows
// that name their limit), the offsets from the start
// at which the decisions that admitted were made, sorted, and per instance
// the admissions.
type run struct {
	start    time.Time
	admitted map[string][]time.Duration
	perInst  []int
	byInst   [][]time.Duration // admissions of each instance, all keys
	errs     int
}

// perSecond is how many of the sorted times fall in each second of the run.
func perSecond(times []time.Duration) []int {
	var n []int
	for _, at := range times {
		for int(at/time.Second) >= len(n) {
			n = append(n, 0)
		}
		n[at/time.Second]++
	}
	return n
}

// logRun logs the admissions of r per second, in all and per instance.
func logRun(t *testing.T, r run, key string) {
	t.Helper()
	t.Logf("admitted per second %v", perSecond(r.admitted[key]))
	for i, v := range r.byInst {
		t.Logf("instance %d: %d, per second %v", i, r.perInst[i], perSecond(v))
	}
}

// lateAfter is how far behind its schedule a flow's arrival may be and
// still be sent (see traffic).
const lateAfter = 100 * time.Millisecond

// traffic drives flows against inst under limit for total, doing events at
// their offsets, and returns what it admitted. Each flow runs in its own
// goroutine; an admission is timed when its decision was made.
func traffic(t *testing.T, inst []*hybrid.Limiter, limit string, total time.Duration, flows []flow, events ...event) run {
	t.Helper()
	type rec struct {
		adm  []time.Duration
		errs int
	}
	recs := make([]rec, len(flows))
	start := time.Now()
	var wg sync.WaitGroup
	for i, f := range flows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			interval := time.Duration(float64(time.Second) / f.perSec)
			ctx := context.Background()
			limit := cmp.Or(f.limit, limit)
			if f.gate != nil {
				// A gate that never opens (the scenario did not happen)
				// ends the flow with the run, unsent.
				select {
				case <-f.gate:
					f.from = time.Since(start)
				case <-time.After(time.Until(start.Add(min(f.to, total)))):
					return
				}
			}
			for next := f.from; next < f.to && next < total; next += interval {
				if f.every > 0 {
					if in := (next - f.from) % f.every; in >= f.on {
						next += f.every - in - interval // the next pulse
						continue
					}
				}
				// Paces the open loop: this sleep schedules arrivals, it
				// waits for nothing.
				time.Sleep(time.Until(start.Add(next)))
				at := time.Since(start)
				if at > next+lateAfter {
					// Decisions that waited on a slow Redis put the flow
					// behind its schedule: drop what is late, as a client
					// that gave up would, rather than run past the end.
					continue
				}
				d, err := inst[f.inst].Allow(ctx, limit, f.key)
				if err != nil {
					recs[i].errs++
					continue
				}
				if d.Allowed {
					recs[i].adm = append(recs[i].adm, at)
				}
			}
		}()
	}
	for _, e := range events {
		time.Sleep(time.Until(start.Add(e.at))) // schedules the event; waits for nothing
		e.do()
	}
	wg.Wait()
	r := run{start: start, admitted: map[string][]time.Duration{}, perInst: make([]int, len(inst)), byInst: make([][]time.Duration, len(inst))}
	for i, f := range flows {
		k := f.key
		if f.limit != "" {
			k = f.limit + "/" + f.key
		}
		r.admitted[k] = append(r.admitted[k], recs[i].adm...)
		r.perInst[f.inst] += len(recs[i].adm)
		r.byInst[f.inst] = append(r.byInst[f.inst], recs[i].adm...)
		r.errs += recs[i].errs
	}
	for _, v := range r.admitted {
		slices.Sort(v)
	}
	for _, v := range r.byInst {
		slices.Sort(v)
	}
	return r
}

// worstWindow returns the most of the sorted times within any window of
// length w, and where that window starts.
func worstWindow(times []time.Duration, w time.Duration) (int, time.Duration) {
	best, at, j := 0, time.Duration(0), 0
	for i := range times {
		for times[i]-times[j] >= w {
			j++
		}
		if i-j+1 > best {
			best, at = i-j+1, times[j]
		}
	}
	return best, at
}

// assertBound checks invariant 1 on the sorted admissions of one key: at
// most rate·w + burst + extra in any window w of ws. extra is what the test
// allows beyond (every caller gives a token per instance: the rounding of
// the leases' whole-token parts of the burst). It returns the worst excess
// over rate·w + burst, in tokens, over all ws.
func assertBound(t *testing.T, adm []time.Duration, rate float64, burst int, extra float64, ws ...time.Duration) float64 {
	t.Helper()
	worst := -1e18
	for _, w := range ws {
		got, at := worstWindow(adm, w)
		bound := rate*w.Seconds() + float64(burst)
		worst = max(worst, float64(got)-bound)
		t.Logf("window %v: at most %d admitted (from %v), rate·w + burst = %.0f, allowed %.0f",
			w, got, at.Round(time.Millisecond), bound, bound+extra)
		if float64(got) > bound+extra {
			t.Errorf("%d admitted in the %v window from %v, above rate·w + burst = %.0f (+%.0f allowed)",
				got, w, at.Round(time.Millisecond), bound, extra)
		}
	}
	return worst
}

// staticCluster starts n Limiters on srv with fast timings and static
// counts of n; connect puts their counters on one bus, so that they know
// each other's names (the ranks of the local quotas) and graceful leaves.
// tune, if set, adjusts instance i's Config.
func staticCluster(t *testing.T, srv *redistest.Server, n int, connect bool, tune func(i int, c *hybrid.Config), lim ...hybrid.Limit) ([]*hybrid.Limiter, []*membership.Static) {
	t.Helper()
	bus := membership.NewBus()
	inst := make([]*hybrid.Limiter, n)
	counters := make([]*membership.Static, n)
	for i := range inst {
		counters[i] = membership.NewStatic(fmt.Sprintf("instance-%d", i), n)
		if connect {
			counters[i].Connect(bus)
		}
		cfg := hybrid.Config{Redis: fastClient(t, srv), Members: counters[i], Limits: lim}
		fastTimings(&cfg)
		if tune != nil {
			tune(i, &cfg)
		}
		inst[i] = newLimiter(t, cfg)
	}
	return inst, counters
}

// TestGapReturningIdleKeys: a key that went idle, released its lease and
// comes back at once. Two instances: a wants 85% of the rate; b sends a
// request every 200 ms, and one dense burst that makes it worth a lease of
// a small part of the rate, so that a leases nearly all the rest. Then b
// goes idle (half UncontendedTTL without decisions): it goes back to exact
// decisions and then releases its record; the moment Redis shows the
// record gone, b's demand jumps to half the rate. Version 1 let b run a
// default share at once, while a still ran the grant made against b's
// small record until its next renewal, up to a second or more later: far
// beyond rate·w + burst. In version 3 b runs nothing locally once its
// record is gone: its decisions are exact, against the key's pool, which
// holds only what a's lease leaves, and its demand (once no longer young)
// cuts a's grant at a's next renewal, not before.
func TestGapReturningIdleKeys(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	const rate, burst, n = 2000.0, 100, 2
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	// Long leases: a's uncontended lease renews 1.5 s apart; b's idle
	// lease is released 1.5 s after its last request.
	inst, _ := staticCluster(t, srv, n, false, func(_ int, c *hybrid.Config) { c.UncontendedTTL = 3 * time.Second }, lim)
	const total = 8 * time.Second
	rdb := srv.Client(t)
	released := make(chan struct{})
	var releasedAt time.Time // written before released is closed
	watched := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		// Closes released when b's record, once written, is gone.
		defer close(watched)
		had := false
		tk := time.NewTicker(2 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			there, err := rdb.HExists(context.Background(), "hybridlimit:v4:{api:k}", "i:instance-1").Result()
			switch {
			case err != nil:
			case there:
				had = true
			case had:
				releasedAt = time.Now()
				close(released)
				return
			}
		}
	}()
	r := traffic(t, inst, "api", total, []flow{
		{inst: 0, key: "k", to: total, perSec: 0.85 * rate},
		{inst: 1, key: "k", to: 3 * time.Second, perSec: 5},
		{inst: 1, key: "k", from: 2 * time.Second, to: 2*time.Second + 20*time.Millisecond, perSec: 4000},
		{inst: 1, key: "k", gate: released, to: total, perSec: rate / n},
	})
	close(stop)
	<-watched
	select {
	case <-released:
	default:
		t.Fatal("b never released its record: the scenario did not happen")
	}
	logRun(t, r, "k")
	t.Logf("b's record was gone, and its demand jumped, at %v", releasedAt.Sub(r.start).Round(time.Millisecond))
	assertBound(t, r.admitted["k"], rate, burst, n, 250*time.Millisecond, 500*time.Millisecond, time.Second)
}

// TestGapGossipPartition: a gossip partition with Redis up. Four instances
// count 4, then split into two groups of two that each count 2. Every
// instance sends 45% of the rate: within half the rate, the default share
// version 1 ran with no Redis when it trusted its group's count, so that
// the cluster admitted up to twice the rate. In version 3 a Hybrid key is
// decided exactly against its pool or on a lease Redis counts, whatever
// the instances count, and Redis keeps the cluster to the rate: the test
// checks that, and that the local quota (LocalShare, what FailLocal runs)
// stays a quarter, N-hat being the largest count of PeakWindow.
func TestGapGossipPartition(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	const rate, burst, n = 400.0, 40, 4
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	inst, counters := staticCluster(t, srv, n, true, nil, lim)
	// Each instance has counted 4 since New; now the gossip splits 2|2.
	for _, c := range counters {
		c.Set(2)
	}
	eventually(t, 5*time.Second, "every instance counts 2", func() bool {
		for _, l := range inst {
			if l.Instances() != 2 {
				return false
			}
		}
		return true
	})
	const total = 6 * time.Second
	var flows []flow
	for i := range inst {
		flows = append(flows, flow{inst: i, key: "k", to: total, perSec: 0.45 * rate})
	}
	r := traffic(t, inst, "api", total, flows)
	logRun(t, r, "k")
	for i, l := range inst {
		if st := mustStatus(t, l, "api"); st.LocalShare != shareOf(rate/n, burst/n) {
			t.Errorf("instance %d: LocalShare %+v counting 2 after 4, want a quarter %+v", i, st.LocalShare, shareOf(rate/n, burst/n))
		}
	}
	assertBound(t, r.admitted["k"], rate, burst, n, 250*time.Millisecond, time.Second, 3*time.Second)
}

// TestGapMaxInstancesBelowTheCount guards membership.Config.MaxInstances,
// which used to cap Count: three real memberlist nodes with MaxInstances 2
// counted 2, and version 1's default shares, run with no Redis, were half
// the rate instead of a third, so that three instances each sending 45%
// of the rate admitted 1.35 times it. The test checks that Count is the
// real member count (the node logs a warning instead), which sizes the
// local quotas (Local mode, FailLocal), and that the cluster stays within
// the bound: in version 3 Redis decides every Hybrid key, whatever the
// count.
func TestGapMaxInstancesBelowTheCount(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	const rate, burst, n = 300.0, 30, 3
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	nodes := make([]*membership.Memberlist, n)
	for i := range nodes {
		var seeds []string
		if i > 0 {
			seeds = []string{nodes[0].Addr()}
		}
		m, err := membership.Join(membership.Config{Name: fmt.Sprintf("node-%d", i), BindAddr: "127.0.0.1",
			Seeds: seeds, Profile: membership.Local, MaxInstances: n - 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		nodes[i] = m
	}
	eventually(t, 10*time.Second, "every node sees every member", func() bool {
		for _, m := range nodes {
			if len(m.Members()) != n {
				return false
			}
		}
		return true
	})
	inst := make([]*hybrid.Limiter, n)
	for i, m := range nodes {
		cfg := hybrid.Config{Redis: fastClient(t, srv), Members: m, Limits: []hybrid.Limit{lim}}
		fastTimings(&cfg)
		inst[i] = newLimiter(t, cfg)
	}
	for i, l := range inst {
		if got := l.Instances(); got != n {
			t.Errorf("instance %d counts %d with %d members and MaxInstances %d, want %d", i, got, n, n-1, n)
		}
	}
	const total = 5 * time.Second
	var flows []flow
	for i := range inst {
		flows = append(flows, flow{inst: i, key: "k", to: total, perSec: 0.45 * rate})
	}
	r := traffic(t, inst, "api", total, flows)
	logRun(t, r, "k")
	assertBound(t, r.admitted["k"], rate, burst, n, 250*time.Millisecond, time.Second, 3*time.Second)
}

// TestGapFlushAll guards the lost state of ask.lua: an ask that says it
// runs a grant Redis has no record of reveals the loss, and until the
// longest lease could have ended, grants and the pool together hold at
// most what instances claimed since the loss (known, in the hash's "lost"
// field; capacity in placement.lua): a grant grows only into what the
// claimers gave up. Two instances hold leases summing to the rate, a
// about 90% of it and b the rest; FLUSHALL wipes them just after a
// renewed, and b's demand jumps at once. Without the cap, b's early
// renewal finds no record of a and is granted what it wants out of a rate
// Redis thinks free, while a still runs its grant until its next renewal,
// up to a second later.
func TestGapFlushAll(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	const rate, burst, n = 1000.0, 100, 2
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	// Long uncontended leases: a's renews a second after the flush.
	inst, _ := staticCluster(t, srv, n, false, func(_ int, c *hybrid.Config) { c.UncontendedTTL = 2 * time.Second }, lim)
	const total, flushAfter = 7 * time.Second, 4 * time.Second
	rdb := srv.Client(t)
	flushed := make(chan struct{})
	flush := func() {
		// Right after a's next renewal.
		rec := func() string { return rdb.HGet(context.Background(), "hybridlimit:v4:{api:k}", "i:instance-0").Val() }
		was := rec()
		eventually(t, 3*time.Second, "a renews its lease", func() bool { return rec() != was })
		srv.FlushAll(t)
		close(flushed)
	}
	r := traffic(t, inst, "api", total, []flow{
		{inst: 0, key: "k", to: total, perSec: 0.85 * rate},
		// b's burst (from version 2, where it made b lease) adds little:
		// at 5% of the rate b is worth a lease, until the flush.
		{inst: 1, key: "k", from: 500 * time.Millisecond, to: 520 * time.Millisecond, perSec: 3000},
		{inst: 1, key: "k", to: total, perSec: 0.05 * rate},
		{inst: 1, key: "k", gate: flushed, to: total, perSec: 0.6 * rate},
	}, event{at: flushAfter, do: flush})
	logRun(t, r, "k")
	assertBound(t, r.admitted["k"], rate, burst, n, 250*time.Millisecond, 500*time.Millisecond, time.Second)
}

// TestGapSlowPipelines guards what a key does while its Redis requests fail
// and Redis still answers PING. Two instances, b at twice the rate on a
// key of a FailOpen and of a FailLocal limit, a at 5%, leasing a small
// part of the rate. Then a's link to Redis slows to 1 KB/s: its renewal
// pipelines and exact takes miss RedisTimeout, a PING does not, and a's
// demand jumps to twice the rate. Version 1 then let FailOpen admit
// everything on a, and FailLocal run a default share, half the rate, on
// top of b's grant. In version 3 a's lease runs until it ends; then its
// key is exact, and a key whose requests fail while Redis answers is
// denied (held a renewal period between tries), not its policy: only a
// degraded limit follows OnOutage. Both limits hold by that one rule, and
// Redis counts b at its lease and the pool at what the leases leave.
func TestGapSlowPipelines(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	const rate, burst, n = 1000.0, 60, 2
	srv := redistest.Start(t)
	toA := faultproxy.Start(t, srv.Addr)
	limits := []hybrid.Limit{
		{Name: "open", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailOpen},
		{Name: "local", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal},
	}
	regA := prometheus.NewRegistry()
	inst, _ := staticCluster(t, srv, n, true, func(i int, c *hybrid.Config) {
		if i == 0 {
			c.Redis, c.Registerer = fastClientTo(t, toA.Addr), regA
		}
	}, limits...)
	const total, slowAt = 6 * time.Second, 3 * time.Second
	var flows []flow
	for _, lim := range []string{"open", "local"} {
		flows = append(flows,
			flow{inst: 1, limit: lim, key: "k", to: total, perSec: 2 * rate},
			flow{inst: 0, limit: lim, key: "k", to: slowAt, perSec: 0.05 * rate},
			flow{inst: 0, limit: lim, key: "k", from: slowAt, to: total, perSec: 2 * rate})
	}
	r := traffic(t, inst, "", total, flows, event{at: slowAt, do: func() { toA.Bandwidth(t, faultproxy.Upstream, 1) }})
	if errs := counterSum(t, regA, "hybridlimit_redis_errors_total"); errs == 0 {
		t.Fatal("no lease request of a failed: the fault did not slow its pipelines")
	}
	for _, lim := range []string{"open", "local"} {
		t.Run(lim, func(t *testing.T) {
			if st := mustStatus(t, inst[0], lim); st.Degraded {
				t.Errorf("a degraded: its PING failed too, the test did not slow only its pipelines")
			}
			t.Logf("admitted per second %v", perSecond(r.admitted[lim+"/k"]))
			assertBound(t, r.admitted[lim+"/k"], rate, burst, n, 250*time.Millisecond, time.Second)
		})
	}
}

// TestGapLostFirstAnswers: answers that Redis sends too late to b, whose
// key moves between exact decisions and a lease. a wants twice the rate
// and leases what b leaves; b sends a request every 300 ms, and every
// 1.5 s a pulse of 2000 requests per second for 300 ms, during which Redis
// runs its requests but their answers come too late. The pulse makes b's
// key worth a lease, and Redis runs the ask: b's record holds a grant b
// never hears of. b runs nothing it has not heard: it goes on deciding
// exactly (its ask said it runs nothing, which is true) until a grant is
// in force, so a lost answer leaves Redis counting b above what it runs,
// never below; and a renewal says what b runs until it hears (Running),
// so a lost one never lets Redis count b at a smaller grant while it runs
// the larger.
func TestGapLostFirstAnswers(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	const rate, burst, n = 1000.0, 40, 2
	srv := redistest.Start(t)
	toB := faultproxy.Start(t, srv.Addr)
	lim := hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	regB := prometheus.NewRegistry()
	inst, _ := staticCluster(t, srv, n, false, func(i int, c *hybrid.Config) {
		if i == 1 {
			c.Redis, c.Registerer = fastClientTo(t, toB.Addr), regB
		}
	}, lim)
	const total, every = 8 * time.Second, 1500 * time.Millisecond
	var events []event
	for at := every; at < total; at += every {
		events = append(events,
			// Beyond the client's 200 ms read timeout: go-redis waits for
			// that, not for RedisTimeout, unless the client enables
			// ContextTimeoutEnabled.
			event{at: at - 5*time.Millisecond, do: func() { toB.Latency(t, faultproxy.Downstream, 300*time.Millisecond) }},
			event{at: at + 600*time.Millisecond, do: func() { toB.Clear(t) }})
	}
	r := traffic(t, inst, "api", total, []flow{
		{inst: 0, key: "k", to: total, perSec: 2 * rate},
		{inst: 1, key: "k", to: total, perSec: 1000.0 / 300},
		{inst: 1, key: "k", from: every, to: total, perSec: 2000, every: every, on: 300 * time.Millisecond},
	}, events...)
	logRun(t, r, "k")
	if errs := counterSum(t, regB, "hybridlimit_redis_errors_total"); errs == 0 {
		t.Fatal("no lease request of b failed: its answers were not lost")
	}
	assertBound(t, r.admitted["k"], rate, burst, n, 100*time.Millisecond, 250*time.Millisecond, time.Second)
}

// TestGapYieldsAtWork is invariant 1 while short bursts elsewhere come and
// go (version 2's yields, which version 3 does not have): instance 0 wants
// twice the rate of a key all along, and the three others send it a short
// burst now and then. Their bursts are decided exactly against the key's
// pool, which holds what instance 0's lease leaves; a burst shorter than a
// contended renewal is young demand, which takes only what is free and
// does not cut instance 0's lease. The cluster admits within rate·w +
// burst over every window, and instance 0 gets at least 60% of the rate
// over the second half of the run (a floor against regressions, see below;
// version 1 gave it well under half).
func TestGapYieldsAtWork(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	const rate, burst, n = 400.0, 40, 4
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	inst, _ := staticCluster(t, srv, n, true, nil, lim)
	const total = 9 * time.Second
	flows := []flow{{inst: 0, key: "k", to: total, perSec: 2 * rate}}
	for i := 1; i < n; i++ {
		// 10 requests in 10 ms every 2.7 s to 3.3 s ("every few
		// seconds"), from a different start on each instance.
		flows = append(flows, flow{inst: i, key: "k", from: time.Duration(i) * 700 * time.Millisecond, to: total,
			perSec: 1000, every: 2400*time.Millisecond + time.Duration(i)*300*time.Millisecond, on: 10 * time.Millisecond})
	}
	r := traffic(t, inst, "api", total, flows)
	logRun(t, r, "k")
	assertBound(t, r.admitted["k"], rate, burst, n, 100*time.Millisecond, 250*time.Millisecond, time.Second)
	half := total / 2
	got := float64(since(r.byInst[0], half)) / half.Seconds()
	t.Logf("instance 0 admitted %.0f/s over the second half, %.0f%% of the rate", got, 100*got/rate)
	if got < 0.6*rate {
		// Utilisation while the peers' bursts come and go: a floor
		// against regressions, not invariant 2. (Version 2 measured 74-83%
		// here on two busy cores, and 25% while a bug of its yields
		// froze every grant as lost state; version 3 is not measured in
		// this comment. An ask says it runs a grant only while one is in
		// force, so an exact key's ask never reads as a loss.)
		t.Errorf("instance 0 admitted %.0f/s over the second half, below 60%% of the rate (%.0f/s)", got, 0.6*rate)
	}
}
