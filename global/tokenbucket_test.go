package global_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// takeStep is one TakeN call of a fixed sequence and what it must return.
type takeStep struct {
	n         int
	allowed   bool
	remaining int64
	// retry: 0 means RetryAfter must be 0, -1 means Never,
	// 1 means positive and at most n/rate.
	retry int
}

func TestTakeNSequences(t *testing.T) {
	// The rate is slow enough that refill during a test run (milliseconds)
	// never adds a whole token, so every sequence is deterministic.
	const rate = 0.01
	tests := []struct {
		name  string
		burst int
		steps []takeStep
	}{
		{"burst then denial", 3, []takeStep{
			{1, true, 2, 0}, {1, true, 1, 0}, {1, true, 0, 0}, {1, false, 0, 1}, {1, false, 0, 1},
		}},
		{"take n at once", 5, []takeStep{
			{3, true, 2, 0}, {3, false, 2, 1}, {2, true, 0, 0}, {1, false, 0, 1},
		}},
		{"n above burst never fits", 2, []takeStep{
			{3, false, 2, -1}, {2, true, 0, 0}, {3, false, 0, -1},
		}},
		{"n zero peeks", 2, []takeStep{
			{0, true, 2, 0}, {2, true, 0, 0}, {0, true, 0, 0}, {1, false, 0, 1},
		}},
		{"zero burst denies all", 0, []takeStep{
			{1, false, 0, -1}, {0, true, 0, 0},
		}},
	}
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "test")
	ctx := context.Background()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, st := range tt.steps {
				got, err := store.TakeN(ctx, "seq", tt.name, rate, tt.burst, st.n)
				if err != nil {
					t.Fatalf("step %d: TakeN(n=%d): %v", i, st.n, err)
				}
				if got.Allowed != st.allowed || got.Remaining != st.remaining {
					t.Errorf("step %d: TakeN(n=%d) = %+v, want allowed=%v remaining=%d", i, st.n, got, st.allowed, st.remaining)
				}
				switch st.retry {
				case 0:
					if got.RetryAfter != 0 {
						t.Errorf("step %d: RetryAfter = %v, want 0", i, got.RetryAfter)
					}
				case -1:
					if got.RetryAfter != global.Never {
						t.Errorf("step %d: RetryAfter = %v, want Never", i, got.RetryAfter)
					}
				default:
					max := time.Duration(float64(st.n) / rate * float64(time.Second))
					if got.RetryAfter <= 0 || got.RetryAfter > max {
						t.Errorf("step %d: RetryAfter = %v, want in (0, %v]", i, got.RetryAfter, max)
					}
				}
			}
		})
	}
}

func TestTakeNRefill(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	ctx := context.Background()
	const rate, burst = 20.0, 2 // one token every 50 ms

	for range burst {
		if got, err := store.TakeN(ctx, "refill", "k", rate, burst, 1); err != nil || !got.Allowed {
			t.Fatalf("TakeN within burst = %+v, %v; want allowed", got, err)
		}
	}
	denied, err := store.TakeN(ctx, "refill", "k", rate, burst, 1)
	deniedAt := time.Now()
	if err != nil || denied.Allowed {
		t.Fatalf("TakeN after burst = %+v, %v; want denied", denied, err)
	}
	if denied.RetryAfter <= 0 || denied.RetryAfter > 50*time.Millisecond {
		t.Fatalf("RetryAfter = %v, want in (0, 50ms]", denied.RetryAfter)
	}

	// Poll until the token is back; it must not come back much before
	// RetryAfter (server and test share one clock, allow a little slack).
	deadline := deniedAt.Add(5 * time.Second)
	for {
		got, err := store.TakeN(ctx, "refill", "k", rate, burst, 1)
		if err != nil {
			t.Fatalf("TakeN: %v", err)
		}
		if got.Allowed {
			if waited := time.Since(deniedAt); waited < denied.RetryAfter-5*time.Millisecond {
				t.Errorf("token back after %v, RetryAfter said %v", waited, denied.RetryAfter)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no token back within 5s, RetryAfter said %v", denied.RetryAfter)
		}
		time.Sleep(time.Millisecond) // poll interval
	}
}

func TestTakeNStateAndTTL(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	const rate, burst = 1.0, 10
	key := store.BucketKey("ttl", "k")

	for i := range 30 { // 10 allowed, 20 denied
		if _, err := store.TakeN(ctx, "ttl", "k", rate, burst, 1+i%3); err != nil {
			t.Fatalf("TakeN: %v", err)
		}
		state, err := rdb.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatalf("HGETALL %s: %v", key, err)
		}
		tokens, err := strconv.ParseFloat(state["tokens"], 64)
		if err != nil || tokens < 0 || tokens > burst {
			t.Fatalf("after call %d: tokens = %q (%v), want in [0, %d]", i, state["tokens"], err, burst)
		}
		if _, err := strconv.ParseInt(state["ts"], 10, 64); err != nil {
			t.Fatalf("after call %d: ts = %q: %v", i, state["ts"], err)
		}
		pttl, err := rdb.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatalf("PTTL: %v", err)
		}
		// Time to refill to full: (burst - tokens) / rate, rounded up.
		max := time.Duration((burst-tokens)/rate*float64(time.Second)) + time.Millisecond
		if pttl <= 0 || pttl > max {
			t.Fatalf("after call %d: PTTL = %v, want in (0, %v]", i, pttl, max)
		}
	}

	// A full bucket expires at once: the missing key means the same.
	if _, err := store.TakeN(ctx, "ttl", "full", 1000, 1, 0); err != nil {
		t.Fatalf("TakeN: %v", err)
	}
	eventually(t, "the full bucket's key to expire", func() bool {
		n, err := rdb.Exists(ctx, store.BucketKey("ttl", "full")).Result()
		return err == nil && n == 0
	})
}

func TestTakeNInvalid(t *testing.T) {
	store := global.New(noNetwork{}, "")
	tests := []struct {
		name     string
		rate     float64
		burst, n int
	}{
		{"zero rate", 0, 1, 1},
		{"negative rate", -1, 1, 1},
		{"NaN rate", nan(), 1, 1},
		{"infinite rate", inf(), 1, 1},
		{"negative burst", 1, -1, 1},
		{"negative n", 1, 1, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := store.TakeN(context.Background(), "l", "k", tt.rate, tt.burst, tt.n)
			if !errors.Is(err, global.ErrInvalid) {
				t.Errorf("TakeN(%v, %d, %d) error = %v, want ErrInvalid", tt.rate, tt.burst, tt.n, err)
			}
		})
	}
}

func TestTakeNNoScript(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	ctx := context.Background()
	for i := range 3 {
		srv.ScriptFlush(t)
		got, err := store.TakeN(ctx, "noscript", "k", 1, 5, 1)
		if err != nil || !got.Allowed || got.Remaining != int64(4-i) {
			t.Fatalf("TakeN after SCRIPT FLUSH = %+v, %v; want allowed, remaining %d", got, err, 4-i)
		}
	}
	if st := srv.CommandStats(t); st["eval"] != 3 {
		t.Errorf("EVAL calls = %d, want 3 (one fallback per flush)", st["eval"])
	}
}
