package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// records is a slog.Handler that keeps every record, for tests that read
// what was logged.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }

func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

// logged returns the attributes, as text, of every record whose message
// contains msg.
func (r *records) logged(msg string) []map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]string
	for _, rec := range r.recs {
		if !strings.Contains(rec.Message, msg) {
			continue
		}
		attrs := map[string]string{}
		rec.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.String()
			return true
		})
		out = append(out, attrs)
	}
	return out
}

// TestSetLimitsChecksFirst: SetLimits checks the whole set before it
// changes anything, as New does, and refuses after Close.
func TestSetLimitsChecksFirst(t *testing.T) {
	a := hybrid.Limit{Name: "a", Rate: 1, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailOpen}
	l := newLimiter(t, hybrid.Config{Limits: []hybrid.Limit{a}})
	bad := func(f func(*hybrid.Limit)) hybrid.Limit {
		b := hybrid.Limit{Name: "b", Rate: 1, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailOpen}
		f(&b)
		return b
	}
	for _, tc := range []struct {
		name   string
		limits []hybrid.Limit
		want   string
	}{
		{"none", nil, "no limits"},
		{"bad rate", []hybrid.Limit{a, bad(func(b *hybrid.Limit) { b.Rate = -1 })}, `limit "b": Rate -1`},
		{"bad burst", []hybrid.Limit{bad(func(b *hybrid.Limit) { b.Burst = 0 })}, `limit "b": Burst 0`},
		{"unset policy", []hybrid.Limit{bad(func(b *hybrid.Limit) { b.OnOutage = hybrid.PolicyUnset })}, "OnOutage is unset"},
		{"defined twice", []hybrid.Limit{a, a}, `limit "a" is defined twice`},
		{"Redis needed", []hybrid.Limit{a, bad(func(b *hybrid.Limit) { b.Mode = hybrid.Hybrid })}, "Redis is nil"},
		{"bad name", []hybrid.Limit{bad(func(b *hybrid.Limit) { b.Name = "a:b" })}, `"a:b" must be valid UTF-8`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := l.SetLimits(tc.limits)
			if !errors.Is(err, hybrid.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("SetLimits: %v; want ErrConfig saying %q", err, tc.want)
			}
			if got := l.Limits(); !slices.Equal(got, []hybrid.Limit{a}) {
				t.Errorf("a refused SetLimits changed the limits to %+v", got)
			}
		})
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := l.SetLimits([]hybrid.Limit{a}); !errors.Is(err, hybrid.ErrClosed) {
		t.Errorf("SetLimits after Close: %v, want ErrClosed", err)
	}
}

// TestSetLimitsLocal adds, changes and removes Local limits at runtime: a
// changed limit decides at its new burst and rate at once, a key keeps its
// tokens across the change, a removed limit is unknown, and one line is
// logged per change. The rates are so low that no token comes back within
// the test, so that its outcomes do not depend on the clock.
func TestSetLimitsLocal(t *testing.T) {
	var logs records
	a := hybrid.Limit{Name: "a", Rate: hybrid.PerDay(1), Burst: 2, Mode: hybrid.Local, OnOutage: hybrid.FailOpen}
	l := newLimiter(t, hybrid.Config{Limits: []hybrid.Limit{a}, Logger: slog.New(&logs)})
	ctx := context.Background()
	decide := func(limit string, want bool) {
		t.Helper()
		d, err := l.Allow(ctx, limit, "k")
		if err != nil || d.Allowed != want {
			t.Fatalf("Allow(%s) = %+v, %v; want allowed %v", limit, d, err, want)
		}
	}
	decide("a", true)
	decide("a", true)
	decide("a", false)

	// A higher burst, and a new limit: the key of a has spent its tokens
	// and keeps having none.
	a.Burst = 4
	b := hybrid.Limit{Name: "b", Rate: hybrid.PerDay(1), Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailClosed}
	if err := l.SetLimits([]hybrid.Limit{a, b}); err != nil {
		t.Fatal(err)
	}
	decide("a", false)
	decide("b", true)
	decide("b", false)
	if st := mustStatus(t, l, "a"); st.Burst != 4 || st.LocalShare.Burst != 4 || st.Keys != 1 {
		t.Errorf("Status(a) after the change: %+v; want burst 4, local share burst 4, its 1 key kept", st)
	}
	if got := logs.logged("limits changed"); len(got) != 1 || got[0]["added"] != "[b]" || got[0]["changed"] != "[a]" {
		t.Errorf("logged %v; want one line with b added and a changed", got)
	}

	// A much higher rate: a's key refills within microseconds.
	a.Rate = 1e9
	if err := l.SetLimits([]hybrid.Limit{a, b}); err != nil {
		t.Fatal(err)
	}
	decide("a", true)

	// The same limits again change nothing and log nothing.
	if err := l.SetLimits([]hybrid.Limit{a, b}); err != nil {
		t.Fatal(err)
	}
	if got := logs.logged("limits changed"); len(got) != 2 {
		t.Errorf("%d lines logged after an unchanged SetLimits, want 2", len(got))
	}

	// Removed: unknown from now on, for every call.
	if err := l.SetLimits([]hybrid.Limit{b}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx, "a", "k"); !errors.Is(err, hybrid.ErrUnknownLimit) {
		t.Errorf("Allow on a removed limit: %v, want ErrUnknownLimit", err)
	}
	if _, err := l.Status("a"); !errors.Is(err, hybrid.ErrUnknownLimit) {
		t.Errorf("Status of a removed limit: %v, want ErrUnknownLimit", err)
	}
	if _, err := l.Quota("a"); !errors.Is(err, hybrid.ErrUnknownLimit) {
		t.Errorf("Quota of a removed limit: %v, want ErrUnknownLimit", err)
	}
	if err := l.Wait(ctx, "a", "k", 1); !errors.Is(err, hybrid.ErrUnknownLimit) {
		t.Errorf("Wait on a removed limit: %v, want ErrUnknownLimit", err)
	}
	if got := l.Limits(); !slices.Equal(got, []hybrid.Limit{b}) {
		t.Errorf("Limits() = %+v, want only b", got)
	}
	decide("b", false)
}

func sum(m map[string]float64) float64 {
	s := 0.0
	for _, v := range m {
		s += v
	}
	return s
}

// offer sends decisions on (limit, key) from one goroutine per instance,
// about one per millisecond each, until stopped, and counts the admitted
// ones.
type offer struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	admitted atomic.Int64
	errs     atomic.Int64
}

func startOffer(t *testing.T, inst []*hybrid.Limiter, limit, key string) *offer {
	t.Helper()
	o := &offer{stop: make(chan struct{})}
	for _, l := range inst {
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			for {
				select {
				case <-o.stop:
					return
				default:
				}
				d, err := l.Allow(context.Background(), limit, key)
				switch {
				case err != nil:
					o.errs.Add(1)
				case d.Allowed:
					o.admitted.Add(1)
				}
				// Paces the offered load; waits for nothing.
				time.Sleep(time.Millisecond)
			}
		}()
	}
	t.Cleanup(o.halt)
	return o
}

func (o *offer) halt() {
	select {
	case <-o.stop:
	default:
		close(o.stop)
	}
	o.wg.Wait()
}

// admittedOver counts the admissions of o over about d, and returns them
// with the window's exact length.
func (o *offer) admittedOver(d time.Duration) (int64, time.Duration) {
	start, before := time.Now(), o.admitted.Load()
	time.Sleep(d) // the measured window, not a synchronisation
	return o.admitted.Load() - before, time.Since(start)
}

// TestSetLimitsLeasesFollowTheRate: two instances share a contended key
// of a Hybrid limit; when both are given a higher and then a lower rate,
// the grants in Redis follow within a renewal or so, and the cluster
// admits at the new rate.
func TestSetLimitsLeasesFollowTheRate(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	api := hybrid.Limit{Name: "api", Rate: 200, Burst: 20, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	inst := cluster(t, srv, 2, func(c *hybrid.Config) { c.UncontendedTTL = 2 * time.Second }, api)
	// About 1000 decisions a second on each instance, well above each rate.
	o := startOffer(t, inst, "api", "k")

	follows := func(rate float64) {
		t.Helper()
		start := time.Now()
		var grants map[string]float64
		eventually(t, 3*time.Second, fmt.Sprintf("both instances hold grants summing to about %v in Redis", rate), func() bool {
			grants = leasesOf(t, rdb, "api", "k")
			s := sum(grants)
			return len(grants) == 2 && s <= rate*1.0001 && s >= 0.9*rate
		})
		t.Logf("rate %v: grants %v in Redis %v after the rate was set", rate, grants, time.Since(start).Round(time.Millisecond))
		// Each instance's local share follows its grant.
		for i, l := range inst {
			if st := mustStatus(t, l, "api"); st.Rate != rate || st.LeasedRate > rate*1.0001 {
				t.Errorf("instance %d: Status %+v; want Rate %v and at most that leased", i, st, rate)
			}
		}
		got, w := o.admittedOver(time.Second)
		lo, hi := 0.8*rate*w.Seconds(), rate*w.Seconds()+float64(api.Burst)+0.05*rate
		t.Logf("rate %v: admitted %d in %v, want %.0f to %.0f", rate, got, w.Round(time.Millisecond), lo, hi)
		if float64(got) < lo || float64(got) > hi {
			t.Errorf("rate %v: admitted %d in %v, want %.0f to %.0f", rate, got, w.Round(time.Millisecond), lo, hi)
		}
	}
	follows(200)
	for _, rate := range []float64{600, 100} {
		api.Rate = rate
		for _, l := range inst {
			if err := l.SetLimits([]hybrid.Limit{api}); err != nil {
				t.Fatal(err)
			}
		}
		follows(rate)
	}
	o.halt()
	if n := o.errs.Load(); n != 0 {
		t.Errorf("%d decisions returned errors", n)
	}
}

// TestSetLimitsRemoveReleasesLeases: a removed Hybrid limit is unknown at
// once, releases its leases at the next tick (well before they would
// expire), and its metrics series are gone; added again, it starts afresh.
func TestSetLimitsRemoveReleasesLeases(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	reg := prometheus.NewPedanticRegistry()
	gone := hybrid.Limit{Name: "gone", Rate: 1000, Burst: 100, Mode: hybrid.Hybrid, OnOutage: hybrid.FailOpen}
	stay := hybrid.Limit{Name: "stay", Rate: 10, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailOpen}
	l := newLimiter(t, hybrid.Config{Redis: rdb, Members: membership.NewStatic("me", 1), Registerer: reg,
		Limits: []hybrid.Limit{gone, stay}})
	ks := keys(10)
	ctx := context.Background()
	// warmKey makes each key worth a lease: its first decisions are
	// exact, and the next tick asks for one.
	eventually(t, 5*time.Second, "a lease on every key", func() bool {
		for _, k := range ks {
			warmKey(t, l, "gone", k, gone.Burst)
		}
		return countTrue(leaseHolders(t, rdb, "gone", "me", ks)) == len(ks)
	})

	removed := time.Now()
	if err := l.SetLimits([]hybrid.Limit{stay}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx, "gone", ks[0]); !errors.Is(err, hybrid.ErrUnknownLimit) {
		t.Errorf("Allow right after removal: %v, want ErrUnknownLimit", err)
	}
	// Uncontended leases last 5s: gone within a second means released.
	eventually(t, time.Second, "every lease released", func() bool {
		return countTrue(leaseHolders(t, rdb, "gone", "me", ks)) == 0
	})
	t.Logf("leases released %v after the removal", time.Since(removed).Round(time.Millisecond))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "limit" && lp.GetValue() == "gone" {
					t.Errorf("metric %s still has a series for the removed limit", mf.GetName())
				}
			}
		}
	}

	if err := l.SetLimits([]hybrid.Limit{stay, gone}); err != nil {
		t.Fatal(err)
	}
	if st := mustStatus(t, l, "gone"); st.Keys != 0 || st.RedisCommands != 0 {
		t.Errorf("re-added limit: %+v; want no keys and no commands yet", st)
	}
	eventually(t, 5*time.Second, "a lease again", func() bool {
		return warmKey(t, l, "gone", ks[0], gone.Burst).Source == hybrid.SourceLease
	})
	if n := counterSum(t, reg, "hybridlimit_leases_granted_total"); n < 1 {
		t.Errorf("leases granted to the re-added limit: %v, want some", n)
	}
}

// TestSetLimitsModeChanges moves one limit through every mode: it decides
// in its new mode at once, gives its leases back when it stops being
// Hybrid, and takes leases again when it becomes Hybrid.
func TestSetLimitsModeChanges(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	lim := hybrid.Limit{Name: "api", Rate: 1000, Burst: 100, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed}
	l := newLimiter(t, hybrid.Config{Redis: rdb, Members: membership.NewStatic("me", 1), Limits: []hybrid.Limit{lim}})
	ctx := context.Background()
	ks := keys(5)
	leased := func() int { return countTrue(leaseHolders(t, rdb, "api", "me", ks)) }
	decide := func() hybrid.Decision {
		t.Helper()
		var d hybrid.Decision
		for _, k := range ks {
			var err error
			if d, err = l.Allow(ctx, "api", k); err != nil || !d.Allowed {
				t.Fatalf("Allow: %+v, %v", d, err)
			}
		}
		return d
	}
	toLeases := func() {
		t.Helper()
		// warmKey makes each key worth a lease (its first decisions are
		// exact, and the next tick asks for one); then its bucket
		// refills, for decide.
		eventually(t, 5*time.Second, "leases on every key", func() bool {
			src := hybrid.SourceLease
			for _, k := range ks {
				if d := warmKey(t, l, "api", k, lim.Burst); d.Source != hybrid.SourceLease {
					src = d.Source
				}
			}
			return src == hybrid.SourceLease && leased() == len(ks)
		})
		eventually(t, time.Second, "the keys' buckets refilled", func() bool {
			for _, k := range ks {
				if d, err := l.AllowN(ctx, "api", k, lim.Burst/2); err != nil || !d.Allowed {
					return false
				}
			}
			return true
		})
	}
	set := func(m hybrid.Mode) {
		t.Helper()
		lim.Mode = m
		if err := l.SetLimits([]hybrid.Limit{lim}); err != nil {
			t.Fatal(err)
		}
	}
	toLeases()
	for _, tc := range []struct {
		mode hybrid.Mode
		src  hybrid.Source
	}{{hybrid.Global, hybrid.SourceGlobal}, {hybrid.Local, hybrid.SourceLocal}} {
		set(tc.mode)
		if d := decide(); d.Source != tc.src {
			t.Errorf("%v: first decision from %v, want %v", tc.mode, d.Source, tc.src)
		}
		eventually(t, time.Second, fmt.Sprintf("%v: every lease released", tc.mode), func() bool { return leased() == 0 })
		if st := mustStatus(t, l, "api"); st.Mode != tc.mode || st.LeasedRate != 0 || st.Degraded {
			t.Errorf("%v: Status %+v; want the mode, no leased rate, not degraded", tc.mode, st)
		}
		set(hybrid.Hybrid)
		toLeases()
	}
}

// TestSetLimitsUnderLoad changes the limits of two instances over and
// over (rates, modes, shadow mode, a limit removed and added back) while
// decisions run on every limit: run with -race, nothing races, no decision
// fails but those on the limit while it is removed, and Close releases
// every lease of the last set.
func TestSetLimitsUnderLoad(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	base := []hybrid.Limit{
		{Name: "a", Rate: 500, Burst: 50, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal},
		{Name: "b", Rate: 100, Burst: 10, Mode: hybrid.Global, OnOutage: hybrid.FailOpen},
		{Name: "c", Rate: 50, Burst: 5, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed},
	}
	inst := cluster(t, srv, 2, nil, base...)
	names := []string{"a", "b", "c"}
	ks := keys(8)
	var stop atomic.Bool
	var unknown, failed atomic.Int64
	var wg sync.WaitGroup
	for _, l := range inst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				limit := names[i%len(names)]
				_, err := l.Allow(context.Background(), limit, ks[(i/len(names))%len(ks)])
				switch {
				case err == nil:
				case errors.Is(err, hybrid.ErrUnknownLimit) && limit == "c":
					unknown.Add(1)
				default:
					failed.Add(1)
					t.Errorf("Allow(%s): %v", limit, err)
				}
				if i%16 == 0 {
					time.Sleep(100 * time.Microsecond) // pacing, not a synchronisation
				}
			}
		}()
	}
	modes := []hybrid.Mode{hybrid.Hybrid, hybrid.Global, hybrid.Local}
	var last []hybrid.Limit
	for round := range 60 {
		ls := slices.Clone(base)
		ls[0].Rate = float64(200 + 100*(round%5))
		ls[0].Shadow = round%3 == 0
		ls[1].Mode = modes[round%3]
		if round%4 == 3 {
			ls = ls[:2] // c removed this round
		}
		for _, l := range inst {
			if err := l.SetLimits(ls); err != nil {
				t.Fatal(err)
			}
		}
		last = ls
		time.Sleep(20 * time.Millisecond) // lets ticks run between changes; waits for nothing
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d decisions on c found it removed", unknown.Load())
	for i, l := range inst {
		if got := l.Limits(); !slices.Equal(got, last) {
			t.Errorf("instance %d: Limits() = %+v, want %+v", i, got, last)
		}
	}
	// Every limit Hybrid, and a lease on each key: Close gives them all back.
	for i := range last {
		last[i].Mode = hybrid.Hybrid
	}
	for _, l := range inst {
		if err := l.SetLimits(last); err != nil {
			t.Fatal(err)
		}
	}
	for i, l := range inst {
		eventually(t, 5*time.Second, "leases on a's keys", func() bool {
			for _, k := range ks {
				if _, err := l.Allow(context.Background(), "a", k); err != nil {
					t.Fatal(err)
				}
			}
			return countTrue(leaseHolders(t, rdb, "a", fmt.Sprintf("instance-%d", i), ks)) == len(ks)
		})
	}
	for i, l := range inst {
		if err := l.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := countTrue(leaseHolders(t, rdb, "a", fmt.Sprintf("instance-%d", i), ks)); n != 0 {
			t.Errorf("instance %d: %d leases left after Close", i, n)
		}
	}
}
