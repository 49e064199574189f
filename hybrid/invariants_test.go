package hybrid_test

import (
	"cmp"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// TestInvariantsBoundAndUtilisation is invariants 1 and 2 of DESIGN.md: four
// to sixteen instances on one Redis, open-loop demand of twice the limit for
// 6 s after a warm-up (1.2x and 1.5x in two cases), balanced and skewed (90% on one
// instance; 60% and 70% in two cases), one key and many, bursts large and
// below the instance count. Per key, the cluster admits at most
// rate*w+burst over any window w (a token of rounding per instance), and in
// all at least 97% of what one exact token bucket admits on the same
// arrivals (95% at sixteen instances).
func TestInvariantsBoundAndUtilisation(t *testing.T) {
	if testing.Short() {
		t.Skip("7 to 9 s per case; run without -short")
	}
	// measured is how long the ratios are measured over, after the warm-up:
	// thousands of decisions per case.
	const measured = 6 * time.Second
	for _, tc := range []struct {
		name      string
		instances int
		keys      int
		rate      float64 // per key
		burst     int
		skew      bool
		// floor is the least ratio to the exact bucket: invariant 2's 97%,
		// 95% from sixteen instances up, except where version 3 is known
		// to fall short of it.
		floor float64
		// heavy is the part of the demand on the first instance of a
		// skewed case (0: 0.9), and factor the demand over the limit
		// (0: 2).
		heavy, factor float64
	}{
		{"balanced/keys=1", 4, 1, 10000, 1000, false, 0.97, 0, 0},
		{"skewed/keys=1", 4, 1, 10000, 1000, true, 0.97, 0, 0},
		// Sixteen instances: a fair share of a sixteenth, 12 tokens of
		// burst each.
		{"balanced/instances=16", 16, 1, 2000, 200, false, 0.95, 0, 0},
		{"skewed/instances=16", 16, 1, 2000, 200, true, 0.95, 0, 0},
		// And 20 keys of 2 tokens of burst per instance's fair share,
		// which stay exact.
		{"balanced/instances=16/keys=20", 16, 20, 40, 32, false, 0.95, 0, 0},
		// Keys sprayed at twice their limit with a fair share of 2.5
		// tokens of burst: they lease (saturated). 50 keys (2000
		// arrivals/s) is what two cores under -race drive on schedule;
		// with 1000 (40 000/s), and even 200, the load generator fell
		// seconds behind, and the ratios measured nothing (see the check
		// below).
		{"balanced/keys=50", 4, 50, 20, 10, false, 0.97, 0, 0},
		// NOT invariant 2, a known limit in the README: the three light
		// instances (1.3/s per key each) decide exactly against a pool
		// the heavy one's lease leaves them, taking its tokens in turns;
		// a light instance held until a turn it then has no request for
		// gets little (0.89 of the exact bucket; version 2 0.80-0.85).
		// This floor only keeps it from getting worse.
		{"skewed/keys=50", 4, 50, 20, 10, true, 0.85, 0, 0},
		// A burst below the instance count (2 tokens over 4 instances):
		// a lease would hold under a whole token, so the key is decided
		// exactly, its pool's tokens taken in turns. Skewed, NOT
		// invariant 2 (a known limit in the README, as in version 2):
		// the heavy instance asks at every turn, the light ones are held
		// past theirs (0.93 of the exact bucket; version 2 0.93-0.94).
		// This floor only keeps it from getting worse.
		{"balanced/burst=2", 4, 1, 200, 2, false, 0.97, 0, 0},
		{"skewed/burst=2", 4, 1, 200, 2, true, 0.90, 0, 0},
		// Moderate skew: the light instances use half to 85% of their
		// fair shares, which the heavy one's lease leaves them.
		{"skewed60/demand=1.2x", 4, 1, 200, 10, true, 0.97, 0.6, 1.2},
		{"skewed70/instances=6/keys=10", 6, 10, 30, 30, true, 0.97, 0.7, 1.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Cases of up to 2000 arrivals a second keep to their
			// schedule beside one another (the check below says if they
			// do not); the heavier ones run alone.
			if cmp.Or(tc.factor, 2)*tc.rate*float64(tc.keys) <= 2000 {
				t.Parallel()
			}
			instances := tc.instances
			// The ratio is measured after a warm-up: the keys' first
			// decisions are exact, and leases settle within a second or
			// two; at sixteen instances, three.
			warmup := time.Second
			if instances > 4 {
				warmup = 3 * time.Second
			}
			srv := redistest.Start(t)
			lim := hybrid.Limit{Name: "api", Rate: tc.rate, Burst: tc.burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
			inst := cluster(t, srv, instances, nil, lim)
			factor, heavy := cmp.Or(tc.factor, 2), cmp.Or(tc.heavy, 0.9)
			demand := factor * tc.rate * float64(tc.keys)
			per := make([]float64, instances)
			for i := range per {
				per[i] = demand / float64(instances)
				if tc.skew {
					per[i] = demand * (1 - heavy) / float64(instances-1)
					if i == 0 {
						per[i] = demand * heavy
					}
				}
			}
			c0 := scripts(t, srv)
			o := drive(t, inst, load{limit: "api", keys: keys(tc.keys), perInst: per, duration: warmup + measured})
			cmds := scripts(t, srv) - c0
			t.Logf("Redis commands %d for %d decisions: %.2f per 1000 decisions", cmds, o.decided, 1000*float64(cmds)/float64(o.decided))
			if o.errs != 0 {
				t.Fatalf("%d decisions returned errors", o.errs)
			}
			// The ratios below compare with an exact bucket on the
			// scheduled arrivals: they mean something only if the load
			// generator kept to its schedule.
			if want := demand * (warmup + measured).Seconds(); float64(total(o.arrivals)) < 0.98*want || o.elapsed > warmup+measured+time.Second {
				t.Fatalf("the load generator fell behind: %d of %.0f arrivals in %v; the machine is too busy for this test", total(o.arrivals), want, o.elapsed)
			}

			// Invariant 1, per key: a token of rounding per instance (a
			// lease's part of the burst is whole tokens, its local bucket
			// a float).
			slack := float64(instances)
			for _, w := range []time.Duration{100 * time.Millisecond, time.Second, o.elapsed} {
				worst, worstKey := 0.0, ""
				for k, adm := range o.admitted {
					bound := tc.rate*w.Seconds() + float64(tc.burst) + slack
					got := float64(maxInWindow(adm, w))
					if got-bound > worst || worstKey == "" {
						worst, worstKey = got-bound, k
					}
					if got > bound {
						t.Errorf("key %s: %v admitted in a %v window, bound %.0f", k, got, w, bound)
						break
					}
				}
				t.Logf("window %v: worst key %s at %.1f from its bound", w, worstKey, worst)
			}

			logPerSecond(t, o)
			// Invariant 2: at least 97% (95%) of one exact token bucket fed the
			// same arrivals from the start, over the measured time after warm-up.
			ref, refAll, got := 0, 0, 0
			for k, arr := range o.arrivals {
				ref += exact(tc.rate, tc.burst, arr, warmup)
				refAll += exact(tc.rate, tc.burst, arr, 0)
				got += since(o.admitted[k], warmup)
			}
			t.Logf("from a cold start, including warm-up: admitted %d, exact bucket %d, ratio %.3f",
				total(o.admitted), refAll, float64(total(o.admitted))/float64(refAll))
			ratio := float64(got) / float64(ref)
			t.Logf("decisions %d, admitted %d, exact bucket %d, ratio %.3f, sources %v, per instance %v", o.decided, got, ref, ratio, o.sources, o.perInst)
			if ratio < tc.floor {
				t.Errorf("admitted %d, %.1f%% of the exact bucket's %d: want at least %.0f%%", got, 100*ratio, ref, 100*tc.floor)
			}
			// Invariant 3 (decisions never wait on Redis) is held where Redis
			// is slow or gone (TestOutagePolicies, TestNetworkFaults,
			// TestServerFaults), where a decision that waited would take the
			// client's timeout. With a healthy Redis a slow decision here
			// measures only how busy the machine is.
			t.Logf("%d decisions took over 100ms", o.slow)
		})
	}
}
