package hybrid_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// TestGracefulLeaveRaisesShares guards onView and Close's order: an
// instance that leaves gracefully (Limiter.Close, which releases its
// records and then closes its memberlist node) is dropped from N-hat at
// once, where a crashed or cut-off one stays counted for PeakWindow.
// Three instances on real memberlist nodes each send 60% of the rate on
// one key; after 2 s one closes. With the default PeakWindow of a minute,
// the two that remain raise their local quotas (LocalShare, what FailLocal
// runs) to half the rate within a gossip round or two; from a second after
// the leave they admit the rate, since Redis counts nobody without a
// record and their contended leases grow at their next renewals (in
// version 2, which counted the departed instance at its default share,
// they admitted about two thirds of it); and no window goes above
// rate·w + burst.
func TestGracefulLeaveRaisesShares(t *testing.T) {
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
		nodes[i] = joinNode(t, fmt.Sprintf("node-%d", i), seeds...)
	}
	eventually(t, 10*time.Second, "every node sees every member", func() bool {
		for _, m := range nodes {
			if m.Count() != n {
				return false
			}
		}
		return true
	})
	inst := make([]*hybrid.Limiter, n)
	for i, m := range nodes {
		cfg := hybrid.Config{Redis: fastClient(t, srv), Members: m, Limits: []hybrid.Limit{lim}}
		fastTimings(&cfg) // PeakWindow stays the default minute
		inst[i] = newLimiter(t, cfg)
	}
	rest := inst[:n-1]
	const leaveAt, total = 2 * time.Second, 6 * time.Second
	var flows []flow
	for i := range inst {
		to := total
		if i == n-1 {
			to = leaveAt
		}
		flows = append(flows, flow{inst: i, key: "k", to: to, perSec: 0.6 * rate})
	}
	var closed time.Time
	raised := make(chan time.Duration, 1)
	r := traffic(t, inst, "api", total, flows, event{at: leaveAt, do: func() {
		closed = time.Now()
		if err := inst[n-1].Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
		go func() { // polls for the raise while the traffic runs
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				ok := true
				for _, l := range rest {
					st, err := l.Status("api")
					ok = ok && err == nil && st.LocalShare == shareOf(rate/(n-1), burst/(n-1))
				}
				if ok {
					raised <- time.Since(closed)
					return
				}
				time.Sleep(5 * time.Millisecond) // polls, under the deadline above
			}
			raised <- -1
		}()
	}})
	logRun(t, r, "k")
	switch d := <-raised; {
	case d < 0:
		for i, l := range rest {
			t.Errorf("instance %d: LocalShare %+v 3 s after one of %d left gracefully, want %+v",
				i, mustStatus(t, l, "api").LocalShare, n, shareOf(rate/(n-1), burst/(n-1)))
		}
	default:
		t.Logf("default shares at rate/%d %v after Close", n-1, d.Round(time.Millisecond))
	}
	// From a second after the leave, the two remaining send 1.2 times the
	// rate: one exact bucket would admit the rate.
	from := leaveAt + time.Second
	got := since(r.admitted["k"], from)
	want := rate * (total - from).Seconds()
	t.Logf("admitted %d from %v, exact bucket about %.0f: %.3f", got, from, want, float64(got)/want)
	if float64(got) < 0.95*want {
		t.Errorf("admitted %d from %v to %v, below 0.95 of the rate's %.0f: the departed instance still counted", got, from, total, want)
	}
	assertBound(t, r.admitted["k"], rate, burst, n, 250*time.Millisecond, time.Second)
}

// TestGracefulLeaveCountsOnlyTheLeaver: a graceful leave lowers N-hat only
// by the samples that counted the leaver. d fails (cut off, maybe still
// deciding), e joins and then leaves gracefully: N-hat stays 4, since
// a, b, c and d may all still be deciding (lowering every count of
// PeakWindow by one would have given 3). Then c leaves gracefully: N-hat is
// 3 (a, b, d).
func TestGracefulLeaveCountsOnlyTheLeaver(t *testing.T) {
	const rate, burst = 400.0, 40
	bus := membership.NewBus()
	statics := map[string]*membership.Static{}
	for _, name := range []string{"a", "b", "c", "d"} {
		statics[name] = membership.NewStatic(name, 4)
		statics[name].Connect(bus)
	}
	a := statics["a"]
	l := newLimiter(t, hybrid.Config{Members: a, Limits: []hybrid.Limit{
		{Name: "api", Rate: rate, Burst: burst, Mode: hybrid.Local, OnOutage: hybrid.FailLocal}}})
	// Views reach this watcher after the Limiter's: same goroutine, and
	// registered later.
	views := make(chan membership.View, 16)
	stop := a.WatchView(func(v membership.View) { views <- v })
	defer stop()
	await := func(what string, ok func(membership.View) bool) {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case v := <-views:
				if ok(v) {
					return
				}
			case <-timeout:
				t.Fatalf("no View with %s within 5s", what)
			}
		}
	}
	wantShare := func(step string, n int) {
		t.Helper()
		// a sorts first: rank 0, which holds a token of the burst's
		// remainder, if any.
		want := shareOf(rate/float64(n), burst/n)
		if burst%n != 0 {
			want.Burst++
		}
		if got := mustStatus(t, l, "api").LocalShare; got != want {
			t.Errorf("%s: LocalShare %+v, want %+v (N-hat %d)", step, got, want, n)
		}
	}
	wantShare("start", 4)

	statics["d"].Connect(nil) // a failure: no goodbye
	a.Set(3)
	await("count 3", func(v membership.View) bool { return v.Count == 3 })
	wantShare("d failed", 4)

	e := membership.NewStatic("e", 4)
	e.Connect(bus)
	a.Set(4)
	await("count 4 with e", func(v membership.View) bool { return v.Count == 4 && slices.Contains(v.Members, "e") })
	wantShare("e joined", 4)

	e.Leave()
	await("e left", func(v membership.View) bool { return slices.Contains(v.Left, "e") })
	wantShare("e left gracefully, d may still run", 4)

	statics["c"].Leave()
	await("c left", func(v membership.View) bool { return slices.Contains(v.Left, "c") })
	wantShare("c left gracefully", 3)
}
