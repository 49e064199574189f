package hybrid_test

import (
	"context"
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
