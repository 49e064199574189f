package hybrid_test

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/faultproxy"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// TestLostAnswersKeepTheBound is invariant 1 when Redis runs an instance's
// renewals but their answers never arrive (latency on the way back only,
// beyond the client timeout). Instance a holds most of a key's rate when
// its answers start to get lost and b starts wanting the key too: Redis
// then shrinks a's grant in its renewals, but a, never told, keeps running
// the grant it holds until that runs out. Redis must go on counting what a
// may still be running, or b is granted the difference early and the two
// admit more than the rate. Measured while a decides on its lease.
func TestLostAnswersKeepTheBound(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	const (
		rate, burst = 1000.0, 20
		instances   = 2
		// By then a holds an uncontended grant: its want and half of what
		// nobody wants (the rest is left for an instance that starts
		// wanting the key).
		faultAt = 3 * time.Second
		// The run ends when a's last lease can have run out at the latest:
		// its last renewal that got an answer came before the fault, and
		// a lease is in force locally for 90% of UncontendedTTL. After
		// that a, its answers still lost, decides exactly: denied while
		// its limit is not degraded, by FailLocal at rate/N once it is
		// (its PING fails too), while b may lease the rest: a partial
		// outage, which invariant 1 does not cover (see the README's
		// known limits).
		ttl   = 2 * time.Second
		total = faultAt + ttl*9/10
	)
	srv := redistest.Start(t)
	toA := faultproxy.Start(t, srv.Addr)
	limit := hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	regA := prometheus.NewRegistry()
	inst := clusterEach(t, srv, instances, func(i int, c *hybrid.Config) {
		if i == 0 {
			c.Redis, c.Registerer = fastClientTo(t, toA.Addr), regA
		}
		// a's uncontended lease, renewed at half-life, outlives its first
		// lost answer by about a second.
		c.UncontendedTTL = ttl
	}, limit)
	a, b := inst[0], inst[1]

	// a alone wants 80% of the rate from the start; b, idle until the
	// fault, then wants more than the whole rate.
	var oa, ob outcome
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(faultAt) // schedules b's load; waits for nothing
		ob = drive(t, []*hybrid.Limiter{b}, load{limit: "api", keys: []string{"k"}, perInst: []float64{1.5 * rate}, duration: total - faultAt})
	}()
	oa = drive(t, []*hybrid.Limiter{a}, load{limit: "api", keys: []string{"k"}, perInst: []float64{0.8 * rate}, duration: total,
		duringAt: faultAt, during: func() { toA.Latency(t, faultproxy.Downstream, 2*time.Second) }})
	<-done

	if n := counterSum(t, regA, "hybridlimit_redis_errors_total"); n == 0 {
		t.Fatal("no renewal of a failed: the fault did not hold back its answers")
	}
	admitted := slices.Clone(oa.admitted["k"])
	shift := ob.start.Sub(oa.start)
	for _, at := range ob.admitted["k"] {
		admitted = append(admitted, at+shift)
	}
	slices.Sort(admitted)
	t.Logf("a admitted %d (sources %v), b admitted %d (sources %v)", len(oa.admitted["k"]), oa.sources, len(ob.admitted["k"]), ob.sources)
	tick := hybrid.DefaultConfig(nil, nil).Tick.Seconds()
	// b's cold start: an allowance kept from version 2, where b started
	// the key at its default share before Redis counted it. In version 3
	// b's first decisions are exact, against the pool a's lease leaves, so
	// it only loosens the bound.
	coldStart := instances * (burst/instances + rate/instances*tick)
	for _, w := range []time.Duration{500 * time.Millisecond, time.Second} {
		bound := rate*w.Seconds() + burst + coldStart + instances
		got := maxInWindow(admitted, w)
		t.Logf("window %v: at most %d admitted, bound %.0f", w, got, bound)
		if float64(got) > bound {
			t.Errorf("%d admitted in a %v window, above rate·w + burst + b's cold start = %.0f", got, w, bound)
		}
	}
	if oa.slow+ob.slow != 0 || oa.errs+ob.errs != 0 {
		t.Errorf("%d slow decisions, %d errors", oa.slow+ob.slow, oa.errs+ob.errs)
	}
}
