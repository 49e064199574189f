package global_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// poolStep is one call of a sequence on one key: a lease (want, yield) or,
// if exact, a TakeExact of n tokens giving give; and what it must return.
type poolStep struct {
	inst        string
	exact       bool
	want        float64 // lease: the want
	yield       bool    // lease: Yield
	n           int     // exact: tokens to take
	give        float64 // exact: Give
	exactBursts bool    // exact: ExactBursts
	granted     float64 // lease: the grant
	allowed     bool    // exact
	remaining   int64   // exact
	// retry, for an exact denial: the most RetryAfter may be, or
	// global.Never.
	retry               time.Duration
	poolRate, poolBurst float64 // exact
}

// TestTakeExact runs sequences of leases and exact takes on fresh keys. The
// rates are slow enough that the pool never refills a whole token while a
// sequence runs.
func TestTakeExact(t *testing.T) {
	tests := []struct {
		name  string
		rate  float64
		burst int
		n     int // N-hat
		steps []poolStep
	}{
		{"all instances exact: the whole rate and burst", 0.3, 9, 3, []poolStep{
			// a alone: b and c unrecorded hold 0.1 each.
			{inst: "a", exact: true, allowed: true, poolRate: 0.1, poolBurst: 3},
			{inst: "b", exact: true, allowed: true, poolRate: 0.2, poolBurst: 6},
			{inst: "c", exact: true, give: 9, n: 9, allowed: true, poolRate: 0.3, poolBurst: 9},
		}},
		{"one lease holding half: half the pool", 0.2, 10, 2, []poolStep{
			// a's lease, b unrecorded at 0.1: contended, 0.1.
			{inst: "a", want: 0.2, granted: 0.1},
			{inst: "b", exact: true, n: 1, give: 5, allowed: true, remaining: 4, poolRate: 0.1, poolBurst: 5},
			// b's exact record counts 0.1: a gets no more.
			{inst: "a", want: 0.2, granted: 0.1},
		}},
		{"exact bursts: a fresh key admits the burst at once", 0.1, 8, 4, []poolStep{
			{inst: "a", exact: true, exactBursts: true, n: 8, allowed: true, remaining: 0, poolRate: 0.1, poolBurst: 8},
			{inst: "a", exact: true, exactBursts: true, n: 1, retry: 10 * time.Second, poolRate: 0.1, poolBurst: 8},
		}},
		{"split: a fresh pool starts at Give", 0.4, 8, 4, []poolStep{
			// Three unrecorded at 0.1: the pool is 0.1 and 2 tokens.
			{inst: "a", exact: true, give: 2, allowed: true, remaining: 2, poolRate: 0.1, poolBurst: 2},
			// Give counts only when the record is created.
			{inst: "a", exact: true, give: 2, n: 2, allowed: true, remaining: 0, poolRate: 0.1, poolBurst: 2},
			{inst: "a", exact: true, n: 1, retry: 10 * time.Second, poolRate: 0.1, poolBurst: 2},
			{inst: "a", exact: true, n: 3, retry: global.Never, poolRate: 0.1, poolBurst: 2},
		}},
		{"split: give is capped at the pool's burst", 0.4, 8, 4, []poolStep{
			{inst: "a", exact: true, give: 5, allowed: true, remaining: 2, poolRate: 0.1, poolBurst: 2},
		}},
		{"split, burst 5 over 4: the unrecorded hold the remainder", 0.4, 5, 4, []poolStep{
			// The default bursts are 2, 1, 1, 1: three unrecorded may hold
			// 4 of them (1.25 would be 5/4 each), and the pool 1.
			{inst: "a", exact: true, give: 2, allowed: true, remaining: 1, poolRate: 0.1, poolBurst: 1},
			// Two unrecorded may hold 3: the pool 2, not 2.5.
			{inst: "b", exact: true, poolRate: 0.2, allowed: true, remaining: 1, poolBurst: 2},
			// One may hold 2: the pool 3, not 3.75.
			{inst: "c", exact: true, poolRate: 0.3, allowed: true, remaining: 1, poolBurst: 3},
			// Everyone exact: the whole burst.
			{inst: "d", exact: true, give: 5, allowed: true, remaining: 5, poolRate: 0.4, poolBurst: 5},
		}},
		{"split, burst 2 over 4: the unrecorded hold the remainder", 0.4, 2, 4, []poolStep{
			// The default bursts are 1, 1, 0, 0: three unrecorded hold 2,
			// the pool nothing (0.5 by proportion).
			{inst: "a", exact: true, give: 1, allowed: true, poolRate: 0.1, poolBurst: 0},
			{inst: "b", exact: true, poolRate: 0.2, allowed: true, poolBurst: 0},
			// One unrecorded holds 1: the pool 1, not 1.5.
			{inst: "c", exact: true, give: 1, poolRate: 0.3, allowed: true, remaining: 1, poolBurst: 1},
		}},
		{"a pool of rate 0 never admits", 1, 10, 1, []poolStep{
			{inst: "a", want: 1, granted: 1},
			{inst: "b", exact: true, n: 1, retry: global.Never},
		}},
		{"an exact user drops its lease", 1, 10, 2, []poolStep{
			{inst: "a", want: 1, granted: 0.5},
			{inst: "a", exact: true, give: 5, n: 1, allowed: true, remaining: 4, poolRate: 0.5, poolBurst: 5},
			// a's lease is gone, it is counted at its default share: b,
			// alone, gets the other half.
			{inst: "b", want: 1, granted: 0.5},
		}},
	}
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, s := range tt.steps {
				if !s.exact {
					got := lease(t, store, global.LeaseRequest{Limit: "exact", Key: tt.name, Instance: s.inst,
						Want: s.want, Yield: s.yield, Rate: tt.rate, Instances: tt.n, TTL: 10 * time.Second})
					if !approx(got.Granted, s.granted) {
						t.Errorf("step %d: lease %+v, want granted %v", i, got, s.granted)
					}
					continue
				}
				got, err := store.TakeExact(ctx, global.ExactRequest{Limit: "exact", Key: tt.name, Instance: s.inst,
					Rate: tt.rate, Burst: tt.burst, Instances: tt.n, N: s.n, TTL: 10 * time.Second,
					Give: s.give, ExactBursts: s.exactBursts})
				if err != nil {
					t.Fatalf("step %d: TakeExact: %v", i, err)
				}
				if got.Allowed != s.allowed || got.Remaining != s.remaining ||
					!approx(got.PoolRate, s.poolRate) || !approx(got.PoolBurst, s.poolBurst) {
					t.Errorf("step %d: %+v, want allowed %v, remaining %d, pool %v/s of %v", i, got, s.allowed, s.remaining, s.poolRate, s.poolBurst)
				}
				switch {
				case got.Allowed && got.RetryAfter != 0:
					t.Errorf("step %d: allowed with RetryAfter %v", i, got.RetryAfter)
				case !got.Allowed && s.retry == global.Never && got.RetryAfter != global.Never:
					t.Errorf("step %d: RetryAfter %v, want Never", i, got.RetryAfter)
				case !got.Allowed && s.retry != global.Never && (got.RetryAfter <= 0 || got.RetryAfter > s.retry):
					t.Errorf("step %d: RetryAfter %v, want in (0, %v]", i, got.RetryAfter, s.retry)
				}
			}
		})
	}
}

// TestTakeExactRecords: a take replaces the caller's lease with an exact
// record, refreshed on every take; Release removes it; the hash lives
// until the pool would be full again.
func TestTakeExactRecords(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	key := store.LeaseKey("rec", "k")
	lease(t, store, global.LeaseRequest{Limit: "rec", Key: "k", Instance: "a", Want: 1, Rate: 1, Instances: 2, TTL: time.Second})
	req := global.ExactRequest{Limit: "rec", Key: "k", Instance: "a", Rate: 1, Burst: 100, Instances: 2, N: 0, TTL: time.Second}
	if _, err := store.TakeExact(ctx, req); err != nil {
		t.Fatal(err)
	}
	h, err := readHash(rdb, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := h.leases["a"]; ok || h.exact["a"] <= h.now || h.exact["a"] > h.now+1_000_000 || h.pool == "" {
		t.Fatalf("after a's take: %+v; want no lease, an exact record for 1s and a pool", h)
	}
	// The pool, 0.5 tokens/s and empty, is full again in 100s.
	if pttl, err := rdb.PTTL(ctx, key).Result(); err != nil || pttl < 99*time.Second || pttl > 100*time.Second {
		t.Errorf("PTTL %v, %v; want 100s, until the pool is full", pttl, err)
	}
	if err := store.Release(ctx, []global.LeaseRequest{{Limit: "rec", Key: "k", Instance: "a"}}); err != nil {
		t.Fatal(err)
	}
	if h, err := readHash(rdb, key); err != nil || len(h.exact) != 0 || len(h.leases) != 0 {
		t.Fatalf("after the release: %+v, %v; want no record", h, err)
	}
	// A lease keeps the pool until it would be full.
	lease(t, store, global.LeaseRequest{Limit: "rec", Key: "k", Instance: "b", Want: 1, Rate: 1, Instances: 2, TTL: time.Second})
	if pttl, err := rdb.PTTL(ctx, key).Result(); err != nil || pttl < 98*time.Second {
		t.Errorf("PTTL after a lease %v, %v; want the pool's 100s kept", pttl, err)
	}
}

// TestTakeExactKeepLease: an exact user moving to a lease keeps deciding
// exactly until its grant is in force (make before break). Its lease
// request turns its exact record into a lease record in one step; a take
// with KeepLease that lands after it (one sent before it, or one made
// while the answer is on its way) keeps that lease and counts it, writes
// no exact record, and takes from what all the leases leave. Without it,
// the take would drop the lease and count the instance at its default
// share while it is about to run a larger grant: another instance would be
// granted the difference.
func TestTakeExactKeepLease(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	const rate, burst, n = 1.0, 10, 2
	for _, exactBursts := range []bool{true, false} {
		t.Run(fmt.Sprintf("exactBursts=%v", exactBursts), func(t *testing.T) {
			k := fmt.Sprintf("k%v", exactBursts)
			key := store.LeaseKey("keep", k)
			take := func(inst string, keep bool) global.Take {
				t.Helper()
				got, err := store.TakeExact(ctx, global.ExactRequest{Limit: "keep", Key: k, Instance: inst, Rate: rate,
					Burst: burst, Instances: n, N: 1, TTL: 10 * time.Second, Give: 5, ExactBursts: exactBursts, KeepLease: keep})
				if err != nil {
					t.Fatal(err)
				}
				return got
			}
			req := func(inst string, want float64) global.LeaseRequest {
				return global.LeaseRequest{Limit: "keep", Key: k, Instance: inst, Want: want, Rate: rate,
					Instances: n, TTL: 10 * time.Second, MaxTTL: 10 * time.Second, ExactBursts: exactBursts}
			}
			// b gives its default share up (with split bursts it is
			// counted at it otherwise); a decides exactly, then asks for a
			// lease: its exact record becomes a lease record.
			y := req("b", 0)
			y.Yield = true
			lease(t, store, y)
			take("a", true)
			g := lease(t, store, req("a", 0.9)).Granted
			if h, err := readHash(rdb, key); err != nil || h.exact["a"] != 0 || h.leases["a"].granted != g {
				t.Fatalf("after a's lease: %+v, %v; want a's lease %v and no exact record", h, err, g)
			}
			if g <= rate/n {
				t.Fatalf("a is granted %v; the test needs more than the default share %v", g, rate/n)
			}
			// A take of a's lands after the lease request.
			got := take("a", true)
			if !approx(got.PoolRate, rate-g) {
				t.Errorf("a's take after its lease: pool %v/s; want %v, what a's lease leaves", got.PoolRate, rate-g)
			}
			h, err := readHash(rdb, key)
			if err != nil || h.exact["a"] != 0 || h.leases["a"].granted != g {
				t.Fatalf("after a's take: %+v, %v; want a's lease %v kept and no exact record", h, err, g)
			}
			// a's lease still counts: b gets what it leaves, no more.
			if b := lease(t, store, req("b", rate)).Granted; b > rate-g+1e-9 {
				t.Errorf("b is granted %v beside a's %v: above the rate %v", b, g, rate)
			}
			// Once a's lease is released, a take records a as exact again.
			lease(t, store, req("a", 0))
			take("a", true)
			if h, err := readHash(rdb, key); err != nil || h.exact["a"] == 0 {
				t.Fatalf("after a's release and take: %+v, %v; want an exact record of a", h, err)
			}
		})
	}
}

// TestTakeExactCredit: an allowed take may hand its instance credit,
// tokens beyond N that it admits locally, only from a pool that stays at
// least half full; the pool then holds at most its burst less the live
// credits, so that the pool and every credit together never hold more than
// the burst. Credit given back returns to the pool; credit that ends is
// gone, and the pool may fill up to its whole burst again.
func TestTakeExactCredit(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	// So slow that no whole token refills while the test runs.
	const rate, burst, n = 0.001, 10, 4
	take := func(k, inst string, tokens, credit, ret int, ttl time.Duration) global.Take {
		t.Helper()
		got, err := store.TakeExact(ctx, global.ExactRequest{Limit: "credit", Key: k, Instance: inst, Rate: rate, Burst: burst,
			Instances: n, N: tokens, TTL: 10 * time.Second, ExactBursts: true, Credit: credit, Return: ret, CreditTTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	type row struct {
		inst              string
		n, credit, ret    int
		allowed           bool
		remaining, handed int64
	}
	for _, tt := range []struct {
		name string
		rows []row
	}{
		{"credit only from a pool at least half full", []row{
			{inst: "a", n: 1, credit: 3, allowed: true, remaining: 6, handed: 3},
			// a holds 3: b's take leaves 5 of the 7 the pool may hold, none to spare.
			{inst: "b", n: 1, credit: 3, allowed: true, remaining: 5},
			{inst: "b", n: 5, allowed: true, remaining: 0},
			// The pool holds nothing: a's credit is all that is left of the burst.
			{inst: "c", n: 1, credit: 3},
			// a gives its 3 back and takes one of them.
			{inst: "a", n: 1, ret: 3, allowed: true, remaining: 2},
			{inst: "c", n: 2, allowed: true, remaining: 0},
		}},
		{"a credit larger than the spare half is cut", []row{
			{inst: "a", n: 2, credit: 9, allowed: true, remaining: 5, handed: 3},
			// A denial hands nothing.
			{inst: "b", n: 6, credit: 9, remaining: 5},
		}},
		{"no credit from a pool at half or below", []row{
			{inst: "a", n: 5, credit: 3, allowed: true, remaining: 5},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			total := 0
			for i, r := range tt.rows {
				got := take(tt.name, r.inst, r.n, r.credit, r.ret, 10*time.Second)
				if got.Allowed != r.allowed || got.Remaining != r.remaining || int64(got.Credit) != r.handed {
					t.Errorf("row %d %+v: %+v; want allowed %v, remaining %d, credit %d", i, r, got, r.allowed, r.remaining, r.handed)
				}
				if got.Allowed {
					total += r.n + got.Credit - r.ret
				}
			}
			if total > burst {
				t.Errorf("the takes and the credits hold %d tokens; want at most the burst %d", total, burst)
			}
		})
	}

	t.Run("a credit ends", func(t *testing.T) {
		if got := take("ends", "a", 1, 4, 0, 100*time.Millisecond); got.Credit != 4 || got.Remaining != 5 {
			t.Fatalf("a's take: %+v; want credit 4, 5 left", got)
		}
		key := store.LeaseKey("credit", "ends")
		if h, err := readHash(rdb, key); err != nil || h.credit["a"] == "" {
			t.Fatalf("after a's take: %+v, %v; want a's credit recorded", h, err)
		}
		// While a's credit lives the pool may hold 6; once it ends, all 10
		// (but the 4 are gone: nobody gave them back).
		if got := take("ends", "b", 0, 0, 0, 0); got.Remaining != 5 {
			t.Fatalf("b's look: %+v; want 5 left", got)
		}
		// Ended, the credit is dropped at the next call.
		eventually(t, "a's credit to end", func() bool {
			take("ends", "b", 0, 0, 0, 0)
			h, err := readHash(rdb, key)
			return err == nil && h.credit["a"] == ""
		})
	})
}

// TestTakeExactDenialsTakeTurns: denied takes are told successive tokens,
// not all the same next one, so that their instances do not all come back
// for it (every denial a script); the take that emptied the pool has the
// first turn; and no turn is later than the pool's burst allows.
func TestTakeExactDenialsTakeTurns(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	ctx := context.Background()
	take := func(inst string, n int) global.Take {
		t.Helper()
		got, err := store.TakeExact(ctx, global.ExactRequest{Limit: "turns", Key: "k", Instance: inst, Rate: 1, Burst: 3,
			Instances: 4, N: n, TTL: 10 * time.Second, ExactBursts: true})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := take("a", 3); !got.Allowed {
		t.Fatalf("a's burst: %+v", got)
	}
	// One token a second: a, which emptied the pool, has the first turn, b
	// the second, c the third; d and e, too, the third: turns stop when the
	// pool would be full (it holds 3), so that no token is lost while every
	// caller waits.
	for _, tt := range []struct {
		inst string
		turn time.Duration
	}{{"b", 2 * time.Second}, {"c", 3 * time.Second}, {"d", 3 * time.Second}, {"e", 3 * time.Second}} {
		got := take(tt.inst, 1)
		if got.Allowed || got.RetryAfter > tt.turn || got.RetryAfter < tt.turn-100*time.Millisecond {
			t.Errorf("%s: %+v; want a denial with RetryAfter just under %v", tt.inst, got, tt.turn)
		}
	}
}

func TestTakeExactInvalid(t *testing.T) {
	ok := global.ExactRequest{Limit: "l", Key: "k", Instance: "a", Rate: 10, Burst: 5, Instances: 2, N: 1, TTL: time.Second}
	tests := []struct {
		name string
		edit func(*global.ExactRequest)
	}{
		{"empty instance", func(r *global.ExactRequest) { r.Instance = "" }},
		{"NaN rate", func(r *global.ExactRequest) { r.Rate = nan() }},
		{"infinite rate", func(r *global.ExactRequest) { r.Rate = inf() }},
		{"negative rate", func(r *global.ExactRequest) { r.Rate = -1 }},
		{"negative burst", func(r *global.ExactRequest) { r.Burst = -1 }},
		{"zero instances", func(r *global.ExactRequest) { r.Instances = 0 }},
		{"negative n", func(r *global.ExactRequest) { r.N = -1 }},
		{"zero ttl", func(r *global.ExactRequest) { r.TTL = 0 }},
		{"ttl below a microsecond", func(r *global.ExactRequest) { r.TTL = time.Nanosecond }},
		{"NaN give", func(r *global.ExactRequest) { r.Give = nan() }},
		{"negative give", func(r *global.ExactRequest) { r.Give = -1 }},
		{"NaN held", func(r *global.ExactRequest) { r.Held = nan() }},
		{"infinite held", func(r *global.ExactRequest) { r.Held = inf() }},
		{"negative held", func(r *global.ExactRequest) { r.Held = -1 }},
		{"held above MaxHeld", func(r *global.ExactRequest) { r.Held = 2 * global.MaxHeld }},
	}
	store := global.New(noNetwork{}, "") // any network call panics
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ok
			tt.edit(&r)
			if _, err := store.TakeExact(context.Background(), r); !errors.Is(err, global.ErrInvalid) {
				t.Errorf("TakeExact(%+v) error = %v, want ErrInvalid", r, err)
			}
		})
	}
}

func TestTakeExactNoScript(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	ctx := context.Background()
	for i := range 3 {
		srv.ScriptFlush(t)
		got, err := store.TakeExact(ctx, global.ExactRequest{Limit: "ns", Key: "k", Instance: "a", Rate: 0.01, Burst: 5,
			Instances: 1, N: 1, TTL: time.Minute, ExactBursts: true})
		if err != nil || !got.Allowed || got.Remaining != int64(4-i) {
			t.Fatalf("TakeExact after SCRIPT FLUSH = %+v, %v; want allowed, remaining %d", got, err, 4-i)
		}
	}
	if st := srv.CommandStats(t); st["eval"] != 3 {
		t.Errorf("EVAL calls = %d, want 3 (one fallback per flush)", st["eval"])
	}
	if _, err := store.TakeExact(ctx, global.ExactRequest{Limit: "ns", Key: fmt.Sprint("k", 1), Instance: "a", Rate: 1, Burst: 1, Instances: 1, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
}

// TestTakeExactTurns: exact users denied one after another are told to come
// back one refill apart, in the order they were denied, rather than all
// when the next token is there; each that comes back at its turn is
// admitted; and no turn is handed out more than N-hat refills ahead.
func TestTakeExactTurns(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	ctx := context.Background()
	// A token every 50 ms. A burst of 4 keeps the tokens that refill while
	// a caller that came back late takes its own: at burst 1 that lateness
	// would shift every later turn.
	const rate, burst, n = 20.0, 4, 4
	step := time.Duration(float64(time.Second) / rate)
	takeN := func(inst string, tokens int) global.Take {
		t.Helper()
		got, err := store.TakeExact(ctx, global.ExactRequest{Limit: "turns", Key: "k", Instance: inst,
			Rate: rate, Burst: burst, Instances: n, N: tokens, TTL: 10 * time.Second, ExactBursts: true})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	take := func(inst string) global.Take { t.Helper(); return takeN(inst, 1) }
	if got := takeN("a", burst); !got.Allowed {
		t.Fatalf("the first take empties a full pool: %+v", got)
	}
	insts := []string{"b", "c", "d"}
	at := map[string]time.Time{}
	var last time.Duration
	for i, inst := range insts {
		got := take(inst)
		if got.Allowed {
			t.Fatalf("%s: admitted from an empty pool: %+v", inst, got)
		}
		// Each turn is a refill after the one before, give or take the
		// time between the calls.
		if i > 0 && (got.RetryAfter < last+step/2 || got.RetryAfter > last+step+step/2) {
			t.Errorf("%s: RetryAfter %v after %v: want the next turn, about %v later", inst, got.RetryAfter, last, step)
		}
		last = got.RetryAfter
		at[inst] = time.Now().Add(got.RetryAfter)
	}
	// More denials than instances: the turns stop N-hat refills ahead.
	for range 3 * n {
		if got := take("e"); got.Allowed || got.RetryAfter > time.Duration(n+1)*step {
			t.Fatalf("e: %+v: want a denial within %d refills", got, n+1)
		}
	}
	for _, inst := range insts {
		time.Sleep(time.Until(at[inst])) // its turn: the time Redis named
		if got := take(inst); !got.Allowed {
			t.Errorf("%s came back at its turn and was denied: %+v", inst, got)
		}
	}
}

// TestLeaseDrainsThePool: an exact user that takes a lease with Drain moves
// the grant's part of the burst from the key's pool to itself (what the
// pool held for its traffic, as last stored): the pool keeps the rest, and
// no token is made. Without Drain nothing moves.
func TestLeaseDrainsThePool(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	const rate, burst = 0.01, 40 // no refill to speak of while the test runs
	poolOf := func(key string) float64 {
		t.Helper()
		h, err := readHash(rdb, store.LeaseKey("drain", key))
		if err != nil {
			t.Fatal(err)
		}
		var tokens float64
		var at int64
		if _, err := fmt.Sscanf(h.pool, "%g %d", &tokens, &at); err != nil {
			t.Fatalf("pool %q: %v", h.pool, err)
		}
		return tokens
	}
	for _, tc := range []struct {
		key   string
		want  float64 // of a rate of 0.01
		drain int
	}{
		// Alone with exact bursts, a takes 1 of the full pool of 40, then
		// leases: the grant's part of the burst moves, up to the 39 left.
		{"part", rate / 2, burst},
		{"whole", rate, burst},
		// No drain: the pool keeps its 39.
		{"none", rate, 0},
	} {
		t.Run(tc.key, func(t *testing.T) {
			if _, err := store.TakeExact(ctx, global.ExactRequest{Limit: "drain", Key: tc.key, Instance: "a",
				Rate: rate, Burst: burst, Instances: 2, N: 1, TTL: 10 * time.Second, ExactBursts: true}); err != nil {
				t.Fatal(err)
			}
			got := lease(t, store, global.LeaseRequest{Limit: "drain", Key: tc.key, Instance: "a", Want: tc.want,
				Rate: rate, Instances: 2, TTL: 10 * time.Second, ExactBursts: true, Drain: tc.drain})
			want := min(39, int(math.Floor(float64(tc.drain)*got.Granted/rate+1e-9)))
			if got.Granted <= 0 || got.Drained != want {
				t.Errorf("lease %+v: want a grant, and %d drained (the grant's part of %d, at most the 39 left)", got, want, tc.drain)
			}
			if p := poolOf(tc.key); math.Abs(p-float64(39-want)) > 0.01 {
				t.Errorf("pool holds %v after the lease, want %d", p, 39-want)
			}
		})
	}
}

// TestLeaseBurstCountedApart: with the burst counted apart from the rate
// (LeaseRequest.Burst), an instance light on a key's rate keeps its
// default part of the burst, more than its rate's part; Redis counts that
// part against the others' grants and the pool's burst, and the parts
// never sum to more than the burst.
func TestLeaseBurstCountedApart(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	const rate, burst, n, ttl = 100.0, 40, 4, 10 * time.Second
	req := func(inst string, want, wantB float64) global.LeaseRequest {
		// Each asks from its default share, 25/s with 10 tokens.
		return global.LeaseRequest{Limit: "parts", Key: "k", Instance: inst, Want: want, Rate: rate,
			Instances: n, TTL: ttl, Running: rate / n, RunningFor: time.Microsecond,
			Burst: burst, WantBurst: wantB, RunningBurst: burst / n}
	}
	// a is heavy and asks for the whole burst: the unrecorded three hold
	// 10 each, so it gets the rest, 10.
	if got := lease(t, store, req("a", 200, burst)); got.Granted != 25 || got.Burst != 10 {
		t.Fatalf("a: %+v, want 25/s with 10 tokens", got)
	}
	// b is light (10/s) and keeps its default part, 10 tokens, where its
	// rate's part would be 4.
	if got := lease(t, store, req("b", 10, burst/n)); got.Granted != 10 || got.Burst != 10 {
		t.Fatalf("b: %+v, want 10/s with 10 tokens", got)
	}
	// c goes exact: the pool holds what a, b and the unrecorded d do not,
	// 40 - 10 - 10 - 10 = 10 tokens; with parts in proportion to the
	// rates it would be 40 - 10 - 4 - 10 = 16.
	take, err := store.TakeExact(ctx, global.ExactRequest{Limit: "parts", Key: "k", Instance: "c",
		Rate: rate, Burst: burst, Instances: n, N: 1, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(take.PoolBurst-10) > 1e-9 {
		t.Errorf("pool burst %v, want 10", take.PoolBurst)
	}
	// d asks for the whole burst: a, b and c's pool hold 30, so it gets
	// 10 at most, whatever it asks.
	if got := lease(t, store, req("d", 200, burst)); got.Burst > 10+1e-9 {
		t.Errorf("d: %+v, want at most 10 tokens", got)
	}
	// A request without the burst gets none apart.
	if got := lease(t, store, global.LeaseRequest{Limit: "parts", Key: "other", Instance: "a", Want: 10,
		Rate: rate, Instances: n, TTL: ttl}); got.Burst != -1 {
		t.Errorf("without the burst: %+v, want Burst -1", got)
	}
}

// TestLeaseBurstLeavesTheRemainder: a lease's part of the burst leaves the
// unrecorded instances the burst's remainder their ranks may give them.
// Burst 10 over 4 instances: default parts 3, 3, 2, 2, which Redis counts
// as 2.5 each, less than the three unrecorded may hold (8, not 7.5), so an
// instance that asks for the whole burst gets 2. Burst 8 splits evenly:
// the three hold 6, and it gets 2 as well.
func TestLeaseBurstLeavesTheRemainder(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	for _, tc := range []struct {
		burst int
		want  float64
	}{{10, 2}, {8, 2}} {
		got := lease(t, store, global.LeaseRequest{Limit: "rem", Key: fmt.Sprint(tc.burst), Instance: "a", Want: 100,
			Rate: 100, Instances: 4, TTL: time.Second, Burst: tc.burst, WantBurst: float64(tc.burst)})
		if math.Abs(got.Burst-tc.want) > 1e-9 {
			t.Errorf("burst %d: %+v, want a part of %v", tc.burst, got, tc.want)
		}
	}
}

// TestReleaseWaitsOutLowerLeasesThroughExact: an instance counted below its
// default share while another was granted the difference may run that
// share again only once that grant has ended, and an exact record it takes
// meanwhile does not shorten the wait: the exact record counts it at its
// share from then on, not before. Once as a key that held a small lease and
// moved to the pool (the engine does this when a contended grant splits
// the burst too finely) and left it soon after; once as a caller that
// released a lower record and took an exact record while waiting it out.
// Both released at once before "x:" records kept clean_us and releases
// wrote "w:" records, which let TestPoolRandomInvariant find the instances
// running more than the rate about once in 25 runs.
func TestReleaseWaitsOutLowerLeasesThroughExact(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	ctx := context.Background()
	const rate, n, ttl = 10.0, 4, 10 * time.Second
	for _, tc := range []struct {
		name         string
		releaseFirst bool
	}{
		{"exact after a lower lease", false},
		{"exact while waiting out a release", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := strings.ReplaceAll(tc.name, " ", "-")
			req := func(inst string, want float64) global.LeaseRequest {
				return global.LeaseRequest{Limit: "wait", Key: k, Instance: inst, Want: want, Rate: rate,
					Instances: n, TTL: ttl, MaxTTL: ttl}
			}
			// c yields everything; a is granted what c and the two
			// unrecorded instances leave: 10 - 2 * 2.5.
			y := req("c", 0)
			y.Yield = true
			lease(t, store, y)
			a := lease(t, store, req("a", rate))
			if !approx(a.Granted, rate-2*rate/n) {
				t.Fatalf("a is granted %v; want %v", a.Granted, rate-2*rate/n)
			}
			if tc.releaseFirst {
				if r := lease(t, store, req("c", 0)); r.In < ttl/2 {
					t.Fatalf("c's first release: back in %v; want when a's grant ends, about %v", r.In, ttl)
				}
			}
			if _, err := store.TakeExact(ctx, global.ExactRequest{Limit: "wait", Key: k, Instance: "c", Rate: rate,
				Burst: 10, Instances: n, N: 1, TTL: time.Second}); err != nil {
				t.Fatal(err)
			}
			// c leaves the pool: a's grant, which counted c at 0, still
			// runs, so c's default share must wait for its end.
			if r := lease(t, store, req("c", 0)); r.In < ttl/2 {
				t.Errorf("c's release of its exact record: back in %v; want when a's grant ends, about %v", r.In, ttl)
			}
		})
	}
}

// TestLeaseCountsExactUsersAtTheirDemand: with exact bursts an exact user
// runs nothing locally and no instance runs its default share unasked, so
// a lease grant leaves the pool what the exact users' takes asked for (with
// headroom, at least a twentieth of their default share and at most all of
// it), not a default share each: a heavy instance beside light exact users
// gets the rest of the rate. Counted at the default share, a key skewed
// 90/10 over four instances admitted 0.45 of an exact bucket. With split
// bursts an exact user is still counted at its default share, which it may
// run once its record is released.
func TestLeaseCountsExactUsersAtTheirDemand(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	const rate, burst, n = 100.0, 40, 4
	const share = rate / n
	tests := []struct {
		name        string
		exactBursts bool
		tokens      int     // b's one take; 0: b's record is written by hand
		held        float64 // ... which carries this much held demand
		demand      float64 // by hand: b's demand, measured ago before the lease
		ago         time.Duration
		granted     float64 // a's grant, wanting the whole rate
	}{
		// 1 token over the 1 s time constant: 1.2/s, below the floor.
		{name: "light", exactBursts: true, tokens: 1, granted: rate - 0.05*share},
		// 1 token taken and 9 held, each counted as a take: 10/s, 12 with
		// headroom.
		{name: "held", exactBursts: true, tokens: 1, held: 9, granted: rate - 1.2*10},
		// 30/s with headroom is above the default share: capped at it.
		{name: "heavy", exactBursts: true, tokens: 30, granted: rate - share},
		// 10/s measured 2 s ago is 10/e² now: counted at 1.2 times that.
		{name: "decayed", exactBursts: true, demand: 10, ago: 2 * time.Second, granted: rate - 1.2*10*math.Exp(-2)},
		// b and its two unrecorded peers at the default share.
		{name: "split bursts", tokens: 1, granted: rate - 3*share},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := tc.name
			key := store.LeaseKey("demand", k)
			if tc.tokens > 0 {
				if _, err := store.TakeExact(ctx, global.ExactRequest{Limit: "demand", Key: k, Instance: "b", Rate: rate,
					Burst: burst, Instances: n, N: tc.tokens, TTL: 10 * time.Second, ExactBursts: tc.exactBursts, Held: tc.held}); err != nil {
					t.Fatal(err)
				}
			} else {
				h, err := readHash(rdb, key)
				if err != nil {
					t.Fatal(err)
				}
				at := h.now - tc.ago.Microseconds()
				rec := fmt.Sprintf("%d 0 %g %d", h.now+10_000_000, tc.demand, at)
				if err := rdb.HSet(ctx, key, "x:b", rec).Err(); err != nil {
					t.Fatal(err)
				}
			}
			g := lease(t, store, global.LeaseRequest{Limit: "demand", Key: k, Instance: "a", Want: rate, Rate: rate,
				Instances: n, TTL: 10 * time.Second, MaxTTL: 10 * time.Second, ExactBursts: tc.exactBursts})
			// The demand decays while the test runs: a few ms at most.
			if math.Abs(g.Granted-tc.granted) > 0.02 {
				t.Errorf("a is granted %v beside exact user b; want %v", g.Granted, tc.granted)
			}
			// The pool is what a's lease leaves: b's takes come from it.
			got, err := store.TakeExact(ctx, global.ExactRequest{Limit: "demand", Key: k, Instance: "b", Rate: rate,
				Burst: burst, Instances: n, TTL: 10 * time.Second, ExactBursts: tc.exactBursts})
			if err != nil {
				t.Fatal(err)
			}
			if want := rate - g.Granted - 2*share*boolFloat(!tc.exactBursts); !approx(got.PoolRate, want) {
				t.Errorf("b's pool runs at %v/s beside a's grant %v; want %v", got.PoolRate, g.Granted, want)
			}
		})
	}
}

// TestTakeExactHeldDemand: an exact user's record measures its demand as
// DemandTau says, and a take's Held counts as that many tokens taken with
// it: the demand its deny cache held in process is not lost.
func TestTakeExactHeldDemand(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	key := store.LeaseKey("held", "k")
	req := global.ExactRequest{Limit: "held", Key: "k", Instance: "b", Rate: 10, Burst: 100, Instances: 2, N: 1,
		TTL: 10 * time.Second, ExactBursts: true}
	// demand reads b's record: its demand and when it was measured (us).
	demand := func() (float64, int64) {
		t.Helper()
		v, err := rdb.HGet(ctx, key, "x:b").Result()
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(v) // "expiry_us clean_us demand demand_us"
		if len(f) != 4 {
			t.Fatalf("b's record %q; want four fields", v)
		}
		d, err1 := strconv.ParseFloat(f[2], 64)
		at, err2 := strconv.ParseInt(f[3], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("b's record %q: %v, %v", v, err1, err2)
		}
		return d, at
	}
	if _, err := store.TakeExact(ctx, req); err != nil {
		t.Fatal(err)
	}
	d0, at0 := demand()
	if !approx(d0, 1) {
		t.Fatalf("b's demand after one take of 1: %v; want 1", d0)
	}
	for _, held := range []float64{0, 6.5} {
		time.Sleep(100 * time.Millisecond) // for the first demand to decay: any gap will do
		req.Held = held
		if _, err := store.TakeExact(ctx, req); err != nil {
			t.Fatal(err)
		}
		d1, at1 := demand()
		if at1 <= at0 {
			t.Fatalf("b's demand measured at %d, then at %d", at0, at1)
		}
		want := global.DecayHeld(d0, time.Duration(at1-at0)*time.Microsecond, 1) + held
		if math.Abs(d1-want) > 1e-9 {
			t.Errorf("b's demand %v, %dus after %v, with %v held; want %v", d1, at1-at0, d0, held, want)
		}
		d0, at0 = d1, at1
	}
}

// TestLeaseLeavesTheSurplusToThePool: while an instance decides a key
// exactly, a lease is granted its want and no more, not what nobody wants
// on top of it nor its default share: the pool, which the exact users take
// from, is what the leases leave. A light instance of a key whose heavy
// instance decides exactly held its whole default share before, and the
// heavy one was held to what was left (3 instances, 80% of the demand on
// one: 0.84 of an exact bucket). Without an exact user the lease still gets
// its default share.
func TestLeaseLeavesTheSurplusToThePool(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	const rate, burst, n, want = 48.0, 6, 3, 11.0
	for _, tc := range []struct {
		name          string
		exact         bool // b decides the key exactly
		granted, pool float64
	}{
		// a's want; the pool is what a and the unrecorded c leave.
		{"exact user", true, want, rate - want - rate/n},
		// a's default share, free: no pool to leave it to.
		{"no exact user", false, rate / n, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := tc.name
			if tc.exact {
				if _, err := store.TakeExact(ctx, global.ExactRequest{Limit: "surplus", Key: k, Instance: "b", Rate: rate,
					Burst: burst, Instances: n, N: 1, TTL: 10 * time.Second}); err != nil {
					t.Fatal(err)
				}
			}
			g := lease(t, store, global.LeaseRequest{Limit: "surplus", Key: k, Instance: "a", Want: want, Rate: rate,
				Instances: n, TTL: 10 * time.Second, MaxTTL: 10 * time.Second, Burst: burst, WantBurst: 2})
			if !approx(g.Granted, tc.granted) {
				t.Errorf("a wanting %v is granted %v; want %v", want, g.Granted, tc.granted)
			}
			if !tc.exact {
				return
			}
			got, err := store.TakeExact(ctx, global.ExactRequest{Limit: "surplus", Key: k, Instance: "b", Rate: rate,
				Burst: burst, Instances: n, TTL: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if !approx(got.PoolRate, tc.pool) {
				t.Errorf("b's pool runs at %v/s; want %v", got.PoolRate, tc.pool)
			}
		})
	}
}

// TestTakeExactReturningUserWaitsARenewalNotTheTrickle: with exact bursts,
// an exact user whose demand decayed while it was idle is counted at a
// twentieth of its share, and a heavy lease takes the rest. When it comes
// back, the pool holds that trickle: its turn is worked out at what it is
// counted at with this take (the leases leave it that from their next
// renewals), not at the trickle, which on a slow key told it to wait 8 s
// while the leases would have made room within a renewal.
func TestTakeExactReturningUserWaitsARenewalNotTheTrickle(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	const rate, burst, n = 10.0, 4, 4
	key := store.LeaseKey("back", "k")
	// b took at 2/s, five seconds ago: e⁻⁵ of that now, counted at the
	// floor, a twentieth of its share of 2.5/s.
	h, err := readHash(rdb, key)
	if err != nil {
		t.Fatal(err)
	}
	rec := fmt.Sprintf("%d 0 2 %d", h.now+10_000_000, h.now-5_000_000)
	if err := rdb.HSet(ctx, key, "x:b", rec, "p", fmt.Sprintf("0 %d", h.now)).Err(); err != nil {
		t.Fatal(err)
	}
	a := lease(t, store, global.LeaseRequest{Limit: "back", Key: "k", Instance: "a", Want: 100, Rate: rate,
		Instances: n, TTL: 10 * time.Second, MaxTTL: 10 * time.Second, ExactBursts: true, Burst: burst, WantBurst: burst})
	if trickle := rate - a.Granted; trickle > 0.05*rate/n+1e-9 {
		t.Fatalf("a is granted %v: the pool keeps %v/s, want b counted at its floor", a.Granted, trickle)
	}
	got, err := store.TakeExact(ctx, global.ExactRequest{Limit: "back", Key: "k", Instance: "b", Rate: rate,
		Burst: burst, Instances: n, N: 1, TTL: 10 * time.Second, ExactBursts: true})
	if err != nil {
		t.Fatal(err)
	}
	// Counted with this take at 1.2 times its demand of about 1/s: a token
	// in under a second.
	if got.Allowed || got.RetryAfter <= 0 || got.RetryAfter > time.Second {
		t.Errorf("b's take from a pool of %v/s: %+v; want denied, turn within a second", got.PoolRate, got)
	}
}
