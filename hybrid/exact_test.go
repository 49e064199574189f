package hybrid_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/faultproxy"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// TestExactWaitsOnlyWhileRedisMayAnswer is invariant 3 of DESIGN.md for the
// exact placement, through a network that passes nothing: an exact decision
// waits on Redis bounded by RedisTimeout (not by the client's much longer
// timeouts), and once the limit is degraded no decision waits at all, on a
// key that was exact or on a fresh one, whatever the policy. The client's
// timeouts are ten times RedisTimeout and RedisTimeout is a second, so a
// decision that waited would take at least a second: far from one that did
// not, however busy the machine is.
func TestExactWaitsOnlyWhileRedisMayAnswer(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	srv := redistest.Start(t)
	proxy := faultproxy.Start(t, srv.Addr)
	const redisTimeout = time.Second
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1, ContextTimeoutEnabled: true,
		DialTimeout: 10 * redisTimeout, ReadTimeout: 10 * redisTimeout, WriteTimeout: 10 * redisTimeout})
	t.Cleanup(func() { _ = rdb.Close() })
	policies := []hybrid.Policy{hybrid.FailLocal, hybrid.FailOpen, hybrid.FailClosed}
	want := map[hybrid.Policy]hybrid.Source{hybrid.FailLocal: hybrid.SourceLocal, hybrid.FailOpen: hybrid.SourceFailOpen, hybrid.FailClosed: hybrid.SourceFailClosed}
	var limits []hybrid.Limit
	for _, p := range policies {
		limits = append(limits, hybrid.Limit{Name: p.String(), Rate: 100, Burst: 10, Mode: hybrid.Hybrid, OnOutage: p})
	}
	l := newLimiter(t, hybrid.Config{Redis: rdb, Members: membership.NewStatic("only", 1), Limits: limits,
		RedisTimeout: redisTimeout, ContendedTTL: 4 * redisTimeout, UncontendedTTL: 8 * redisTimeout})
	ctx := context.Background()
	timed := func(limit, key string) (hybrid.Decision, time.Duration) {
		t.Helper()
		start := time.Now()
		d, err := l.Allow(ctx, limit, key)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("%s %s: %v", limit, key, err)
		}
		return d, took
	}
	for _, p := range policies {
		if d, _ := timed(p.String(), "was-exact"); !d.Allowed || d.Source != hybrid.SourceExact {
			t.Fatalf("%v: first decision of a key: %+v, want an exact admission", p, d)
		}
		// The pool is full: the take handed a token of credit, which the
		// next decision spends, so that the one after is exact again.
		if d, _ := timed(p.String(), "was-exact"); !d.Allowed || d.Source != hybrid.SourceLease {
			t.Fatalf("%v: second decision of a key: %+v, want an admission from the first one's credit", p, d)
		}
	}

	proxy.Blackhole(t)
	// Before the limit degrades, an exact decision waits, but no longer
	// than RedisTimeout; it is refused as an outage, not failed open
	// (Redis may answer the other instances); so are the key's next
	// decisions, without waiting, until a renewal period later.
	d, took := timed(hybrid.FailOpen.String(), "was-exact")
	if took < redisTimeout/2 || took > redisTimeout+redisTimeout/2 {
		t.Errorf("an exact decision with Redis unreachable took %v; want it bounded by RedisTimeout (%v)", took, redisTimeout)
	}
	if d.Allowed || d.Source != hybrid.SourceFailClosed {
		t.Errorf("an exact decision that Redis did not answer: %+v; want it refused as an outage", d)
	}
	if d, took := timed(hybrid.FailOpen.String(), "was-exact"); took >= redisTimeout/2 || d.Allowed {
		t.Errorf("the next decision of a key whose take failed: %+v after %v; want a denial at once", d, took)
	}

	eventually(t, 20*redisTimeout, "every limit degraded", func() bool {
		for _, p := range policies {
			if !mustStatus(t, l, p.String()).Degraded {
				return false
			}
		}
		return true
	})
	for _, p := range policies {
		for i := range 20 {
			for _, key := range []string{"was-exact", fmt.Sprint("fresh-", i)} {
				d, took := timed(p.String(), key)
				if took >= redisTimeout/2 {
					t.Errorf("%v, key %s, degraded: a decision took %v; want no wait on Redis", p, key, took)
				}
				if d.Source != want[p] {
					t.Errorf("%v, key %s, degraded: decided by %v, want %v", p, key, d.Source, want[p])
				}
			}
		}
	}
}

// TestExactCommandBound is invariant 4 of DESIGN.md for the exact
// placement, counted on the server: one script per decision at most, and
// no more than one per admitted request plus one per end of a cached
// denial. A caller hammers one key far past its limit; every decision
// Redis did not make was made by the deny cache.
func TestExactCommandBound(t *testing.T) {
	srv := redistest.Start(t)
	const rate, burst = 50, 5
	lim := hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	// A slow loop: its first tick comes after the test, so the key stays in
	// the exact placement (a tick would move a key this busy to a lease).
	l := newLimiter(t, hybrid.Config{Redis: srv.Client(t), Members: membership.NewStatic("only", 1), Limits: []hybrid.Limit{lim},
		Tick: 10 * time.Second, ContendedTTL: 21 * time.Second, UncontendedTTL: 21 * time.Second, RedisTimeout: time.Second})
	ctx := context.Background()
	c0 := scripts(t, srv)
	var decided, admitted, holds, credits int
	inHold, lastExactAdmitted := false, false
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		d, err := l.Allow(ctx, "api", "k")
		if err != nil {
			t.Fatal(err)
		}
		if d.Source == hybrid.SourceLease {
			// The credit an exact admission from a pool at least half
			// full hands: one token, admitted here without a script.
			if !d.Allowed || !lastExactAdmitted {
				t.Fatalf("decision %d: %+v, want a lease decision only to admit an exact admission's credit", decided, d)
			}
			decided++
			credits++
			lastExactAdmitted = false
			continue
		}
		if d.Source != hybrid.SourceExact {
			t.Fatalf("decision %d: %+v, want it in the exact placement", decided, d)
		}
		decided++
		lastExactAdmitted = d.Allowed
		if d.Allowed {
			admitted++
			inHold = false
		} else if !inHold {
			// The first denial of a run: Redis said when tokens would be
			// there, and the run is cached until then.
			holds++
			inHold = true
		}
	}
	sent := scripts(t, srv) - c0
	t.Logf("%d decisions, %d admitted exactly and %d on credit, %d runs of denials, %d scripts", decided, admitted, credits, holds, sent)
	if sent > int64(decided) {
		t.Errorf("%d scripts for %d decisions: more than one per decision", sent, decided)
	}
	// A run of denials costs the script that was denied, and one more for
	// each time its cache ran out while the bucket was still short (a
	// retry that came a little early): at most one per admitted request
	// after it, and one per run.
	if bound := int64(2*admitted + holds); sent > bound {
		t.Errorf("%d scripts for %d admitted requests and %d runs of denials; want at most %d", sent, admitted, holds, bound)
	}
	// The bound above means something only if the cache decided most.
	if decided < 10*int(sent) {
		t.Errorf("%d decisions sent %d scripts: the deny cache decided too few", decided, sent)
	}
	if maxAdmitted := int(rate*2.2) + burst; admitted+credits > maxAdmitted {
		t.Errorf("%d admitted in about 2 s, above the limit's %d", admitted+credits, maxAdmitted)
	}
}

// TestExactConcurrentCallers: callers racing on one exact key (as the
// goroutines of a server do) still send at most one script per decision,
// and the deny cache decides most of them.
func TestExactConcurrentCallers(t *testing.T) {
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: 50, Burst: 5, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	l := newLimiter(t, hybrid.Config{Redis: srv.Client(t), Members: membership.NewStatic("only", 1), Limits: []hybrid.Limit{lim},
		Tick: 10 * time.Second, ContendedTTL: 21 * time.Second, UncontendedTTL: 21 * time.Second, RedisTimeout: time.Second})
	ctx := context.Background()
	c0 := scripts(t, srv)
	var mu sync.Mutex
	var decided, admitted int
	var wg sync.WaitGroup
	end := time.Now().Add(2 * time.Second)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, a := 0, 0
			for time.Now().Before(end) {
				d, err := l.Allow(ctx, "api", "k")
				if err != nil {
					t.Error(err)
					return
				}
				n++
				if d.Allowed {
					a++
				}
			}
			mu.Lock()
			decided += n
			admitted += a
			mu.Unlock()
		}()
	}
	wg.Wait()
	sent := scripts(t, srv) - c0
	t.Logf("%d decisions, %d admitted, %d scripts", decided, admitted, sent)
	if sent > int64(decided) {
		t.Errorf("%d scripts for %d decisions: more than one per decision", sent, decided)
	}
	if decided < 10*int(sent) {
		t.Errorf("%d decisions sent %d scripts: the deny cache decided too few", decided, sent)
	}
	if admitted > 50*2.2+5 {
		t.Errorf("%d admitted in about 2 s, above the limit", admitted)
	}
}

// TestExactSprayedCostsAboutOneScriptPerAdmission is invariant 4's exact
// bound where it costs the most: a key whose requests are sprayed over four
// instances at 1.5 times its limit, where a lease would hold 3 tokens of
// the burst at each instance's demand, so the key stays exact. Redis hands
// the instances that must wait turns one refill apart, so each refill costs
// about one script: at most 1.5 per admission, where retries all at the
// next refill would cost one per decision. It also admits what one exact
// bucket would (invariant 2).
func TestExactSprayedCostsAboutOneScriptPerAdmission(t *testing.T) {
	srv := redistest.Start(t)
	const rate, burst, instances = 40.0, 8, 4
	lim := hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	inst := cluster(t, srv, instances, nil, lim)
	per := []float64{1.5 * rate / instances, 1.5 * rate / instances, 1.5 * rate / instances, 1.5 * rate / instances}
	const warmup = time.Second
	drive(t, inst, load{limit: "api", keys: []string{"k"}, perInst: per, duration: warmup})
	c0 := scripts(t, srv)
	o := drive(t, inst, load{limit: "api", keys: []string{"k"}, perInst: per, duration: 5 * time.Second})
	sent := scripts(t, srv) - c0
	admitted := total(o.admitted)
	ref := exact(rate, burst, o.arrivals["k"], 0)
	t.Logf("%d decisions, %d admitted (exact bucket %d), %d scripts: %.2f per admission, sources %v",
		o.decided, admitted, ref, sent, float64(sent)/float64(admitted), o.sources)
	if o.sources[hybrid.SourceExact] < o.decided*9/10 {
		t.Fatalf("sources %v: want the key decided in the exact placement", o.sources)
	}
	if float64(sent) > 1.5*float64(admitted) {
		t.Errorf("%d scripts for %d admissions: want at most 1.5 per admission", sent, admitted)
	}
	if float64(admitted) < 0.97*float64(ref) {
		t.Errorf("admitted %d, under 97%% of the exact bucket's %d", admitted, ref)
	}
}
