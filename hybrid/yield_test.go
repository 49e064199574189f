package hybrid_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// TestYieldGivesTheAskerTheRate: one key used on one instance of four, at
// twice the limit. The others never see the key; asked to yield, they give
// up their default shares, so the one instance soon leases the whole rate.
func TestYieldGivesTheAskerTheRate(t *testing.T) {
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: 200, Burst: 20, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	inst := cluster(t, srv, 4, nil, lim)
	ctx := context.Background()
	stop := time.Now().Add(10 * time.Second)
	tk := time.NewTicker(time.Second / 400)
	defer tk.Stop()
	for range tk.C {
		_, _ = inst[0].Allow(ctx, "api", "k")
		st, _ := inst[0].Status("api")
		if st.LeasedRate >= 0.9*lim.Rate {
			t.Logf("leased %.1f/s", st.LeasedRate)
			return
		}
		if time.Now().After(stop) {
			t.Fatalf("after 10s instance 0 leases %.1f/s of %v/s", st.LeasedRate, lim.Rate)
		}
	}
}

// TestExactBurstsAdmitAFreshBurstWhole: with exact bursts a client's burst
// of up to Burst requests on a fresh key is admitted whole, on whichever
// instance it lands, and not one request more; with split bursts (the
// default) the same burst is cut at that instance's part of the burst.
func TestExactBurstsAdmitAFreshBurstWhole(t *testing.T) {
	srv := redistest.Start(t)
	exactLim := hybrid.Limit{Name: "exact", Rate: 25, Burst: 40, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal, ExactBursts: true}
	splitLim := hybrid.Limit{Name: "split", Rate: 25, Burst: 40, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	inst := cluster(t, srv, 4, nil, exactLim, splitLim)
	ctx := context.Background()
	burst := func(l *hybrid.Limiter, limit, key string) (admitted int) {
		for range 41 {
			d, err := l.Allow(ctx, limit, key)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		return admitted
	}
	for i, l := range inst {
		key := fmt.Sprint("fresh-", i)
		if got := burst(l, "exact", key); got != 40 {
			t.Errorf("exact bursts, instance %d: %d of a burst of 41 admitted; want the whole burst of 40", i, got)
		}
		if got := burst(l, "split", key); got != 10 {
			t.Errorf("split bursts, instance %d: %d of a burst of 41 admitted; want its part of the burst, 10", i, got)
		}
	}
}
