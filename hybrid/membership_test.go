package hybrid_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/membership"
)

// fastClient returns a client to srv that fails fast once the server is
// gone (no retries, short timeouts), closed in t.Cleanup.
func fastClient(t testing.TB, srv *redistest.Server) *redis.Client {
	t.Helper()
	return fastClientTo(t, srv.Addr)
}

// fastClientTo is fastClient to any address, a fault proxy's for example:
// the 200 ms client timeout the fault tests count slow decisions against.
func fastClientTo(t testing.TB, addr string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 200 * time.Millisecond,
		WriteTimeout: 200 * time.Millisecond, DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// joinNode starts a Local-profile memberlist node on 127.0.0.1, port 0,
// joining seeds, and closes it in t.Cleanup (a no-op if a Limiter closed it
// first).
func joinNode(t *testing.T, name string, seeds ...string) *membership.Memberlist {
	t.Helper()
	m, err := membership.Join(membership.Config{
		Name:     name,
		BindAddr: "127.0.0.1",
		Seeds:    seeds,
		Profile:  membership.Local,
	})
	if err != nil {
		t.Fatalf("Join(%s): %v", name, err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// burstNow counts the admissions of a fresh key in a tight loop until the
// first denial: the key's burst, plus whatever refills during the loop.
func burstNow(t *testing.T, l *hybrid.Limiter, limit, key string) int {
	t.Helper()
	ctx := context.Background()
	for n := 0; ; n++ {
		d, err := l.Allow(ctx, limit, key)
		if err != nil {
			t.Fatalf("Allow(%s, %s): %v", limit, key, err)
		}
		if !d.Allowed {
			return n
		}
		if n > 10000 {
			t.Fatalf("Allow(%s, %s): no denial after %d admissions", limit, key, n)
		}
	}
}

// shareOf is the local.Share of r tokens per second and burst b.
func shareOf(r float64, b int) local.Share { return local.Share{Limit: rate.Limit(r), Burst: b} }

// TestMembershipResplitsDefaultShares: three instances, each with a real
// memberlist node, split each limit's local quota (LocalShare: a Local
// limit's decisions, a Hybrid limit's FailLocal quota) three ways; when
// one closes (and so leaves the cluster gracefully) the other two re-split
// it two ways, and a Local key's admissions follow the new quota. (The
// local quotas use the largest count within PeakWindow, less the instances
// that left gracefully: the short PeakWindow here is a leftover of the
// time a leave counted for all of it; TestGracefulLeaveRaisesShares keeps
// the default.)
func TestMembershipResplitsDefaultShares(t *testing.T) {
	srv := redistest.Start(t)
	limits := []hybrid.Limit{
		{Name: "local-limit", Rate: 300, Burst: 30, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
		{Name: "hybrid-limit", Rate: 300, Burst: 30, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal},
	}
	nodes := make([]*membership.Memberlist, 3)
	nodes[0] = joinNode(t, "node-0")
	for i := 1; i < len(nodes); i++ {
		nodes[i] = joinNode(t, fmt.Sprintf("node-%d", i), nodes[0].Addr())
	}
	inst := make([]*hybrid.Limiter, len(nodes))
	for i, m := range nodes {
		inst[i] = newLimiter(t, hybrid.Config{Redis: fastClient(t, srv), Members: m, Limits: limits, PeakWindow: 500 * time.Millisecond})
	}

	// sharesAre reports whether every Limiter in ls counts n instances and
	// gives both limits the local quota want.
	sharesAre := func(ls []*hybrid.Limiter, n int, want local.Share) func() bool {
		return func() bool {
			for _, l := range ls {
				if l.Instances() != n {
					return false
				}
				for _, lim := range limits {
					st, err := l.Status(lim.Name)
					if err != nil {
						t.Fatal(err)
					}
					if st.Instances != n || st.LocalShare != want {
						return false
					}
				}
			}
			return true
		}
	}
	eventually(t, 10*time.Second, "three instances at {100/s, 10}", sharesAre(inst, 3, shareOf(100, 10)))
	if got := burstNow(t, inst[1], "local-limit", "before"); got < 10 || got > 11 {
		t.Errorf("fresh Local key on one of 3 instances admitted %d at once, want the burst share 10 (11 with refill)", got)
	}

	if err := inst[0].Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	rest := inst[1:]
	eventually(t, 10*time.Second, "the two remaining instances at {150/s, 15}", sharesAre(rest, 2, shareOf(150, 15)))
	for i, l := range rest {
		if got := burstNow(t, l, "local-limit", "after"); got < 15 || got > 16 {
			t.Errorf("instance %d: fresh Local key on one of 2 instances admitted %d at once, want the burst share 15 (16 with refill)", i+1, got)
		}
	}
}

// soloLimiter is one Limiter with a static instance count and its own Redis.
type soloLimiter struct {
	l       *hybrid.Limiter
	members *membership.Static
	srv     *redistest.Server
	limit   string
	seen    chan int // counts delivered to a watcher registered after the Limiter's
}

func (in *soloLimiter) status(t *testing.T) hybrid.Status {
	t.Helper()
	st, err := in.l.Status(in.limit)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// setCount sets the instance count to n and waits until the Limiter's
// membership callback has returned: watchers run in registration order on
// one goroutine, and in.seen's watcher was registered after the Limiter's.
func (in *soloLimiter) setCount(t *testing.T, n int) {
	t.Helper()
	in.members.Set(n)
	timeout := time.After(5 * time.Second)
	for {
		select {
		case got := <-in.seen:
			if got == n {
				return
			}
		case <-timeout:
			t.Fatalf("count %d not delivered within 5s", n)
		}
	}
}

// degrade kills Redis and decides fresh keys (warmKey: exact decisions,
// which fail) until the lease loop finds Redis gone (renewals unanswered
// for a while, or a failed decision's PING failing too) and degrades the
// limit.
func (in *soloLimiter) degrade(t *testing.T) {
	t.Helper()
	in.srv.Kill(t)
	burst := in.status(t).Limit.Burst
	i := 0
	eventually(t, 5*time.Second, "the limit degraded", func() bool {
		i++
		warmKey(t, in.l, in.limit, fmt.Sprintf("probe-%d", i), burst)
		return in.status(t).Degraded
	})
}

// TestFailLocalUsesLargestRecentN is invariant 5's FailLocal share: while
// Redis is unreachable a key without a lease runs at rate/N with N the
// largest count seen within Config.PeakWindow, so that a partition or a
// crash seen just before or during the outage cannot inflate the share.
func TestFailLocalUsesLargestRecentN(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	const (
		limitRate  = 400.0
		limitBurst = 40
		limit      = "api"
	)
	quarter, whole := shareOf(limitRate/4, limitBurst/4), shareOf(limitRate, limitBurst)

	// start returns a Limiter on a fresh Redis whose static counter says 4,
	// once a first lease has been granted.
	start := func(t *testing.T, peakWindow time.Duration) *soloLimiter {
		t.Helper()
		in := &soloLimiter{srv: redistest.Start(t), members: membership.NewStatic("solo", 4), limit: limit, seen: make(chan int, 16)}
		in.l = newLimiter(t, hybrid.Config{
			Redis:      fastClient(t, in.srv),
			Members:    in.members,
			Limits:     []hybrid.Limit{{Name: limit, Rate: limitRate, Burst: limitBurst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}},
			PeakWindow: peakWindow,
			// Short leases: the limit degrades about UncontendedTTL/2 after
			// Redis stops answering.
			UncontendedTTL: time.Second,
		})
		// Watchers run in registration order on one goroutine, so when this
		// one sees a count the Limiter's callback has returned.
		t.Cleanup(in.members.Watch(func(n int) {
			select {
			case in.seen <- n:
			default:
			}
		}))
		// warmKey makes the key worth a lease: its first decisions are
		// exact, and the next tick asks for one.
		eventually(t, 5*time.Second, "a first lease", func() bool {
			warmKey(t, in.l, limit, "warm", limitBurst)
			st := in.status(t)
			return st.LeasedRate > 0 && !st.Degraded
		})
		return in
	}
	quarterOrWhole := func(s local.Share) string {
		switch s {
		case quarter:
			return "rate/4"
		case whole:
			return "rate/1"
		}
		return fmt.Sprintf("%+v", s)
	}

	t.Run("count drops during the outage", func(t *testing.T) {
		in := start(t, 0) // PeakWindow 1 minute
		in.degrade(t)
		eventually(t, 5*time.Second, "the degraded share rate/4", func() bool { return in.status(t).LocalShare == quarter })
		in.setCount(t, 1)
		if got := in.status(t).LocalShare; got != quarter {
			t.Fatalf("degraded, N 4 -> 1 within PeakWindow: LocalShare %s, want rate/4", quarterOrWhole(got))
		}
		if got := burstNow(t, in.l, limit, "fresh"); got < limitBurst/4 || got > limitBurst/4+1 {
			t.Errorf("fresh key while degraded admitted %d at once, want burst/4 = %d", got, limitBurst/4)
		}
	})

	t.Run("count drops just before the outage", func(t *testing.T) {
		in := start(t, 0)
		in.setCount(t, 1)
		// The local quota is split by the largest recent count always,
		// not only while degraded.
		if got := in.status(t).LocalShare; got != quarter {
			t.Fatalf("normal, N 4 -> 1 within PeakWindow: LocalShare %s, want rate/4", quarterOrWhole(got))
		}
		in.degrade(t)
		eventually(t, 5*time.Second, "the degraded share rate/4", func() bool { return in.status(t).LocalShare == quarter })
	})

	// N = 4 was the live count until the moment it dropped, so it was seen
	// within PeakWindow however long it had held before.
	t.Run("count held longer than PeakWindow still counts", func(t *testing.T) {
		// Long enough to cover the time a limit takes to degrade (a lease
		// lifetime without answers).
		const window = 1200 * time.Millisecond
		in := start(t, window)
		// The passage of time is what is under test here: let N = 4 have
		// held for longer than PeakWindow when it drops.
		time.Sleep(2 * window)
		in.setCount(t, 1)
		in.degrade(t)
		// Give the degrade transition time to re-split (it would be rate/4).
		deadline := time.Now().Add(time.Second)
		for in.status(t).LocalShare != quarter && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // poll interval
		}
		if got := in.status(t).LocalShare; got != quarter {
			t.Errorf("degraded right after N 4 -> 1: LocalShare %s, want rate/4: N = 4 was the live count until just now, "+
				"within PeakWindow %v, but the Limiter forgot it because it first became 4 more than PeakWindow ago", quarterOrWhole(got), window)
		}
	})

	// Once PeakWindow has passed since N dropped, the largest recent N is
	// the current one: the share should grow back to rate/1.
	t.Run("share follows N once PeakWindow has passed", func(t *testing.T) {
		const window = 3 * time.Second
		in := start(t, window)
		in.setCount(t, 1)
		dropped := time.Now()
		in.degrade(t)
		eventually(t, window/2, "the degraded share rate/4 within PeakWindow of the drop", func() bool { return in.status(t).LocalShare == quarter })
		eventually(t, time.Until(dropped.Add(window+2*time.Second)), "the share grows back to rate/1 once PeakWindow has passed",
			func() bool { return in.status(t).LocalShare == whole })
	})
}
