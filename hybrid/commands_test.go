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
// on the server: Redis commands stay flat while a leased key's demand grows
// tenfold; keys leased uncontended keep to the uncontended renewal
// schedule; contended keys whose shares have settled back off below half
// the contended one; and keys too thin for a lease, decided exactly, cost
// at most one script per decision.
func TestCommandsFollowTheRenewalSchedule(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 25 s; run without -short")
	}
	const rate = 500.0

	// measure runs the load (perInst[i] arrivals a second on instance i,
	// spread over ks) for 2 s, then counts commands over 3 s more, once the
	// keys' leases have settled (an uncontended key renews every 2.5 s by
	// default, so the window holds at least one renewal of each). Each
	// measurement has a Redis and instances of its own, so that no lease
	// of an earlier one is counted. It returns the commands per second
	// Redis served, and the decisions per second.
	measure := func(t *testing.T, name string, ks []string, perInst ...float64) (cmds, decisions float64) {
		t.Helper()
		srv := redistest.Start(t)
		inst := cluster(t, srv, len(perInst), nil, hybrid.Limit{Name: "api", Rate: rate, Burst: 50, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal})
		drive(t, inst, load{limit: "api", keys: ks, perInst: perInst, duration: 2 * time.Second})
		c0 := scripts(t, srv)
		o := drive(t, inst, load{limit: "api", keys: ks, perInst: perInst, duration: 3 * time.Second})
		cmds = float64(scripts(t, srv)-c0) / o.elapsed.Seconds()
		decisions = float64(o.decided) / o.elapsed.Seconds()
		t.Logf("%s: %.0f decisions/s, %.1f Redis commands/s", name, decisions, cmds)
		return cmds, decisions
	}
	named := func(prefix string, n int) []string {
		ks := make([]string, n)
		for i := range ks {
			ks[i] = fmt.Sprintf("%s-%d", prefix, i)
		}
		return ks
	}

	// The two light loads (1 000 and 400 arrivals a second) are measured
	// side by side; the heavy ones alone.
	hot := []string{"hot"}
	var low, thin, thinDecisions float64
	t.Run("light", func(t *testing.T) {
		t.Run("2x", func(t *testing.T) {
			t.Parallel()
			low, _ = measure(t, "one key at 2x its rate", hot, 2*rate)
		})
		t.Run("thin", func(t *testing.T) {
			t.Parallel()
			thin, thinDecisions = measure(t, "200 keys at 2/s over two instances", named("thin", 200), 200, 200)
		})
	})
	high, _ := measure(t, "one key at 20x its rate", hot, 20*rate)
	if high > low*1.5+2 {
		t.Errorf("commands grew from %.1f/s to %.1f/s when demand grew 10x", low, high)
	}

	cfg := hybrid.DefaultConfig(nil, nil)
	fast, slow := 2/cfg.ContendedTTL.Seconds(), 2/cfg.UncontendedTTL.Seconds()
	// Uncontended: 200 keys at a tenth of their rate on one instance.
	uncontended, _ := measure(t, "200 keys at rate/10 on one instance", named("warm", 200), 200*rate/10)
	if per := uncontended / 200; per == 0 || per > slow*1.5 {
		t.Errorf("an uncontended key renews %.2f times/s; the schedule says about %.2f", per, slow)
	}
	// Contended: 20 keys at twice their rate over two instances.
	contended, _ := measure(t, "20 contended keys at 2x rate", named("busy", 20), 20*rate, 20*rate)
	if per := contended / 20; per > fast*0.5 {
		t.Errorf("contended keys whose shares settled renew %.2f times/s: want them backed off below half the contended schedule (%.2f)", per, fast)
	}
	// Thin: 200 keys at 2/s each over two instances, too few tokens per
	// renewal for a lease: each decision is one script at most.
	if thin > thinDecisions {
		t.Errorf("thin keys sent %.1f commands/s for %.1f decisions/s: more than one per decision", thin, thinDecisions)
	}
}

// TestCommandsAreCountedPerLimit: Status.RedisCommands counts the commands
// sent for that limit alone (the demo's summary puts them on each limit's
// row): exact takes and lease asks of a Hybrid limit's keys, one script per
// decision of a Global one, none for a limit without traffic; together,
// what Redis served.
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
	warmKey(t, l, "leased", "k", 10)
	eventually(t, 2*time.Second, "the first lease", func() bool { return mustStatus(t, l, "leased").LeasedRate > 0 })
	l0, i0, e0, s0 := counts()
	allow("exact", "k", 7)
	// Eleven exact decisions, each a take, and then the key's lease ask,
	// within a tick or two.
	warmKey(t, l, "leased", "other", 10)
	eventually(t, 2*time.Second, "the second key's lease ask", func() bool { return mustStatus(t, l, "leased").RedisCommands > l0+11 })
	l1, i1, e1, s1 := counts()
	if i1 != 0 || e1-e0 != 7 || l1-l0 < 12 {
		t.Errorf("commands counted: leased %d, idle %d, exact %d; want at least 12, 0 and 7", l1-l0, i1-i0, e1-e0)
	}
	if sum := int64(l1 - l0 + e1 - e0); sum != s1-s0 {
		t.Errorf("the limits counted %d commands in all; Redis served %d scripts", sum, s1-s0)
	}
}
