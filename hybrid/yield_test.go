package hybrid_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// TestYieldGivesTheAskerTheRate: one key used on one instance of four, at
// twice the limit. The others never see the key; asked to yield, they give
// up their default shares, so the one instance soon leases the whole rate.
func TestYieldGivesTheAskerTheRate(t *testing.T) {
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: 200, Burst: 20, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	inst := cluster(t, srv, 4, nil, lim)
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

// TestExactBurstsAdmitAFreshBurstWhole: with exact bursts a client's burst
// of up to Burst requests on a fresh key is admitted whole, on whichever
// instance it lands, and not one request more; with split bursts (the
// default) the same burst is cut at that instance's part of the burst.
func TestExactBurstsAdmitAFreshBurstWhole(t *testing.T) {
	srv := redistest.Start(t)
	exactLim := hybrid.Limit{Name: "exact", Rate: 25, Burst: 40, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal, ExactBursts: true}
	splitLim := hybrid.Limit{Name: "split", Rate: 25, Burst: 40, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	inst := cluster(t, srv, 4, nil, exactLim, splitLim)
	ctx := context.Background()
	burst := func(l *hybrid.Limiter, limit, key string) (admitted int) {
		for range 41 {
			d, err := l.Allow(ctx, limit, key)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		return admitted
	}
	for i, l := range inst {
		key := fmt.Sprint("fresh-", i)
		if got := burst(l, "exact", key); got != 40 {
			t.Errorf("exact bursts, instance %d: %d of a burst of 41 admitted; want the whole burst of 40", i, got)
		}
		if got := burst(l, "split", key); got != 10 {
			t.Errorf("split bursts, instance %d: %d of a burst of 41 admitted; want its part of the burst, 10", i, got)
		}
	}
}

// TestExactDenialIsCached: an exact decision that Redis denied with "none
// until t" is repeated in process until t, with no Redis command (the deny
// cache of DESIGN.md's exact placement), and asked again after t.
func TestExactDenialIsCached(t *testing.T) {
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: 2, Burst: 1, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal, ExactBursts: true}
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
	if d, err := l.Allow(ctx, "api", "k"); err != nil || !d.Allowed || d.Source != hybrid.SourceGlobal {
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
		if d, err := l.Allow(ctx, "api", "k"); err != nil || d.Allowed || d.Source != hybrid.SourceGlobal {
			t.Fatalf("decision %d within the hold: %+v, %v; want an exact denial", n, d, err)
		}
		n++
	}
	if got := commands() - before; got != 0 || n < 10 {
		t.Fatalf("%d decisions within the hold sent %d Redis commands; want them decided in process", n, got)
	}
	eventually(t, time.Second, "an exact admission once the hold has ended", func() bool {
		d, err := l.Allow(ctx, "api", "k")
		return err == nil && d.Allowed && d.Source == hybrid.SourceGlobal
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
	lim := hybrid.Limit{Name: "api", Rate: 100, Burst: 4, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal, ExactBursts: true}
	const contendedTTL = 2 * time.Second
	inst := cluster(t, srv, 2, func(c *hybrid.Config) { c.ContendedTTL = contendedTTL }, lim)
	ctx := context.Background()
	// Instance 0 wants about nine times the limit: it leaves the exact
	// placement for a lease of the whole rate (with exact bursts Redis
	// counts an instance without a record at nothing).
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
	if err != nil || d.Allowed || d.Source != hybrid.SourceGlobal || d.RetryAfter != contendedTTL/2 {
		t.Fatalf("instance 1's first decision: %+v, %v; want an exact denial, retry after %v", d, err, contendedTTL/2)
	}
	if got := commands() - before; got != 1 {
		t.Fatalf("instance 1's first decision sent %d Redis commands; want the one take", got)
	}
	// At under 200/s, four times instance 1's default share: what would
	// make the key heavy enough here to leave the exact placement for a
	// lease, as a heavier one rightly does (at 1 000/s it did so within
	// the hold now and then, and was decided by its lease).
	n := 0
	for time.Since(start) < contendedTTL/2-200*time.Millisecond {
		if d, err := inst[1].Allow(ctx, "api", "k"); err != nil || d.Allowed || d.Source != hybrid.SourceGlobal {
			t.Fatalf("decision %d within the hold: %+v, %v; want an exact denial", n, d, err)
		}
		n++
		time.Sleep(5 * time.Millisecond)
	}
	// Only the loop's commands, if any: the lease of a key that is not
	// exact here. None is a take.
	if got := commands() - before - 1; n < 100 || got > 2 {
		t.Fatalf("%d decisions within the hold sent %d Redis commands; want them decided in process", n, got)
	}
}

// TestExactHoldCarriesDemand: with exact bursts, Redis counts an exact
// user at the demand its takes show (the leases leave it that much of the
// pool from their next renewals). Requests its deny cache denies in
// process are not takes, so the take that follows the hold carries them:
// the demand it records is at least what they asked for, decayed from the
// first of them. Without that, an exact user held while the leases took
// the whole rate showed Redis one request per hold, and waited seconds
// for the share it wanted.
func TestExactHoldCarriesDemand(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const rate = 100
	lim := hybrid.Limit{Name: "api", Rate: rate, Burst: 4, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal, ExactBursts: true}
	const contendedTTL = 2 * time.Second
	l := newLimiter(t, hybrid.Config{Redis: fastClient(t, srv), Members: membership.NewStatic("instance-0", 2),
		Limits: []hybrid.Limit{lim}, ContendedTTL: contendedTTL})
	ctx := context.Background()
	// The other instance leases the whole rate: with exact bursts Redis
	// counts an instance without a record at nothing.
	store := global.New(rdb, "hybridlimit")
	g := make([]global.Lease, 1)
	err := store.Lease(ctx, []global.LeaseRequest{{Limit: "api", Key: "k", Instance: "other", Want: rate, Rate: rate,
		Burst: lim.Burst, WantBurst: float64(lim.Burst), Instances: 2, TTL: time.Minute, MaxTTL: time.Minute, ExactBursts: true}}, g)
	if err != nil || g[0].Err != nil || g[0].Granted < rate || g[0].Burst < float64(lim.Burst) {
		t.Fatalf("the other instance's lease: %+v, %v; want the whole rate and burst", g[0], err)
	}
	if d, err := l.Allow(ctx, "api", "k"); err != nil || d.Allowed || d.RetryAfter != contendedTTL/2 {
		t.Fatalf("the first decision: %+v, %v; want an exact denial, retry after %v", d, err, contendedTTL/2)
	}
	// record reads this instance's exact record: its demand and when it
	// was measured (us).
	record := func() (demand float64, at int64) {
		t.Helper()
		fields, err := rdb.HGetAll(ctx, store.LeaseKey("api", "k")).Result()
		if err != nil {
			t.Fatal(err)
		}
		for f, v := range fields {
			if rest, ok := strings.CutPrefix(f, "x:"); ok && rest != "other" {
				// "expiry_us clean_us demand demand_us"
				if p := strings.Fields(v); len(p) == 4 {
					demand, _ = strconv.ParseFloat(p[2], 64)
					at, _ = strconv.ParseInt(p[3], 10, 64)
					return demand, at
				}
			}
		}
		t.Fatalf("no exact record of this instance: %v", fields)
		return 0, 0
	}
	_, at0 := record()
	// Requests at 100/s, twice the default share and half of what would
	// make the key heavy enough for a lease here (a default share's part
	// of a burst of 4, 2 tokens, is too small for a steady key to leave
	// the exact placement), until one is a take: the record changes.
	first := time.Now()
	held := 0
	for {
		if time.Since(first) > 5*contendedTTL {
			t.Fatalf("no take within %v of the hold", 5*contendedTTL)
		}
		if _, err := l.Allow(ctx, "api", "k"); err != nil {
			t.Fatal(err)
		}
		if _, at := record(); at != at0 {
			break // this one was the take
		}
		held++
		time.Sleep(10 * time.Millisecond)
	}
	age := time.Since(first)
	demand, _ := record()
	// Each held request counts at least e^(-age/DemandTau).
	if least := float64(held) * math.Exp(-float64(age)/float64(global.DemandTau)); held < 20 || demand < least {
		t.Fatalf("after %d requests held over %v, the exact user's recorded demand is %v; want at least %.1f",
			held, age.Round(time.Millisecond), demand, least)
	}
}

// TestExactYieldedKeyGetsItsShare: with exact bursts, an instance asked to
// yield a key before its first request there yields all of it (it knows
// no key of that name), and then decides the key exactly, where nothing
// denies it for its own share: once its demand shows it wants more than
// it kept, it becomes an exact user, Redis counts it at that demand, and
// the peer that leased the whole rate leaves it its fair share. Before, it
// stayed at the nothing it kept, its takes denied one by one for good.
// The step table TestEngineExactYieldedKeyOutgrows holds the rule; this
// is the same end to end.
func TestExactYieldedKeyGetsItsShare(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	lim := hybrid.Limit{Name: "api", Rate: 10, Burst: 4, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal, ExactBursts: true}
	inst := cluster(t, srv, 2, func(c *hybrid.Config) { c.ContendedTTL = 2 * time.Second }, lim)
	ctx := context.Background()
	// Instance 0 wants 20 times the limit from now to the end: it leases
	// the whole rate and asks its peer to yield, which yields all of k.
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
	eventually(t, 10*time.Second, "instance 0 leasing the whole rate, instance 1 yielding all of k", func() bool {
		recs := leaseRecords(t, rdb, "api", "k")
		y, yielded := recs["instance-1"]
		return recs["instance-0"].granted >= 0.99*lim.Rate && yielded && y.granted == 0
	})
	// Instance 1 now wants 20/s, four times its default share (5/s) and
	// below what would make it heavy enough for a lease: its fair share
	// is 5/s. Within 10 s it gets at least 2/s over a 2 s stretch.
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

// TestExactCredit: with exact bursts, an allowed exact decision may bring
// credit, tokens of the key's pool handed ahead of the next requests and
// admitted in process, only while the pool stays at least half full. A
// burst of Burst requests is still admitted whole, and not one request
// more, with fewer Redis commands than decisions.
func TestExactCredit(t *testing.T) {
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: 0.01, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal, ExactBursts: true}
	// A slow loop: its first tick comes after the test, so the key stays
	// in the exact placement.
	l := newLimiter(t, hybrid.Config{Redis: srv.Client(t), Members: membership.NewStatic("only", 1), Limits: []hybrid.Limit{lim},
		Tick: 5 * time.Second, ContendedTTL: 11 * time.Second, UncontendedTTL: 11 * time.Second, RedisTimeout: time.Second})
	ctx := context.Background()
	admitted := 0
	for range 11 {
		d, err := l.Allow(ctx, "api", "k")
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	st, err := l.Status("api")
	if err != nil {
		t.Fatal(err)
	}
	// The first take leaves 9 and hands 4 (the pool keeps 5); the next 4
	// are credit; the other 5 are one take each, the last of which empties
	// the pool and so holds the key until its turn: the denial is decided
	// in process.
	if admitted != 10 || st.RedisCommands != 6 {
		t.Fatalf("a burst of 11: %d admitted with %d Redis commands; want the burst of 10 with 6", admitted, st.RedisCommands)
	}
}
