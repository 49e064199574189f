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
// on the server: no commands for keys whose demand stays within their
// default share; Redis commands stay flat while demand grows tenfold; a key
// past its share but under the rate keeps to the uncontended renewal
// schedule once its idle peer yielded; and contended keys whose shares have
// settled back off towards the uncontended schedule.
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
	// of an earlier one is counted.
	// It returns the commands per second Redis served, and those the
	// first instance sent.
	measure := func(name string, ks []string, perInst ...float64) (all, first float64) {
		t.Helper()
		srv := redistest.Start(t)
		inst := cluster(t, srv, len(perInst), nil, hybrid.Limit{Name: "api", Rate: rate, Burst: 50, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal})
		drive(t, inst, load{limit: "api", keys: ks, perInst: perInst, duration: 2 * time.Second})
		c0, f0 := scripts(t, srv), mustStatus(t, inst[0], "api").RedisCommands
		o := drive(t, inst, load{limit: "api", keys: ks, perInst: perInst, duration: 3 * time.Second})
		all = float64(scripts(t, srv)-c0) / o.elapsed.Seconds()
		first = float64(mustStatus(t, inst[0], "api").RedisCommands-f0) / o.elapsed.Seconds()
		t.Logf("%s: %d decisions, %.1f Redis commands/s, %.1f/s from the first instance", name, o.decided, all, first)
		return all, first
	}
	named := func(prefix string, n int) []string {
		ks := make([]string, n)
		for i := range ks {
			ks[i] = fmt.Sprintf("%s-%d", prefix, i)
		}
		return ks
	}

	hot := []string{"hot"}
	low, _ := measure("one key at 2x its rate", hot, 2*rate)
	high, _ := measure("one key at 20x its rate", hot, 20*rate)
	if high > low*1.5+2 {
		t.Errorf("commands grew from %.1f/s to %.1f/s when demand grew 10x", low, high)
	}

	// Version 2: keys within their default share never ask Redis.
	if within, _ := measure("200 keys at rate/10, within their share", named("cold", 200), 200*rate/10); within != 0 {
		t.Errorf("keys within their default share cost %.1f Redis commands/s; want none", within)
	}

	// Past its default share of rate/2 but under the rate: the key leases
	// once the idle instance yielded its share, and the idle instance
	// records its yield in Redis.
	const past = 20
	all, lessee := measure("20 keys at 0.7x rate on one of two instances", named("warm", past), past*0.7*rate, 0)
	perUncontended, perYield := lessee/past, (all-lessee)/past
	contended, _ := measure("20 contended keys at 2x rate", named("busy", 20), 20*2*rate)
	perContended := contended / 20
	t.Logf("commands per key per second: uncontended lease %.2f (and %.2f for the yield records), contended %.2f", perUncontended, perYield, perContended)
	cfg := hybrid.DefaultConfig(nil, nil)
	// The schedule: a lease renews at half its lifetime; contended leases
	// live ContendedTTL, doubling once their share has settled, up to
	// UncontendedTTL. A yield record lives 2 UncontendedTTLs and renews at
	// a third of that while its peer asks (hybrid/engine.go, yieldLife), and
	// once more within half its life after the last ask.
	fast, slow := 2/cfg.ContendedTTL.Seconds(), 2/cfg.UncontendedTTL.Seconds()
	yieldRenewals := 3 / (2 * cfg.UncontendedTTL.Seconds())
	if perUncontended == 0 || perUncontended > slow*1.5 {
		t.Errorf("an uncontended key renews %.2f times/s; the schedule says about %.2f", perUncontended, slow)
	}
	if perYield > yieldRenewals*1.5 {
		t.Errorf("a yielding instance records its yield %.2f times/s per key; the schedule says at most about %.2f", perYield, yieldRenewals)
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
