package hybrid_test

import (
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/faultproxy"
	"github.com/hybridlimit/hybridlimit/internal/gossiptest"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// TestInstanceCrash: of three instances, each with its own memberlist node,
// one crashes without leaving: from one moment on it sends nothing, neither
// gossip (its node is cut off from the others) nor Redis commands (a
// blackhole on its own path to Redis), so it neither leaves the cluster nor
// releases its leases. Once the others' failure detector gives it up, and
// the count of 3 has left PeakWindow (short here), they count 2 and re-split
// the local quotas (LocalShare, of the Local limit here) two ways. Once the
// victim's lease ends in Redis (UncontendedTTL after its last renewal at
// the latest, short here) they lease its share of the Hybrid key between
// them, whatever they count: Redis counts every instance at what its
// record holds, and nobody without one. Their grants never sum above the
// rate.
func TestInstanceCrash(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	const rate, burst = 300.0, 30
	limits := []hybrid.Limit{
		{Name: "local-limit", Rate: rate, Burst: burst, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
		{Name: "api", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal},
	}
	nw := gossiptest.NewNetwork(nil)
	t.Cleanup(nw.Shutdown) // after the Limiters, which close their nodes
	srv := redistest.Start(t)
	toVictim := faultproxy.Start(t, srv.Addr)

	names := []string{"survivor-0", "survivor-1", "victim"}
	groups := []string{"survivors", "survivors", "victim"}
	var seeds []string
	inst := make([]*hybrid.Limiter, len(names))
	for i, name := range names {
		m := partitionNode(t, nw, name, groups[i], seeds...)
		seeds = append(seeds, m.Addr())
		addr := srv.Addr
		if name == "victim" {
			addr = toVictim.Addr
		}
		inst[i] = newLimiter(t, hybrid.Config{
			Redis:   fastClientTo(t, addr),
			Members: m,
			Limits:  limits,
			// Short leases, so that the victim's runs out soon after the crash.
			UncontendedTTL: time.Second,
			PeakWindow:     time.Second,
		})
	}
	survivors, victim := inst[:2], inst[2]

	// Every instance wants the whole rate of one key: each holds a
	// contended lease of about a third of it.
	key := []string{"k"}
	hs := startHammer(t, survivors, []string{"api"}, key)
	hv := startHammer(t, []*hybrid.Limiter{victim}, []string{"api"}, key)
	eventually(t, 20*time.Second, "three instances, each leasing a share of k", func() bool {
		for _, l := range inst {
			st := mustStatus(t, l, "api")
			if st.Instances != 3 || st.LeasedRate == 0 || st.Degraded {
				return false
			}
		}
		return true
	})
	if held := leaseHolders(t, srv.Client(t), "api", "victim", key); !held[0] {
		t.Fatal("the victim holds no lease on k in Redis before the crash")
	}

	hv.halt()
	toVictim.Blackhole(t)
	nw.Split("survivors", "victim")
	crashed := time.Now()

	third, half := shareOf(rate/3, burst/3), shareOf(rate/2, burst/2)
	if st := mustStatus(t, survivors[0], "local-limit"); st.LocalShare != third && st.Instances == 3 {
		t.Errorf("before the crash was detected: LocalShare %+v, want rate/3 %+v", st.LocalShare, third)
	}
	// The survivors' grants on k, checked at every poll until they hold the
	// victim's share too: never above the rate together.
	var most float64
	sumGranted := func() float64 {
		sum := 0.0
		for _, l := range survivors {
			sum += mustStatus(t, l, "api").LeasedRate
		}
		most = max(most, sum)
		return sum
	}
	// Both are polled together, each timed from the crash: the lease runs
	// out after at most UncontendedTTL, the failure detector takes longer.
	var resplit, takenOver time.Duration
	eventually(t, 60*time.Second, "the survivors count 2, split the default shares two ways and lease the victim's share", func() bool {
		if takenOver == 0 && sumGranted() >= 0.95*rate {
			takenOver = time.Since(crashed)
		}
		if resplit == 0 {
			two := true
			for _, l := range survivors {
				st := mustStatus(t, l, "local-limit")
				two = two && st.Instances == 2 && st.LocalShare == half
			}
			if two {
				resplit = time.Since(crashed)
			}
		}
		return resplit != 0 && takenOver != 0
	})
	t.Logf("after the crash: the survivors lease the victim's share after %v, count 2 after %v",
		takenOver.Round(time.Millisecond), resplit.Round(time.Millisecond))
	if held := leaseHolders(t, srv.Client(t), "api", "victim", key); held[0] {
		t.Error("the victim's lease is still in Redis after the survivors took its share")
	}
	if most > rate*1.001 {
		t.Errorf("the survivors' grants on k summed to %.1f/s, above the rate %v/s", most, rate)
	}

	hs.haltAndCheck(t)
	for i, l := range survivors {
		if st := mustStatus(t, l, "api"); st.Degraded || st.FailingKeys != 0 {
			t.Errorf("%s: %+v; a peer's crash is not an outage", names[i], st)
		}
	}
}
