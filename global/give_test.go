package global_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// TestGiveN: tokens given back to a Global bucket are there for the next
// take, never above the burst, and a give to a bucket that does not exist
// (full) adds nothing.
func TestGiveN(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	ctx := context.Background()
	// Slow enough that no whole token refills during the test.
	const rate, burst = 0.01, 5
	take := func(n int) global.Take {
		t.Helper()
		tk, err := store.TakeN(ctx, "l", "k", rate, burst, n)
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	taken := time.Now()
	give := func(n int) int64 {
		t.Helper()
		left, err := store.GiveN(ctx, "l", "k", rate, burst, n, taken)
		if err != nil {
			t.Fatal(err)
		}
		return left
	}
	if left := give(3); left != burst {
		t.Errorf("a give to a fresh (full) bucket leaves %d, want the burst %d", left, burst)
	}
	tk := take(4)
	if !tk.Allowed || tk.Remaining != 1 {
		t.Fatalf("take 4 of a full bucket = %+v", tk)
	}
	taken = tk.At
	if left := give(3); left != 4 {
		t.Errorf("take 4, give 3 back: %d left, want 4", left)
	}
	if left := give(3); left != burst {
		t.Errorf("a give above the burst left %d, want the burst %d", left, burst)
	}
	if tk := take(burst); !tk.Allowed {
		t.Errorf("the whole burst after the gives = %+v, want it admitted", tk)
	}
	if tk := take(1); tk.Allowed {
		t.Errorf("a take past the burst after the gives = %+v, want a denial: a give never lifts the bucket above its burst", tk)
	}
	if _, err := store.GiveN(ctx, "l", "k", rate, burst, -1, taken); !errors.Is(err, global.ErrInvalid) {
		t.Errorf("GiveN(-1) error = %v, want ErrInvalid", err)
	}
}

// TestGivePool: tokens given back to a key's pool are there for the next
// take, up to the pool's burst (its part of the limit's that no lease
// holds), and a give changes no lease: the lease keeps its grant.
func TestGivePool(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	ctx := context.Background()
	const rate, burst = 1.0, 10
	take := func(n int) global.Take {
		t.Helper()
		tk, err := store.TakePool(ctx, global.PoolTake{Limit: "l", Key: "k", Instance: "a", Gen: 1, Rate: rate,
			Burst: burst, Instances: 2, N: n, TTL: time.Minute, Asked: int64(n)})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	taken := time.Now()
	give := func(n int) int64 {
		t.Helper()
		left, err := store.GivePool(ctx, "l", "k", rate, burst, n, taken)
		if err != nil {
			t.Fatal(err)
		}
		return left
	}
	if left := give(4); left != burst {
		t.Errorf("a give to a missing (full) pool leaves %d, want %d", left, burst)
	}
	tk := take(burst)
	if !tk.Allowed || tk.Remaining != 0 {
		t.Fatalf("the whole burst = %+v", tk)
	}
	taken = tk.At
	if left := give(6); left != 6 {
		t.Errorf("take 10, give 6: %d left, want 6", left)
	}
	// b leases half the rate: the pool's burst is 5 from now on.
	grants := make([]global.LeaseGrant, 1)
	err := store.AskLeases(ctx, []global.LeaseAsk{{Limit: "l", Key: "k", Instance: "b", Gen: 1, Want: rate / 2,
		Rate: rate, Burst: burst, Instances: 2, TTL: time.Minute}}, grants)
	if err != nil || grants[0].Err != nil || grants[0].Granted != rate/2 {
		t.Fatalf("b's lease = %+v, %v; want half the rate", grants[0], err)
	}
	if left := give(burst); left != burst/2 {
		t.Errorf("a give past the pool's burst left %d, want its burst %d", left, burst/2)
	}
	if err := store.AskLeases(ctx, []global.LeaseAsk{{Limit: "l", Key: "k", Instance: "b", Gen: 3, Want: rate / 2,
		Rate: rate, Burst: burst, Instances: 2, TTL: time.Minute, Running: rate / 2, RunningFor: time.Minute}}, grants); err != nil ||
		grants[0].Err != nil || grants[0].Granted != rate/2 || grants[0].Lost {
		t.Errorf("b's renewal after the gives = %+v, %v; want its grant, its record kept", grants[0], err)
	}
	if _, err := store.GivePool(ctx, "l", "k", rate, burst, -1, taken); !errors.Is(err, global.ErrInvalid) {
		t.Errorf("GivePool(-1) error = %v, want ErrInvalid", err)
	}
}

// A give is the tokens less what the bucket refilled since they were
// taken: had they not been taken, the bucket would have been full sooner
// and lost that refill. At 100/s, 10 tokens taken "50ms ago" give 5 back,
// whatever the time the give itself takes: the bucket holds 5, as if the
// request had never come. The same for a key's pool.
func TestGiveLessTheRefillSince(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	ctx := context.Background()
	const rate, burst = 100.0, 10
	tk, err := store.TakeN(ctx, "l", "bucket", rate, burst, burst)
	if err != nil || !tk.Allowed {
		t.Fatalf("TakeN = %+v, %v", tk, err)
	}
	left, err := store.GiveN(ctx, "l", "bucket", rate, burst, burst, tk.At.Add(-50*time.Millisecond))
	if err != nil || left < 4 || left > 5 {
		t.Errorf("GiveN of 10 taken 50ms earlier at 100/s: %d left, %v; want 5 (4 by rounding)", left, err)
	}
	tk, err = store.TakePool(ctx, global.PoolTake{Limit: "l", Key: "pool", Instance: "a", Gen: 1, Rate: rate,
		Burst: burst, Instances: 1, N: burst, TTL: time.Minute, Asked: burst})
	if err != nil || !tk.Allowed {
		t.Fatalf("TakePool = %+v, %v", tk, err)
	}
	left, err = store.GivePool(ctx, "l", "pool", rate, burst, burst, tk.At.Add(-50*time.Millisecond))
	if err != nil || left < 4 || left > 5 {
		t.Errorf("GivePool of 10 taken 50ms earlier at 100/s: %d left, %v; want 5 (4 by rounding)", left, err)
	}
}
