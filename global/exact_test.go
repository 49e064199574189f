package global_test

import (
	"context"
	"errors"
	"fmt"
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
