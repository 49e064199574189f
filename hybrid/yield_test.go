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

// TestSprayedDebug is temporary.
func TestSprayedDebug(t *testing.T) {
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: 8, Burst: 5, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	inst := cluster(t, srv, 4, nil, lim)
	ctx := context.Background()
	start := time.Now()
	tk := time.NewTicker(time.Second / 12)
	defer tk.Stop()
	i := 0
	src := map[hybrid.Source][2]int{}
	for range tk.C {
		d, err := inst[i%4].Allow(ctx, "api", "k")
		if err != nil {
			t.Fatal(err)
		}
		c := src[d.Source]
		if d.Allowed {
			c[0]++
		} else {
			c[1]++
		}
		src[d.Source] = c
		i += 3
		if i%24 == 0 {
			v, _ := srv.Client(t).Do(ctx, "HGETALL", "hybridlimit:{api:k}").Result()
			t.Logf("%v %v", time.Since(start).Round(time.Millisecond), v)
		}
		if time.Since(start) > 5*time.Second {
			break
		}
	}
	t.Logf("%v", src)
}
