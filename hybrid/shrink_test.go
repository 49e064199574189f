package hybrid_test

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// TestShrinkIsToldAtOnce: an instance whose grant shrinks is counted in
// Redis at its old grant until that ends (it may not have heard of the new
// one), so it says so as soon as the smaller grant is in force, and what it
// gave up goes to the instance that wants it within a few of that one's
// renewals, not at its own next renewal (a contended one, ContendedTTL/2
// later) nor once the old grant runs out. Counted in renewal rounds of the
// instance waiting for the share, which renews every two ticks while it
// holds less than its fair share: about 7 of them would pass before a's
// next renewal here.
func TestShrinkIsToldAtOnce(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	const (
		rate, burst = 1000.0, 20
		instances   = 2
		ttl         = 2 * time.Second
		// A long contended lease, so that a's next renewal after it shrinks
		// comes well after the tick at which it should tell Redis.
		contendedTTL = 1500 * time.Millisecond
		// a's lease hash is older than UncontendedTTL by then: a holds an
		// uncontended grant of about 94% of the rate.
		bFrom = 2500 * time.Millisecond
		total = bFrom + 3*time.Second
	)
	srv := redistest.Start(t)
	limit := hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	inst := clusterEach(t, srv, instances, func(i int, c *hybrid.Config) {
		c.Registerer, c.UncontendedTTL, c.ContendedTTL = regs[i], ttl, contendedTTL
	}, limit)
	a, b := inst[0], inst[1]
	leased := func(l *hybrid.Limiter) float64 { return mustStatus(t, l, "api").LeasedRate }
	bRounds := func() uint64 { return histogramCount(t, regs[1], "hybridlimit_renewal_duration_seconds") }

	// The loads end on their own (their durations are fixed); a failing
	// eventually waits here only for the loads that were started.
	var wg sync.WaitGroup
	defer wg.Wait()
	start := time.Now()
	wg.Add(1)
	go func() {
		defer wg.Done()
		drive(t, []*hybrid.Limiter{a}, load{limit: "api", keys: []string{"k"}, perInst: []float64{0.8 * rate}, duration: total})
	}()
	eventually(t, 5*time.Second, "a leases most of the rate", func() bool { return leased(a) > 0.9*rate })
	time.Sleep(time.Until(start.Add(bFrom))) // schedules b's load; waits for nothing
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Twice the rate, well above exactDemandUpTo (3) times b's fair
		// half with headroom: b's first, starved grant keeps b on a lease
		// rather than the exact placement (at 1.5 times the rate the two
		// were within measurement noise), and LeasedRate shows its share.
		drive(t, []*hybrid.Limiter{b}, load{limit: "api", keys: []string{"k"}, perInst: []float64{2 * rate}, duration: total - bFrom})
	}()

	// a shrinks to its fair half at its next renewal (its lease's half-life).
	var from uint64
	eventually(t, ttl, "a's grant shrinks to its fair share", func() bool {
		from = bRounds()
		return leased(a) > 0 && leased(a) < 0.6*rate
	})
	eventually(t, ttl, "b leases what a gave up", func() bool { return leased(b) > 0.45*rate })
	n := bRounds() - from
	t.Logf("b leased %.0f/s %d renewal rounds after a shrank to %.0f/s", leased(b), n, leased(a))
	if n > 3 {
		t.Errorf("b took %d renewal rounds to get what a gave up, want at most 3: a did not tell Redis it had shrunk", n)
	}
}
