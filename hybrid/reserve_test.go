package hybrid_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// drain takes single tokens of key until one is denied, and returns how
// many were admitted and the source of the denial.
func drain(t *testing.T, l *hybrid.Limiter, limit, key string) (int, hybrid.Source) {
	t.Helper()
	for n := 0; ; n++ {
		d, err := l.Allow(context.Background(), limit, key)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			return n, d.Source
		}
		if n > 1e6 {
			t.Fatal("no denial in a million requests")
		}
	}
}

// Cancel gives a reservation's tokens back to the bucket they came from, in
// every mode and placement: after the bucket is drained, a canceled
// reservation of 5 makes room for 5 more, once; a second Cancel gives
// nothing. Three instances on one Redis, burst 30, a rate so slow that
// nothing refills during the test.
func TestReserveCancel(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	const burst, n = 30, 5
	for _, tc := range []struct {
		mode   hybrid.Mode
		source hybrid.Source
	}{
		{hybrid.Local, hybrid.SourceLocal},
		{hybrid.Global, hybrid.SourceGlobal},
		{hybrid.Hybrid, hybrid.SourceExact},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			inst := cluster(t, srv, 3, nil, hybrid.Limit{Name: "api", Rate: hybrid.PerHour(1), Burst: burst, Mode: tc.mode, OnOutage: hybrid.FailClosed})
			r, err := inst[0].Reserve(ctx, "api", "k", n)
			if err != nil || !r.Allowed || r.Source != tc.source {
				t.Fatalf("Reserve(%d) = %+v, %v; want admitted by %v", n, r, err, tc.source)
			}
			// Drained from another instance: in Global and Hybrid mode the
			// cluster's bucket is one. Local mode: this instance's share of
			// the burst. Hybrid: the instance that reserved, which a
			// refund frees from the turn its denials wait for.
			other := inst[1]
			if tc.mode != hybrid.Global {
				other = inst[0]
			}
			before, _ := drain(t, other, "api", "k")
			if err := r.Cancel(ctx); err != nil {
				t.Fatal(err)
			}
			// The refund is the 5 tokens less the refill since the
			// reservation, a hair at this rate: 4 whole ones and most
			// of the fifth, which the bucket's own fraction may
			// complete.
			after, src := drain(t, other, "api", "k")
			if after < n-1 || after > n || src != tc.source {
				t.Errorf("admitted %d after the cancel (denied by %v), want the %d given back (by %v)", after, src, n, tc.source)
			}
			if err := r.Cancel(ctx); err != nil {
				t.Fatal(err)
			}
			if again, _ := drain(t, other, "api", "k"); again > 1 {
				t.Errorf("a second Cancel gave back %d tokens, want none (a fraction left by the first may make one)", again)
			}
			if tc.mode == hybrid.Global && n+before != burst {
				t.Errorf("admitted %d before the refund, want the burst %d", n+before, burst)
			}
		})
	}
}

// A refund never lifts a bucket above where it would be had the request
// never come: the whole burst reserved, the bucket full again, drained,
// and then the reservation canceled. Giving the burst back now would
// admit a second burst at once; the refund is the burst less the refill
// since, nothing here. Canceling a denial, a shadowed decision and a
// FailOpen admission gives nothing either.
func TestCancelNeverAboveBurst(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	const rate, burst = 100, 50 // full again in half a second
	for _, mode := range []hybrid.Mode{hybrid.Local, hybrid.Global, hybrid.Hybrid} {
		t.Run(mode.String(), func(t *testing.T) {
			l := cluster(t, srv, 1, nil, hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Mode: mode, OnOutage: hybrid.FailClosed})[0]
			r, err := l.Reserve(ctx, "api", "k", burst)
			if err != nil || !r.Allowed {
				t.Fatalf("Reserve = %+v, %v", r, err)
			}
			time.Sleep(600 * time.Millisecond) // lets the bucket refill: the state under test, not a synchronisation
			start := time.Now()
			a, _ := drain(t, l, "api", "k")
			if err := r.Cancel(ctx); err != nil {
				t.Fatal(err)
			}
			b, _ := drain(t, l, "api", "k")
			took := time.Since(start)
			if bound := burst + rate*took.Seconds() + 1; float64(a+b) > bound {
				t.Errorf("admitted %d, then %d after the refund, in %v: above burst + rate·w = %.0f", a, b, took, bound)
			}
		})
	}
	t.Run("nothing taken", func(t *testing.T) {
		l := cluster(t, srv, 1, nil,
			hybrid.Limit{Name: "slow", Rate: hybrid.PerHour(1), Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailClosed},
			hybrid.Limit{Name: "shadow", Rate: hybrid.PerHour(1), Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailClosed, Shadow: true})[0]
		for _, limit := range []string{"slow", "shadow"} {
			if d, err := l.Allow(ctx, limit, "k"); err != nil || !d.Allowed {
				t.Fatalf("%s: first request %+v, %v", limit, d, err)
			}
			r, err := l.Reserve(ctx, limit, "k", 1)
			if err != nil || (r.Allowed && !r.Shadowed) {
				t.Fatalf("%s: Reserve on an empty bucket = %+v, %v; want a denial", limit, r, err)
			}
			if err := r.Cancel(ctx); err != nil {
				t.Fatal(err)
			}
			if d, _ := l.Allow(ctx, limit, "k"); d.Allowed && !d.Shadowed {
				t.Errorf("%s: canceling a denial gave a token back", limit)
			}
		}
	})
}

// A canceled reservation of a leased key goes back to the lease's bucket
// here. One instance, a rate of 2/s (a token every half second): the key
// is leased once its demand shows; a reservation of 3 on the lease, a
// drain to the lease's denial, a Cancel, and the lease admits the 3 again
// (2 whole ones at least: the refund is less the refill since); after a
// second Cancel, at most the fraction left.
func TestReserveCancelLeased(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	l := cluster(t, srv, 1, nil, hybrid.Limit{Name: "api", Rate: 2, Burst: 20, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed})[0]
	const n = 3
	var r *hybrid.Reservation
	eventually(t, 10*time.Second, "a reservation admitted on a lease", func() bool {
		var err error
		if r, err = l.Reserve(ctx, "api", "k", n); err != nil {
			t.Fatal(err)
		}
		// LeasedRate: a lease of the rate, not credit (tokens taken ahead
		// of the next requests, run as a lease of rate 0).
		st, _ := l.Status("api")
		return r.Allowed && r.Source == hybrid.SourceLease && st.LeasedRate > 0
	})
	if _, src := drain(t, l, "api", "k"); src != hybrid.SourceLease {
		t.Fatalf("drained to a denial by %v, want by the lease", src)
	}
	for i, most := range []int{n, 1} {
		if err := r.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
		got, src := drain(t, l, "api", "k")
		if got > most || (i == 0 && got < n-1) || src != hybrid.SourceLease {
			t.Errorf("after Cancel %d: %d admitted until the lease (%v) denied, want %d", i+1, got, src, most)
		}
	}
}

// Invariant 1 with refunds: what the cluster admits, less the requests
// canceled, stays within rate·w + burst over every window. Three
// instances saturate one key in each mode; each cancels a third of its
// admissions at once and a third up to 300ms later, when the bucket may
// have filled again (a refund never lifts it above where it would be had
// the request never come). Worst windows of 50ms to 1s are checked.
func TestCancelKeepsTheBound(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const rate, burst, total = 200.0, 20, 2 * time.Second
	for _, mode := range []hybrid.Mode{hybrid.Local, hybrid.Global, hybrid.Hybrid} {
		t.Run(mode.String(), func(t *testing.T) {
			inst := cluster(t, srv, 3, nil, hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Mode: mode, OnOutage: hybrid.FailClosed})
			var mu sync.Mutex
			var kept []time.Duration
			start := time.Now()
			var wg sync.WaitGroup
			for i, l := range inst {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(i), 1))
					var late sync.WaitGroup
					defer late.Wait()
					for time.Since(start) < total {
						at := time.Since(start)
						r, err := l.Reserve(context.Background(), "api", "k", 1)
						if err != nil {
							t.Error(err)
							return
						}
						if !r.Allowed {
							time.Sleep(time.Millisecond) // pacing, not a synchronisation
							continue
						}
						switch rng.IntN(3) {
						case 0:
							_ = r.Cancel(context.Background())
						case 1:
							d := time.Duration(rng.Int64N(int64(300 * time.Millisecond)))
							late.Go(func() {
								time.Sleep(d) // the cancel comes late: the state under test
								_ = r.Cancel(context.Background())
							})
						default:
							mu.Lock()
							kept = append(kept, at)
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			slices.Sort(kept)
			t.Logf("%d admissions kept over %v", len(kept), total)
			// Local mode splits the limit: each instance its third, the
			// same bound in all.
			assertBound(t, kept, rate, burst, 0, 50*time.Millisecond, 250*time.Millisecond, time.Second)
		})
	}
}
