package hybrid_test

import (
	"context"
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
			after, src := drain(t, other, "api", "k")
			if after != n || src != tc.source {
				t.Errorf("admitted %d after the cancel (denied by %v), want the %d given back (by %v)", after, src, n, tc.source)
			}
			if err := r.Cancel(ctx); err != nil {
				t.Fatal(err)
			}
			if again, _ := drain(t, other, "api", "k"); again != 0 {
				t.Errorf("a second Cancel gave back %d tokens, want none", again)
			}
			if tc.mode == hybrid.Global && n+before != burst {
				t.Errorf("admitted %d before the refund, want the burst %d", n+before, burst)
			}
		})
	}
}

// A refund never lifts a bucket above its burst: a reservation canceled
// while the bucket is full again gives nothing, so the next burst is the
// burst, not more. Canceling a denial, a shadowed decision and a FailOpen
// admission gives nothing either.
func TestCancelNeverAboveBurst(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	const rate, burst = 1000, 10 // refills a token a millisecond
	for _, mode := range []hybrid.Mode{hybrid.Local, hybrid.Global, hybrid.Hybrid} {
		t.Run(mode.String(), func(t *testing.T) {
			l := cluster(t, srv, 1, nil, hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Mode: mode, OnOutage: hybrid.FailClosed})[0]
			r, err := l.Reserve(ctx, "api", "k", 4)
			if err != nil || !r.Allowed {
				t.Fatalf("Reserve = %+v, %v", r, err)
			}
			// The bucket is full again within 4ms.
			time.Sleep(20 * time.Millisecond) // lets the bucket refill: the state under test, not a synchronisation
			if err := r.Cancel(ctx); err != nil {
				t.Fatal(err)
			}
			// Drained at once: a few tokens may refill meanwhile, never 4.
			if got, _ := drain(t, l, "api", "k"); got > burst+3 {
				t.Errorf("admitted %d after a refund to a full bucket of %d: the refund lifted it above its burst", got, burst)
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
// is leased once its demand shows, and a lease's denial, a Cancel, and the
// next request is admitted from the lease; after a second Cancel it is not.
func TestReserveCancelLeased(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	l := cluster(t, srv, 1, nil, hybrid.Limit{Name: "api", Rate: 2, Burst: 20, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed})[0]
	var r *hybrid.Reservation
	eventually(t, 10*time.Second, "a reservation admitted on a lease", func() bool {
		var err error
		if r, err = l.Reserve(ctx, "api", "k", 1); err != nil {
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
	for i, want := range []bool{true, false} {
		if err := r.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
		d, err := l.Allow(ctx, "api", "k")
		if err != nil || d.Allowed != want || d.Source != hybrid.SourceLease {
			t.Errorf("after Cancel %d: %+v, %v; want allowed %v on the lease", i+1, d, err, want)
		}
	}
}
