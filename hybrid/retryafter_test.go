package hybrid_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// A denial's RetryAfter is never more than the time until the cluster's
// bucket would hold the request's tokens, plus a tick, at slow rates too
// (per minute, per hour): after a client's burst of 5 spent over three
// instances, the first denial on each instance says one token's refill,
// not the turn among the instances that Redis gives the later ones. (An
// instance that holds a later turn says so to its next requests: it will
// not ask Redis before then; see Decision.RetryAfter.)
func TestRetryAfterAtSlowRates(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	tick := hybrid.DefaultConfig(nil, nil).Tick
	for _, mode := range []hybrid.Mode{hybrid.Global, hybrid.Hybrid} {
		for _, rate := range []float64{hybrid.PerMinute(5), hybrid.PerHour(5)} {
			refill := time.Duration(float64(time.Second) / rate)
			t.Run(fmt.Sprintf("%v/every %v", mode, refill), func(t *testing.T) {
				srv.FlushAll(t)
				inst := cluster(t, srv, 3, nil, hybrid.Limit{Name: "login", Rate: rate, Burst: 5, Mode: mode, OnOutage: hybrid.FailClosed})
				for i := range 5 {
					if d, err := inst[i%3].Allow(ctx, "login", "alice"); err != nil || !d.Allowed {
						t.Fatalf("request %d of the burst: %+v, %v", i, d, err)
					}
				}
				for i := range 3 {
					d, err := inst[i%3].Allow(ctx, "login", "alice")
					if err != nil || d.Allowed {
						t.Fatalf("request %d after the burst: %+v, %v; want a denial", i, d, err)
					}
					if d.RetryAfter <= 0 || d.RetryAfter > refill+tick {
						t.Errorf("request %d after the burst, instance %d: RetryAfter %v, want at most one refill (%v) and a tick", i, i%3, d.RetryAfter, refill)
					}
				}
			})
		}
	}
}

// RateLimit's r (Decision.Remaining) on a fresh key's first request is
// what the limit as a whole has left, on any instance: burst 20, three
// instances, 19 after the first request, in Global mode and on a Hybrid
// key's exact decisions (whose credit for the next request here is the
// client's too); after a second request on another instance, 18, less in
// Hybrid the credit the first instance holds (never more than is left).
func TestRemainingIsTheClusters(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	for _, mode := range []hybrid.Mode{hybrid.Global, hybrid.Hybrid} {
		t.Run(mode.String(), func(t *testing.T) {
			srv.FlushAll(t)
			inst := cluster(t, srv, 3, nil, hybrid.Limit{Name: "api", Rate: hybrid.PerHour(1), Burst: 20, Mode: mode, OnOutage: hybrid.FailClosed})
			for i, want := range []int64{19, 18} {
				least := want
				if mode == hybrid.Hybrid && i > 0 {
					least-- // instance 0's credit, unknown here
				}
				d, err := inst[i].Allow(ctx, "api", "fresh")
				if err != nil || !d.Allowed || d.Remaining > want || d.Remaining < least {
					t.Errorf("request %d on instance %d: %+v, %v; want admitted with %d left (at least %d)", i, i, d, err, want, least)
				}
			}
		})
	}
}

// A denial held in process under a limit ends when SetLimits changes the
// limit: the key's next decision asks Redis under the new one at once, and
// Redis does not hold it to a turn it gave under the old rate.
func TestSetLimitsDropsHeldDenials(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	lim := hybrid.Limit{Name: "login", Rate: hybrid.PerHour(1), Burst: 1, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed}
	l := cluster(t, srv, 1, nil, lim)[0]
	if d, err := l.Allow(ctx, "login", "ann"); err != nil || !d.Allowed {
		t.Fatalf("first request: %+v, %v", d, err)
	}
	if d, err := l.Allow(ctx, "login", "ann"); err != nil || d.Allowed || d.RetryAfter < time.Minute {
		t.Fatalf("second request: %+v, %v; want a denial for about an hour", d, err)
	}
	// At 1000/s, Redis has a token for it within a millisecond.
	lim.Rate = 1000
	if err := l.SetLimits([]hybrid.Limit{lim}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "admitted under the new rate", func() bool {
		d, err := l.Allow(ctx, "login", "ann")
		return err == nil && d.Allowed
	})
}
