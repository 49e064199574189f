package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// A cost up to the burst is admitted on any instance while the cluster's
// bucket holds it: in Global mode, on a Hybrid key's exact decisions, and
// on a Hybrid key leased here whose part of the burst is below the cost
// (the pool in Redis decides it, and the lease goes on). Three instances,
// burst 20, cost 10: the bucket holds two such requests, not three.
func TestCostUpToTheBurst(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	for _, mode := range []hybrid.Mode{hybrid.Global, hybrid.Hybrid} {
		t.Run(mode.String()+"/exact", func(t *testing.T) {
			inst := cluster(t, srv, 3, nil, hybrid.Limit{Name: "api", Rate: hybrid.PerHour(1), Burst: 20, Mode: mode, OnOutage: hybrid.FailClosed})
			for i, want := range []bool{true, true, false} {
				d, err := inst[i].AllowN(ctx, "api", "k", 10)
				if err != nil || d.Allowed != want {
					t.Fatalf("instance %d: AllowN(10) = %+v, %v; want allowed %v", i, d, err, want)
				}
				if !d.Allowed && (d.RetryAfter <= 0 || d.RetryAfter == hybrid.Never) {
					t.Errorf("instance %d: denial's RetryAfter %v, want the time until the bucket holds 10", i, d.RetryAfter)
				}
			}
		})
	}
	t.Run("hybrid/leased", func(t *testing.T) {
		// One instance of 16 paces a key at about a tenth of the rate: its
		// lease holds its want and a sixteenth of the rest, about a
		// quarter of the burst, and the pool the rest.
		const rate, burst = 1000, 100
		l := cluster(t, srv, 1, func(c *hybrid.Config) { c.Members = membership.NewStatic("instance-0", 16) },
			hybrid.Limit{Name: "leased", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed})[0]
		rdb := srv.Client(t)
		pace := func(d time.Duration) {
			for end := time.Now().Add(d); time.Now().Before(end); {
				if _, err := l.Allow(ctx, "leased", "k"); err != nil {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond) // pacing, not a synchronisation
			}
		}
		eventually(t, 5*time.Second, "a lease", func() bool {
			pace(100 * time.Millisecond)
			return leaseHolders(t, rdb, "leased", "instance-0", []string{"k"})[0]
		})
		pace(300 * time.Millisecond)
		granted := leaseRecords(t, rdb, "leased", "k")["instance-0"].granted
		part := int(math.Floor(burst * granted / rate))
		cost := part + 1
		if float64(cost) > burst*(1-granted/rate) {
			t.Fatalf("the lease of %v/s leaves the pool less than a cost of %d: nothing to test", granted, cost)
		}
		t.Logf("lease of %v/s holds %d of the burst; cost %d", granted, part, cost)
		eventually(t, 3*time.Second, fmt.Sprintf("a cost of %d admitted", cost), func() bool {
			d, err := l.AllowN(ctx, "leased", "k", cost)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed && (d.RetryAfter <= 0 || d.RetryAfter == hybrid.Never) {
				t.Fatalf("denial %+v: want a finite RetryAfter", d)
			}
			return d.Allowed
		})
		if !leaseHolders(t, rdb, "leased", "instance-0", []string{"k"})[0] {
			t.Error("the take beyond the lease dropped it")
		}
	})
	t.Run("local", func(t *testing.T) {
		// Local mode knows no cluster's bucket: each instance has burst/N.
		// A cost above that is an error here, not a denial forever.
		inst := cluster(t, srv, 3, nil, hybrid.Limit{Name: "loc", Rate: hybrid.PerHour(1), Burst: 20, Mode: hybrid.Local, OnOutage: hybrid.FailClosed})
		if d, err := inst[0].AllowN(ctx, "loc", "k", 6); err != nil || !d.Allowed {
			t.Errorf("AllowN(6) of a local share of 6: %+v, %v", d, err)
		}
		if _, err := inst[0].AllowN(ctx, "loc", "k2", 10); !errors.Is(err, hybrid.ErrExceedsBurst) {
			t.Errorf("AllowN(10) above a local share of 6: err %v, want ErrExceedsBurst", err)
		}
	})
}

// A cost above the burst is a mistake in the costs, not a rate limit: the
// middleware answers 500 without Retry-After, and the Limiter logs it once
// per limit, however often it comes.
func TestCostAboveBurstIsAMistake(t *testing.T) {
	var logs records
	l := newLimiter(t, hybrid.Config{Logger: slog.New(&logs), Limits: []hybrid.Limit{
		{Name: "api", Rate: 10, Burst: 5, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	h := hybrid.Middleware(l, "api", byHeader, hybrid.WithCost(func(*http.Request) int { return 6 }))(http.NotFoundHandler())
	for i := range 3 {
		resp := serve(t, h, "alice")
		if resp.StatusCode != http.StatusInternalServerError || resp.Header.Get("Retry-After") != "" {
			t.Errorf("request %d: %d, Retry-After %q; want 500 and none", i, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	if got := logs.logged("costs more than the limit can ever admit"); len(got) != 1 || got[0]["limit"] != "api" {
		t.Errorf("logged %v, want one line for limit api", got)
	}
}
