package hybrid_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// scripts counts the script calls Redis has served: every round trip the
// library makes is one EVALSHA (or one EVAL after a NOSCRIPT).
func scripts(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	st := srv.CommandStats(t)
	return st["evalsha"] + st["eval"]
}

// TestCommandsFollowTheRenewalSchedule is invariant 4 of DESIGN.md, counted
// on the server: Redis commands stay flat while demand grows tenfold, every
// key stays within the renewal schedule whatever its request rate, and
// contended keys whose shares have settled back off towards the uncontended
// schedule.
func TestCommandsFollowTheRenewalSchedule(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 20 s; run without -short")
	}
	const rate = 500.0

	// measure runs the load for 2 s, then counts commands over 3 s more,
	// once the keys' leases have settled (an uncontended key renews every
	// 2.5 s by default, so the window holds at least one renewal of each).
	// Each measurement has a Redis and an instance of its own, so that no
	// lease of an earlier one is counted.
	measure := func(name string, ks []string, perKey float64) float64 {
		t.Helper()
		srv := redistest.Start(t)
		inst := cluster(t, srv, 1, nil, hybrid.Limit{Name: "api", Rate: rate, Burst: 50, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal})
		per := []float64{perKey * float64(len(ks))}
		drive(t, inst, load{limit: "api", keys: ks, perInst: per, duration: 2 * time.Second})
		c0 := scripts(t, srv)
		o := drive(t, inst, load{limit: "api", keys: ks, perInst: per, duration: 3 * time.Second})
		perSec := float64(scripts(t, srv)-c0) / o.elapsed.Seconds()
		t.Logf("%s: %d decisions, %.1f Redis commands/s", name, o.decided, perSec)
		return perSec
	}

	hot := []string{"hot"}
	low := measure("one key at 2x its rate", hot, 2*rate)
	high := measure("one key at 20x its rate", hot, 20*rate)
	if high > low*1.5+2 {
		t.Errorf("commands grew from %.1f/s to %.1f/s when demand grew 10x", low, high)
	}

	uncontended := make([]string, 200)
	for i := range uncontended {
		uncontended[i] = fmt.Sprintf("cold-%d", i)
	}
	contended := make([]string, 20)
	for i := range contended {
		contended[i] = fmt.Sprintf("busy-%d", i)
	}
	perUncontended := measure("200 uncontended keys at rate/10", uncontended, rate/10) / 200
	perContended := measure("20 contended keys at 2x rate", contended, 2*rate) / 20
	t.Logf("commands per key per second: uncontended %.2f, contended %.2f", perUncontended, perContended)
	cfg := hybrid.DefaultConfig(nil, nil)
	// The schedule: a lease renews at half its lifetime; contended leases
	// live ContendedTTL, doubling once their share has settled, up to
	// UncontendedTTL.
	fast, slow := 2/cfg.ContendedTTL.Seconds(), 2/cfg.UncontendedTTL.Seconds()
	if perUncontended == 0 || perUncontended > slow*1.5 {
		t.Errorf("an uncontended key renews %.2f times/s; the schedule says about %.2f", perUncontended, slow)
	}
	if perContended > fast*1.1 {
		t.Errorf("a contended key renews %.2f times/s; the schedule allows at most %.2f", perContended, fast)
	}
	if perContended > fast*0.5 {
		t.Errorf("contended keys whose shares settled renew %.2f times/s: want them backed off below half the contended schedule (%.2f)", perContended, fast)
	}
}

// TestCommandsAreCountedPerLimit: Status.RedisCommands counts the commands
// sent for that limit alone (the demo's summary puts them on each limit's
// row): lease requests of a Hybrid limit's keys, one script per decision of
// a Global one, none for a limit without traffic.
func TestCommandsAreCountedPerLimit(t *testing.T) {
	srv := redistest.Start(t)
	inst := cluster(t, srv, 1, nil,
		hybrid.Limit{Name: "leased", Rate: 100, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal},
		hybrid.Limit{Name: "idle", Rate: 100, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal},
		hybrid.Limit{Name: "exact", Rate: 100, Burst: 10, Mode: hybrid.Global, OnOutage: hybrid.FailLocal})
	l := inst[0]
	ctx := context.Background()
	allow := func(limit, key string, n int) {
		for range n {
			if _, err := l.Allow(ctx, limit, key); err != nil {
				t.Fatal(err)
			}
		}
	}
	counts := func() (leased, idle, exact uint64, served int64) {
		return mustStatus(t, l, "leased").RedisCommands, mustStatus(t, l, "idle").RedisCommands,
			mustStatus(t, l, "exact").RedisCommands, scripts(t, srv)
	}
	// Each script's first run costs a second command (NOSCRIPT, then EVAL).
	allow("exact", "k", 1)
	allow("leased", "k", 1)
	eventually(t, 2*time.Second, "the first lease", func() bool { return mustStatus(t, l, "leased").LeasedRate > 0 })
	l0, i0, e0, s0 := counts()
	allow("exact", "k", 7)
	allow("leased", "other", 1)
	// The second key's first lease request, within a tick or two; the
	// first key's renewal is seconds away.
	eventually(t, 2*time.Second, "the second key's lease request", func() bool { return mustStatus(t, l, "leased").RedisCommands > l0 })
	l1, i1, e1, s1 := counts()
	if i1 != 0 || e1-e0 != 7 || l1-l0 != 1 {
		t.Errorf("commands counted: leased %d, idle %d, exact %d; want 1, 0 and 7", l1-l0, i1-i0, e1-e0)
	}
	if sum := int64(l1 - l0 + e1 - e0); sum != s1-s0 {
		t.Errorf("the limits counted %d commands in all; Redis served %d scripts", sum, s1-s0)
	}
}
