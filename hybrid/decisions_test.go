package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// series names one child of hybridlimit_decisions_total.
type series struct{ limit, outcome, source string }

// tally counts decisions by series, as the caller saw them.
type tally struct {
	mu sync.Mutex
	n  map[series]float64 // guarded by mu
}

func (ta *tally) add(limit string, d hybrid.Decision, err error) {
	outcome := "allowed"
	switch {
	case errors.Is(err, hybrid.ErrExceedsBurst):
		outcome = "exceeds_burst"
	case !d.Allowed:
		outcome = "denied"
	}
	ta.mu.Lock()
	ta.n[series{limit, outcome, d.Source.String()}]++
	ta.mu.Unlock()
}

// decisionSeries returns every child of hybridlimit_decisions_total in reg.
func decisionSeries(t *testing.T, reg *prometheus.Registry) map[series]float64 {
	t.Helper()
	got := make(map[series]float64)
	for _, m := range metricsNamed(t, reg, "hybridlimit_decisions_total") {
		var s series
		for _, lp := range m.GetLabel() {
			switch lp.GetName() {
			case "limit":
				s.limit = lp.GetValue()
			case "outcome":
				s.outcome = lp.GetValue()
			case "source":
				s.source = lp.GetValue()
			}
		}
		got[s] = m.GetCounter().GetValue()
	}
	return got
}

// TestDecisionsCountedExactly: hybridlimit_decisions_total counts every
// decision exactly once, by limit, outcome and source, whatever decided it:
// in process (local and lease, counted in the local limiter's shards and
// summed when gathered), in Redis (global, exact keys), by an outage
// policy, or a request above the burst; with decisions from many
// goroutines while SetLimits changes rates and modes under them (a Hybrid
// limit turned Local while its keys still hold leases), and through an
// outage. No series ever goes down between two gathers.
func TestDecisionsCountedExactly(t *testing.T) {
	srv := redistest.Start(t)
	reg := prometheus.NewPedanticRegistry()
	limits := []hybrid.Limit{
		{Name: "h", Rate: 200, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailOpen},
		{Name: "l", Rate: 200, Burst: 10, Mode: hybrid.Local, OnOutage: hybrid.FailClosed},
		{Name: "g", Rate: 200, Burst: 10, Mode: hybrid.Global, OnOutage: hybrid.FailLocal},
		{Name: "x", Rate: 200, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed},
	}
	l := newLimiter(t, hybrid.Config{
		Redis: fastClient(t, srv), Registerer: reg,
		Members: membership.NewStatic("instance-0", 2), Limits: limits,
	})
	want := &tally{n: make(map[series]float64)}
	last := make(map[series]float64)
	check := func(phase string) {
		t.Helper()
		got := decisionSeries(t, reg)
		want.mu.Lock()
		defer want.mu.Unlock()
		for s, n := range got {
			if n != want.n[s] {
				t.Errorf("%s: %v counted %v, decided %v", phase, s, n, want.n[s])
			}
			if n < last[s] {
				t.Errorf("%s: %v went down from %v to %v", phase, s, last[s], n)
			}
			last[s] = n
		}
		for s, n := range want.n {
			if _, ok := got[s]; !ok {
				t.Errorf("%s: %v decided %v times, no such series", phase, s, n)
			}
		}
	}
	ctx := context.Background()
	// decide decides on 8 keys of every limit (named prefix-0 to
	// prefix-7) from 4 goroutines, rounds times each, some requests above
	// the burst, while during runs.
	prefix := "key"
	decide := func(rounds int, during func()) {
		t.Helper()
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := range rounds {
					for _, lim := range []string{"h", "l", "g", "x"} {
						n := 1
						if i%50 == 49 {
							n = 11 // above the burst
						}
						d, err := l.AllowN(ctx, lim, fmt.Sprintf("%s-%d", prefix, (w+i)%8), n)
						if err != nil && !errors.Is(err, hybrid.ErrExceedsBurst) {
							t.Error(err)
							return
						}
						want.add(lim, d, err)
					}
				}
			})
		}
		if during != nil {
			during()
		}
		wg.Wait()
	}
	set := func(change func(lim *hybrid.Limit)) {
		t.Helper()
		next := make([]hybrid.Limit, len(limits))
		copy(next, limits)
		for i := range next {
			change(&next[i])
		}
		if err := l.SetLimits(next); err != nil {
			t.Fatal(err)
		}
		limits = next
	}
	leased := func() bool {
		want.mu.Lock()
		defer want.mu.Unlock()
		return want.n[series{"h", "allowed", "lease"}] > 0
	}

	eventually(t, 10*time.Second, "keys of h deciding on leases", func() bool {
		decide(50, nil)
		return leased()
	})
	check("start")

	decide(200, func() {
		set(func(lim *hybrid.Limit) { lim.Rate = 300 })
		set(func(lim *hybrid.Limit) {
			if lim.Name == "l" {
				lim.Mode = hybrid.Hybrid
			}
		})
	})
	check("rates and modes changed during the decisions")

	// h turns Local while its keys hold leases: the loop releases them at
	// its next tick, and the decisions meanwhile are local ones.
	decide(100, func() {
		set(func(lim *hybrid.Limit) {
			if lim.Name == "h" {
				lim.Mode = hybrid.Local
			}
		})
	})
	check("h turned Local")

	set(func(lim *hybrid.Limit) {
		if lim.Name == "h" {
			lim.Mode = hybrid.Hybrid
		}
	})
	eventually(t, 10*time.Second, "h's keys back on leases", func() bool {
		want.mu.Lock()
		before := want.n[series{"h", "allowed", "lease"}]
		want.mu.Unlock()
		decide(50, nil)
		want.mu.Lock()
		defer want.mu.Unlock()
		return want.n[series{"h", "allowed", "lease"}] > before
	})
	check("h Hybrid again")

	srv.Kill(t)
	eventually(t, 10*time.Second, "every limit on Redis degraded", func() bool {
		decide(10, nil)
		for _, name := range []string{"h", "g", "x"} {
			if !mustStatus(t, l, name).Degraded {
				return false
			}
		}
		return true
	})
	decide(100, nil)
	prefix = "fresh" // keys without a lease: h's policy decides them
	decide(100, nil)
	check("outage")
	for _, s := range []series{{"h", "allowed", "fail_open"}, {"g", "allowed", "local"}, {"x", "denied", "fail_closed"}, {"x", "allowed", "exact"}, {"h", "denied", "lease"}} {
		if want.n[s] == 0 {
			t.Errorf("no decision of %v: the test did not cover it", s)
		}
	}
}

// TestDecisionsInProcessDoNotAllocate: with metrics registered, a decision
// made in process (a Local limit, a Hybrid key on a lease) on an existing
// key allocates nothing, counting included.
func TestDecisionsInProcessDoNotAllocate(t *testing.T) {
	srv := redistest.Start(t)
	l := newLimiter(t, hybrid.Config{
		Redis: fastClient(t, srv), Registerer: prometheus.NewPedanticRegistry(),
		Members: membership.NewStatic("instance-0", 1),
		Limits: []hybrid.Limit{
			{Name: "l", Rate: 1e9, Burst: 1e6, Mode: hybrid.Local, OnOutage: hybrid.FailOpen},
			{Name: "h", Rate: 1e9, Burst: 1e6, Mode: hybrid.Hybrid, OnOutage: hybrid.FailOpen},
		},
	})
	ctx := context.Background()
	for _, limit := range []string{"l", "h"} {
		want := map[string]hybrid.Source{"l": hybrid.SourceLocal, "h": hybrid.SourceLease}[limit]
		eventually(t, 5*time.Second, "the key decided in process", func() bool {
			return warmKey(t, l, limit, "key", 10).Source == want
		})
		var d hybrid.Decision
		allocs := testing.AllocsPerRun(10_000, func() { d, _ = l.Allow(ctx, limit, "key") })
		if allocs != 0 || !d.Allowed || d.Source != want {
			t.Errorf("limit %s: %v allocations per decision, last %+v; want 0, allowed by %v", limit, allocs, d, want)
		}
	}
}

// TestDecisionsCountedAcrossModeChanges: a Hybrid limit turned Local
// decides at once by its local quota, and turned Hybrid again decides its
// keys exactly at once, before the loop's next tick: no key of a Hybrid
// limit ever decides locally without a grant Redis counts. Every decision
// is counted once, under the source that made it.
func TestDecisionsCountedAcrossModeChanges(t *testing.T) {
	srv := redistest.Start(t)
	reg := prometheus.NewRegistry()
	lim := hybrid.Limit{Name: "x", Rate: 100, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	l := newLimiter(t, hybrid.Config{
		Redis: srv.Client(t), Members: membership.NewStatic("i", 1), Limits: []hybrid.Limit{lim},
		Registerer: reg, // no tick during the test:
		Tick:       time.Minute, ContendedTTL: 3 * time.Minute, UncontendedTTL: 5 * time.Minute,
	})
	ctx := context.Background()
	ta := &tally{n: make(map[series]float64)}
	decide := func(step, key string, src hybrid.Source) {
		t.Helper()
		d, err := l.Allow(ctx, "x", key)
		if err != nil || !d.Allowed || d.Source != src {
			t.Errorf("%s: %+v, %v; want allowed by %v", step, d, err, src)
		}
		ta.add("x", d, err)
	}
	decide("first decision", "old", hybrid.SourceExact)
	lim.Mode = hybrid.Local
	if err := l.SetLimits([]hybrid.Limit{lim}); err != nil {
		t.Fatal(err)
	}
	decide("after the change to Local", "old", hybrid.SourceLocal)
	decide("a new key after the change to Local", "new", hybrid.SourceLocal)
	lim.Mode = hybrid.Hybrid
	if err := l.SetLimits([]hybrid.Limit{lim}); err != nil {
		t.Fatal(err)
	}
	before := srv.Client(t).HLen(ctx, "hybridlimit:v4:{x:new}").Val()
	decide("a key the Local limit decided, Hybrid again", "new", hybrid.SourceExact)
	if after := srv.Client(t).HLen(ctx, "hybridlimit:v4:{x:new}").Val(); before != 0 || after == 0 {
		t.Errorf("records of the key in Redis: %d before its exact decision, %d after; want 0, then some", before, after)
	}
	got := decisionSeries(t, reg)
	for s, n := range ta.n {
		if got[s] != n {
			t.Errorf("%v: counted %v, decided %v", s, got[s], n)
		}
	}
}
