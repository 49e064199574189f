package hybrid_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/hybrid/placement"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// TestOneBusyInstanceLeasesTheRate: one key used on one instance of four,
// at twice the limit, with bare Static counters that share nothing (no
// messages, no roster): the others never see the key, Redis counts them at
// nothing, and the one instance soon leases the whole rate.
func TestOneBusyInstanceLeasesTheRate(t *testing.T) {
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: 200, Burst: 20, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	inst := make([]*hybrid.Limiter, 4)
	for i := range inst {
		inst[i] = newLimiter(t, hybrid.Config{Redis: fastClient(t, srv), Members: membership.NewStatic(fmt.Sprint("instance-", i), 4),
			Limits: []hybrid.Limit{lim}})
	}
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

// TestFreshBurstAdmittedWhole: a client's burst of up to Burst requests on
// a fresh key is admitted whole, on whichever instance it lands, and not
// one request more (invariant 2).
func TestFreshBurstAdmittedWhole(t *testing.T) {
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: 25, Burst: 40, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	inst := cluster(t, srv, 4, nil, lim)
	ctx := context.Background()
	for i, l := range inst {
		key := fmt.Sprint("fresh-", i)
		admitted := 0
		for range 41 {
			d, err := l.Allow(ctx, "api", key)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != 40 {
			t.Errorf("instance %d: %d of a burst of 41 admitted; want the whole burst of 40", i, admitted)
		}
	}
}

// TestExactDenialIsCached: an exact decision that Redis denied with "none
// until t" is repeated in process until t, with no Redis command (the deny
// cache of DESIGN.md's exact placement), and asked again after t.
func TestExactDenialIsCached(t *testing.T) {
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: 2, Burst: 1, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	// A slow loop: its first tick comes after the test, so the key stays
	// in the exact placement (a tick would move a key this busy to a lease).
	l := newLimiter(t, hybrid.Config{Redis: srv.Client(t), Members: membership.NewStatic("only", 1), Limits: []hybrid.Limit{lim},
		Tick: 5 * time.Second, ContendedTTL: 11 * time.Second, UncontendedTTL: 11 * time.Second, RedisTimeout: time.Second})
	ctx := context.Background()
	commands := func() uint64 {
		st, err := l.Status("api")
		if err != nil {
			t.Fatal(err)
		}
		return st.RedisCommands
	}
	if d, err := l.Allow(ctx, "api", "k"); err != nil || !d.Allowed || d.Source != hybrid.SourceExact {
		t.Fatalf("first exact decision: %+v, %v", d, err)
	}
	d, err := l.Allow(ctx, "api", "k")
	if err != nil || d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("second decision within the burst's refill: %+v, %v; want a denial saying when", d, err)
	}
	until := time.Now().Add(d.RetryAfter)
	before := commands()
	n := 0
	for time.Now().Add(50 * time.Millisecond).Before(until) {
		if d, err := l.Allow(ctx, "api", "k"); err != nil || d.Allowed || d.Source != hybrid.SourceExact {
			t.Fatalf("decision %d within the hold: %+v, %v; want an exact denial", n, d, err)
		}
		n++
	}
	if got := commands() - before; got != 0 || n < 10 {
		t.Fatalf("%d decisions within the hold sent %d Redis commands; want them decided in process", n, got)
	}
	eventually(t, time.Second, "an exact admission once the hold has ended", func() bool {
		d, err := l.Allow(ctx, "api", "k")
		return err == nil && d.Allowed && d.Source == hybrid.SourceExact
	})
}

// TestExactDenialWithoutRateIsCached: an exact decision that Redis denied
// because the key's pool has no rate at all (the leases of the other
// instances hold the whole of it) is repeated in process for a renewal of
// a contended lease, ContendedTTL/2, with no Redis command: the pool gets
// rate back only as those leases renew, and every take until then would be
// a script for nothing.
func TestExactDenialWithoutRateIsCached(t *testing.T) {
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: 100, Burst: 4, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	const contendedTTL = 2 * time.Second
	inst := cluster(t, srv, 2, func(c *hybrid.Config) { c.ContendedTTL = contendedTTL }, lim)
	ctx := context.Background()
	// Instance 0 wants about nine times the limit: it leaves the exact
	// placement for a lease of the whole rate (Redis counts an instance
	// without a record at nothing).
	eventually(t, 10*time.Second, "instance 0 leasing the whole rate", func() bool {
		for range 10 {
			_, _ = inst[0].Allow(ctx, "api", "k")
			time.Sleep(time.Millisecond)
		}
		st, _ := inst[0].Status("api")
		return st.LeasedRate >= 0.99*lim.Rate
	})
	commands := func() uint64 {
		st, err := inst[1].Status("api")
		if err != nil {
			t.Fatal(err)
		}
		return st.RedisCommands
	}
	before := commands()
	start := time.Now()
	d, err := inst[1].Allow(ctx, "api", "k")
	if err != nil || d.Allowed || d.Source != hybrid.SourceExact || d.RetryAfter != contendedTTL/2 {
		t.Fatalf("instance 1's first decision: %+v, %v; want an exact denial, retry after %v", d, err, contendedTTL/2)
	}
	if got := commands() - before; got != 1 {
		t.Fatalf("instance 1's first decision sent %d Redis commands; want the one take", got)
	}
	// At under 200/s: instance 1 asks for a lease meanwhile, every
	// EarlyTicks ticks while starved, and may get one once instance 0's
	// renewal gives back what it holds above its share; until then its
	// decisions stay exact denials, held in process.
	n, leased := 0, false
	for time.Since(start) < contendedTTL/2-200*time.Millisecond {
		d, err := inst[1].Allow(ctx, "api", "k")
		leased = leased || (err == nil && d.Source == hybrid.SourceLease)
		if !leased && (err != nil || d.Allowed || d.Source != hybrid.SourceExact) {
			t.Fatalf("decision %d within the hold: %+v, %v; want an exact denial", n, d, err)
		}
		n++
		time.Sleep(5 * time.Millisecond)
	}
	// Only the loop's asks, one per EarlyTicks ticks at most: none of the
	// decisions is a take.
	dflt := hybrid.DefaultConfig(nil, nil)
	asks := uint64((contendedTTL/2)/(placement.EarlyTicks*dflt.Tick)) + 2
	if got := commands() - before - 1; n < 100 || got > asks {
		t.Fatalf("%d decisions within the hold sent %d Redis commands; want them decided in process (the loop's %d asks at most)", n, got, asks)
	}
}

// TestExactDemandIsCounted: Redis counts an instance that the leases
// elsewhere leave nothing at the demand it measured, requests its deny
// cache denied in process included (the local limiter counts every
// request, held or not): in its exact record, or in the lease ask it
// keeps making. The leases' next renewals leave it that much. Without the
// held requests, an exact user held while the leases took the whole rate
// would show Redis one request per hold, and wait for the share it wants.
func TestExactDemandIsCounted(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const rate = 100
	lim := hybrid.Limit{Name: "api", Rate: rate, Burst: 4, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	const contendedTTL = 2 * time.Second
	l := newLimiter(t, hybrid.Config{Redis: fastClient(t, srv), Members: membership.NewStatic("instance-0", 2),
		Limits: []hybrid.Limit{lim}, ContendedTTL: contendedTTL})
	ctx := context.Background()
	// The other instance leases the whole rate for a minute.
	store := global.New(rdb, "hybridlimit")
	g := make([]global.LeaseGrant, 1)
	err := store.AskLeases(ctx, []global.LeaseAsk{{Limit: "api", Key: "k", Instance: "other", Gen: 2, Want: rate, Rate: rate,
		Burst: lim.Burst, Instances: 2, TTL: time.Minute, MaxTTL: time.Minute}}, g)
	if err != nil || g[0].Err != nil || g[0].Granted < rate {
		t.Fatalf("the other instance's lease: %+v, %v; want the whole rate", g[0], err)
	}
	if d, err := l.Allow(ctx, "api", "k"); err != nil || d.Allowed || d.RetryAfter != contendedTTL/2 {
		t.Fatalf("the first decision: %+v, %v; want an exact denial, retry after %v", d, err, contendedTTL/2)
	}
	// counted is what Redis counts this instance's demand at: its exact
	// record's demand, or its lease record's want.
	counted := func() float64 {
		t.Helper()
		v, err := rdb.HGet(ctx, store.RecordKey("api", "k"), "i:instance-0").Result()
		if err != nil {
			t.Fatal(err)
		}
		// "X gen demand at_us asked expiry_us" or "L gen granted want ...".
		p := strings.Fields(v)
		f := 2
		if p[0] == "L" {
			f = 3
		}
		d, _ := strconv.ParseFloat(p[f], 64)
		return d
	}
	// Requests at 100/s: one take, then held in process for a second.
	first := time.Now()
	n := 0
	for {
		if time.Since(first) > 5*contendedTTL {
			t.Fatalf("after %d requests at 100/s, Redis counts this instance at %.1f/s; want at least 50", n, counted())
		}
		if d, err := l.Allow(ctx, "api", "k"); err != nil || d.Allowed {
			t.Fatalf("decision %d: %+v, %v; want a denial", n, d, err)
		}
		n++
		if counted() >= 50 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("counted at %.1f/s after %d requests in %v", counted(), n, time.Since(first).Round(time.Millisecond))
}

// TestExactUserGetsItsFairShare: an instance that wants a key only after
// its peer leased the whole rate decides it exactly, denied at first; its
// demand shows in Redis, and the peer's next renewal leaves it its fair
// share. No message passes between them.
func TestExactUserGetsItsFairShare(t *testing.T) {
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	lim := hybrid.Limit{Name: "api", Rate: 10, Burst: 4, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	inst := cluster(t, srv, 2, func(c *hybrid.Config) { c.ContendedTTL = 2 * time.Second }, lim)
	ctx := context.Background()
	// Instance 0 wants 20 times the limit from now to the end: it leases
	// the whole rate.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = inst[0].Allow(ctx, "api", "k")
			time.Sleep(5 * time.Millisecond) // 200/s
		}
	}()
	defer func() { close(stop); <-done }()
	eventually(t, 10*time.Second, "instance 0 leasing the whole rate", func() bool {
		return leaseRecords(t, rdb, "api", "k")["instance-0"].granted >= 0.99*lim.Rate
	})
	// Instance 1 now wants 20/s; its fair share is 5/s. Within 10 s it
	// gets at least 2/s over a 2 s stretch.
	admitted := make([]time.Time, 0, 200)
	deadline := time.Now().Add(10 * time.Second)
	for {
		now := time.Now()
		if now.After(deadline) {
			t.Fatalf("instance 1 admitted %d requests of k in 10 s at 20/s, never 4 within 2 s; want its fair share, 5/s",
				len(admitted))
		}
		d, err := inst[1].Allow(ctx, "api", "k")
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted = append(admitted, now)
			if n := len(admitted); n >= 4 && now.Sub(admitted[n-4]) <= 2*time.Second {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}
