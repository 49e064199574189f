package global_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// lease runs one request and fails the test on any error.
func lease(t *testing.T, store *global.Store, r global.LeaseRequest) global.Lease {
	t.Helper()
	out := make([]global.Lease, 1)
	if err := store.Lease(context.Background(), []global.LeaseRequest{r}, out); err != nil {
		t.Fatalf("Lease(%+v): %v", r, err)
	}
	if out[0].Err != nil {
		t.Fatalf("Lease(%+v): %v", r, out[0].Err)
	}
	return out[0]
}

func TestLeaseSingle(t *testing.T) {
	const rate = 100.0
	tests := []struct {
		name      string
		n         int
		want      float64
		granted   float64
		demand    float64
		contended bool
	}{
		// The instances that have not asked are counted as wanting and
		// running their default share rate/N. Uncontended, the want plus
		// an N-th of what nobody wants, but at least rate/N when free.
		{"alone wants less than rate", 1, 30, 100, 30, false},
		{"alone wants the rate", 1, 100, 100, 100, false},
		{"alone wants more than rate", 1, 250, 100, 250, true},
		{"first of four wants everything", 4, 100, 25, 175, true},
		{"first of four wants little", 4, 10, 25, 85, false},
		{"first of two wants more", 2, 80, 50, 130, true},
	}
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := time.Now()
			got := lease(t, store, global.LeaseRequest{
				Limit: "single", Key: tt.name, Instance: "a",
				Want: tt.want, Rate: rate, Instances: tt.n, TTL: time.Second,
			})
			if !approx(got.Granted, tt.granted) || !approx(got.Fair, tt.granted) ||
				!approx(got.Demand, tt.demand) || got.Contended != tt.contended {
				t.Errorf("Lease = %+v, want granted=fair=%v demand=%v contended=%v", got, tt.granted, tt.demand, tt.contended)
			}
			if exp := got.Expires.Sub(before); exp < 900*time.Millisecond || exp > 1100*time.Millisecond {
				t.Errorf("Expires %v after the call, want about 1s", exp)
			}
		})
	}
}

func TestLeaseConvergence(t *testing.T) {
	const rate = 1000.0
	tests := []struct {
		name  string
		wants []float64 // fractions of rate, one per instance
	}{
		{"balanced under", []float64{0.2, 0.2, 0.2, 0.2}},
		{"balanced over", []float64{0.5, 0.5, 0.5, 0.5}},
		{"skewed under", []float64{0.9, 0.033, 0.033, 0.033}},
		{"skewed over", []float64{2, 0.1, 0.1, 0.1}},
		{"all want everything", []float64{1, 1, 1, 1}},
		// Want 0 releases: the idle instance is then unrecorded, counted as
		// wanting and running its default share.
		{"one released", []float64{0.6, 0.6, 0.6, 0}},
	}
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wants := make([]float64, len(tt.wants))
			for i, w := range tt.wants {
				wants[i] = w * rate
			}
			// An instance that released (want 0) is unrecorded: counted as
			// wanting its default share, and granted nothing.
			counted := make([]float64, len(wants))
			for i, w := range wants {
				counted[i] = w
				if w == 0 {
					counted[i] = rate / float64(len(wants))
				}
			}
			fair := fairSplit(rate, counted, len(wants))
			sumFair := 0.0
			for i, w := range wants {
				if w == 0 {
					fair[i] = 0
				}
				sumFair += max(fair[i], counted[i]-w)
			}
			key := store.LeaseKey("conv", tt.name)
			for round := range 4 {
				for i, w := range wants {
					got := lease(t, store, global.LeaseRequest{
						Limit: "conv", Key: tt.name, Instance: fmt.Sprint("i", i),
						Want: w, Rate: rate, Instances: len(wants), TTL: 10 * time.Second,
					})
					checkSum(t, rdb, key, rate, fmt.Sprintf("round %d instance %d", round, i))
					// From the second round on every instance has asked, and
					// its fair share is known; from the third on, every
					// instance has shrunk or grown to it, unless the fair
					// shares add up to more than the rate (each is at least
					// the default share while that is free beside the
					// others' wants, but not all of them can be).
					if round >= 1 && !approx(got.Fair, fair[i]) {
						t.Errorf("round %d instance %d: fair %v, want %v", round, i, got.Fair, fair[i])
					}
					if round >= 2 && sumFair <= rate*(1+1e-12) && !approx(got.Granted, fair[i]) {
						t.Errorf("round %d instance %d: granted %v, want %v", round, i, got.Granted, fair[i])
					}
					if got.Granted > got.Fair*(1+1e-12) {
						t.Errorf("round %d instance %d: granted %v above fair %v", round, i, got.Granted, got.Fair)
					}
				}
			}
		})
	}
}

// TestLeaseRandomInvariant sends random requests from several workers,
// each owning three instances, and loses a quarter of the answers at random:
// an instance that loses one keeps running the grant it had and says so in
// its next request, as hybrid's does. Every snapshot of the hash counts at
// most the rate, and so, at every moment, does what the instances actually
// run.
func TestLeaseRandomInvariant(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	const (
		workers = 4
		calls   = 400
		keys    = 3
	)
	rates := [keys]float64{10, 1000, 0.5}
	type running struct {
		granted float64
		until   time.Time
	}
	// What each (instance, key) runs, as the instances see it; guarded by
	// mu, which also orders each worker's check after its own updates.
	var mu sync.Mutex
	runs := map[[2]string]running{}
	runningSum := func(k string, now time.Time) float64 {
		sum := 0.0
		for ik, r := range runs {
			if ik[1] == k && r.until.After(now) {
				sum += r.granted
			}
		}
		return sum
	}
	var wg sync.WaitGroup
	var failed atomic.Bool
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for c := 0; c < calls && !failed.Load(); c++ {
				k := rng.IntN(keys)
				key := fmt.Sprint(k)
				rate := rates[k]
				// Several requests on one key in one pipeline too, each from
				// another instance, as hybrid sends them: one request per
				// instance and key at a time, answered in order.
				reqs := make([]global.LeaseRequest, 1+rng.IntN(3))
				ids := make([][2]string, len(reqs))
				first := rng.IntN(3)
				now := time.Now()
				mu.Lock()
				for j := range reqs {
					ids[j] = [2]string{fmt.Sprintf("w%d-i%d", w, (first+j)%3), key}
					want := rng.Float64() * 2 * rate
					if rng.IntN(8) == 0 {
						want = 0
					}
					reqs[j] = global.LeaseRequest{
						Limit: "rand", Key: key, Instance: ids[j][0],
						Want: want, Rate: rate, Instances: 1 + rng.IntN(2*workers+2),
						TTL: time.Duration(1+rng.IntN(200)) * time.Millisecond,
					}
					if r := runs[ids[j]]; want == 0 {
						// A release: the instance stops running its grant first.
						delete(runs, ids[j])
					} else if r.until.After(now) {
						reqs[j].Running, reqs[j].RunningFor = r.granted, r.until.Sub(now)
					}
				}
				mu.Unlock()
				out := make([]global.Lease, len(reqs))
				if err := store.Lease(context.Background(), reqs, out); err != nil {
					t.Errorf("Lease: %v", err)
					failed.Store(true)
					return
				}
				mu.Lock()
				for j, l := range out {
					if l.Err != nil || l.Granted < 0 || l.Granted > rate*(1+1e-12) {
						t.Errorf("Lease(%+v) = %+v", reqs[j], l)
						failed.Store(true)
					}
					if reqs[j].Want > 0 && rng.IntN(4) != 0 {
						// The answer arrived: the grant is in force from
						// now until a TTL after the request went out.
						runs[ids[j]] = running{l.Granted, now.Add(reqs[j].TTL)}
					}
				}
				if sum := runningSum(key, time.Now()); sum > rate*(1+1e-9)+1e-9 {
					t.Errorf("worker %d call %d: the instances run %v on key %s, above its rate %v", w, c, sum, key, rate)
					failed.Store(true)
				}
				mu.Unlock()
				// What Redis counts only shrinks between script runs, so
				// every snapshot of the hash must satisfy the invariant.
				sum, err := heldSum(rdb, store.LeaseKey("rand", key))
				if err != nil || sum > rate*(1+1e-12)+1e-12 {
					f, now, _ := snapshot(rdb, store.LeaseKey("rand", key))
					t.Errorf("worker %d call %d: sum of what the instances may run %v exceeds rate %v (%v); server time %d us, leases %+v", w, c, sum, rate, err, now, f)
					failed.Store(true)
				}
			}
		})
	}
	wg.Wait()
}

func TestLeaseExpiry(t *testing.T) {
	const rate = 100.0
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	key := store.LeaseKey("exp", "k")
	req := func(inst string, n int, ttl time.Duration) global.LeaseRequest {
		return global.LeaseRequest{Limit: "exp", Key: "k", Instance: inst, Want: rate, Rate: rate, Instances: n, TTL: ttl}
	}

	if got := lease(t, store, req("short", 2, 50*time.Millisecond)); !approx(got.Granted, 50) {
		t.Fatalf("short-lived lease granted %v, want 50", got.Granted)
	}
	if got := lease(t, store, req("long", 2, 10*time.Second)); !approx(got.Granted, 50) {
		t.Fatalf("long-lived lease granted %v, want 50", got.Granted)
	}
	// The short lease's instance crashed: N drops to 1, and once its lease
	// has expired the whole rate goes to the survivor.
	var last global.Lease
	waitFor(t, "the short lease's share to go to the other instance", func() bool {
		last = lease(t, store, req("long", 1, 10*time.Second))
		checkSum(t, rdb, key, rate, "renewal")
		return approx(last.Granted, rate)
	})
	if _, ok := readLeases(t, rdb, key)["short"]; ok {
		t.Error("expired lease still in the hash")
	}

	// A lone short lease takes its hash with it.
	lease(t, store, req("lone", 1, 50*time.Millisecond))
	loneKey := store.LeaseKey("exp", "lone")
	if err := rdb.HSet(ctx, loneKey, "x", "1 1 1").Err(); err != nil { // an expired lease, dropped at next run
		t.Fatalf("HSET: %v", err)
	}
	lease(t, store, global.LeaseRequest{Limit: "exp", Key: "lone", Instance: "lone", Want: 1, Rate: rate, Instances: 1, TTL: 50 * time.Millisecond})
	if pttl, err := rdb.PTTL(ctx, loneKey).Result(); err != nil || pttl <= 0 || pttl > 50*time.Millisecond {
		t.Fatalf("PTTL of the lease hash = %v, %v; want in (0, 50ms]", pttl, err)
	}
	waitFor(t, "the lease hash to expire", func() bool {
		n, err := rdb.Exists(ctx, loneKey).Result()
		return err == nil && n == 0
	})
}

func TestLeaseRelease(t *testing.T) {
	const rate = 100.0
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	key := store.LeaseKey("rel", "k")
	req := func(inst string, want float64) global.LeaseRequest {
		return global.LeaseRequest{Limit: "rel", Key: "k", Instance: inst, Want: want, Rate: rate, Instances: 2, TTL: 10 * time.Second}
	}

	lease(t, store, req("a", rate))
	if got := lease(t, store, req("b", rate)); !approx(got.Granted, 50) || !got.Contended {
		t.Fatalf("b granted %+v, want 50, contended", got)
	}
	if pttl, err := rdb.PTTL(ctx, key).Result(); err != nil || pttl <= 9*time.Second || pttl > 10*time.Second {
		t.Fatalf("PTTL of the lease hash = %v, %v; want about 10s", pttl, err)
	}

	// a leaves: N drops to 1. While a's lease lives, b cannot take its share.
	alone := req("b", rate)
	alone.Instances = 1
	if got := lease(t, store, alone); !approx(got.Granted, 50) {
		t.Fatalf("b alone before the release: %+v, want granted 50", got)
	}
	// Releasing a's lease frees its share at once.
	if err := store.Release(ctx, []global.LeaseRequest{req("a", 0)}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if got := lease(t, store, alone); !approx(got.Granted, rate) || got.Contended {
		t.Fatalf("after release, b granted %+v, want %v, not contended", got, rate)
	}
	checkSum(t, rdb, key, rate, "after release")
	if _, ok := readLeases(t, rdb, key)["a"]; ok {
		t.Error("released lease still in the hash")
	}

	// Want 0 through Lease releases too, and grants nothing.
	if got := lease(t, store, req("b", 0)); got.Granted != 0 {
		t.Fatalf("Lease with want 0 granted %v", got.Granted)
	}
	// No record is left, and the hash is gone with the last one.
	if n, err := rdb.Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Fatalf("the hash after the last release: EXISTS = %d, %v; want 0", n, err)
	}
	// Releasing what is not held is fine.
	if err := store.Release(ctx, []global.LeaseRequest{req("a", 0), req("zz", 0)}); err != nil {
		t.Fatalf("Release of missing leases: %v", err)
	}
}

func TestLeaseNoScript(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	ctx := context.Background()
	reqs := make([]global.LeaseRequest, 5)
	for i := range reqs {
		reqs[i] = global.LeaseRequest{Limit: "ns", Key: fmt.Sprint(i), Instance: "a", Want: 1, Rate: 10, Instances: 1, TTL: time.Second}
	}
	out := make([]global.Lease, len(reqs))
	for round := range 3 {
		srv.ScriptFlush(t)
		if err := store.Lease(ctx, reqs, out); err != nil {
			t.Fatalf("round %d: Lease after SCRIPT FLUSH: %v", round, err)
		}
		for i, l := range out {
			// Alone and uncontended: at least rate/N, here all of it.
			if l.Err != nil || !approx(l.Granted, 10) {
				t.Fatalf("round %d: out[%d] = %+v", round, i, l)
			}
		}
	}
	srv.ScriptFlush(t)
	if err := store.Release(ctx, reqs); err != nil {
		t.Fatalf("Release after SCRIPT FLUSH: %v", err)
	}
	if st := srv.CommandStats(t); st["eval"] != 4*int64(len(reqs)) {
		t.Errorf("EVAL calls = %d, want %d (the whole batch, once per flush)", st["eval"], 4*len(reqs))
	}
}

// pipelineCounter counts the pipelines a client sends and their commands.
type pipelineCounter struct {
	pipelines, cmds, singles atomic.Int64
}

func (c *pipelineCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.singles.Add(1)
		return next(ctx, cmd)
	}
}

func (c *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.pipelines.Add(1)
		c.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func TestLeaseBatchIsOnePipeline(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()

	batch := func(n int) []global.LeaseRequest {
		reqs := make([]global.LeaseRequest, n)
		for i := range reqs {
			reqs[i] = global.LeaseRequest{Limit: "batch", Key: fmt.Sprint(i), Instance: "a", Want: 5, Rate: 10, Instances: 2, TTL: time.Second}
		}
		return reqs
	}
	// Load the script once, so that the batch below needs no fallback.
	if err := store.Lease(ctx, batch(1), make([]global.Lease, 1)); err != nil {
		t.Fatalf("warm-up Lease: %v", err)
	}

	var hook pipelineCounter
	rdb.AddHook(&hook)
	before := srv.CommandStats(t)
	reqs := batch(1000)
	out := make([]global.Lease, len(reqs))
	if err := store.Lease(ctx, reqs, out); err != nil {
		t.Fatalf("Lease of 1000: %v", err)
	}
	after := srv.CommandStats(t)
	for i, l := range out {
		if l.Err != nil || !approx(l.Granted, 5) {
			t.Fatalf("out[%d] = %+v", i, l)
		}
	}
	if d := after["evalsha"] - before["evalsha"]; d != 1000 {
		t.Errorf("EVALSHA calls = %d, want 1000", d)
	}
	if d := after["eval"] - before["eval"]; d != 0 {
		t.Errorf("EVAL calls = %d, want 0", d)
	}
	if p, c, s := hook.pipelines.Load(), hook.cmds.Load(), hook.singles.Load(); p != 1 || c != 1000 || s != 0 {
		t.Errorf("client sent %d pipelines of %d commands and %d single commands, want 1 of 1000 and 0", p, c, s)
	}
}

func TestLeaseUniversalClient(t *testing.T) {
	srv := redistest.Start(t)
	var rdb redis.UniversalClient = redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{srv.Addr}})
	t.Cleanup(func() { _ = rdb.Close() })
	store := global.New(rdb, "uni")
	reqs := []global.LeaseRequest{
		{Limit: "u", Key: "a", Instance: "x", Want: 3, Rate: 10, Instances: 1, TTL: time.Second},
		{Limit: "u", Key: "b", Instance: "x", Want: 30, Rate: 10, Instances: 1, TTL: time.Second},
	}
	out := make([]global.Lease, len(reqs))
	if err := store.Lease(context.Background(), reqs, out); err != nil {
		t.Fatalf("Lease: %v", err)
	}
	if !approx(out[0].Granted, 10) || out[0].Contended || !approx(out[1].Granted, 10) || !out[1].Contended || out[0].Err != nil || out[1].Err != nil {
		t.Errorf("Lease = %+v, want grants 10 (uncontended: rate/N) and 10 (contended)", out)
	}
	if _, err := store.TakeN(context.Background(), "u", "a", 1, 1, 1); err != nil {
		t.Errorf("TakeN: %v", err)
	}
}

func TestLeaseWrongType(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	if err := rdb.Set(ctx, store.LeaseKey("wt", "bad"), "not a hash", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	reqs := []global.LeaseRequest{
		{Limit: "wt", Key: "good1", Instance: "a", Want: 1, Rate: 10, Instances: 1, TTL: time.Second},
		{Limit: "wt", Key: "bad", Instance: "a", Want: 1, Rate: 10, Instances: 1, TTL: time.Second},
		{Limit: "wt", Key: "good2", Instance: "a", Want: 1, Rate: 10, Instances: 1, TTL: time.Second},
	}
	out := make([]global.Lease, len(reqs))
	if err := store.Lease(ctx, reqs, out); err != nil {
		t.Fatalf("Lease: %v", err)
	}
	if out[1].Err == nil || !strings.Contains(out[1].Err.Error(), "WRONGTYPE") {
		t.Errorf("out[1].Err = %v, want WRONGTYPE", out[1].Err)
	}
	for _, i := range []int{0, 2} {
		if out[i].Err != nil || !approx(out[i].Granted, 10) {
			t.Errorf("out[%d] = %+v, want granted 10", i, out[i])
		}
	}
	if err := store.Release(ctx, reqs); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("Release error = %v, want WRONGTYPE for one key", err)
	}
}

func TestLeaseInvalid(t *testing.T) {
	ok := global.LeaseRequest{Limit: "l", Key: "k", Instance: "a", Want: 1, Rate: 10, Instances: 2, TTL: time.Second}
	tests := []struct {
		name string
		edit func(*global.LeaseRequest)
	}{
		{"empty instance", func(r *global.LeaseRequest) { r.Instance = "" }},
		{"NaN want", func(r *global.LeaseRequest) { r.Want = nan() }},
		{"infinite want", func(r *global.LeaseRequest) { r.Want = inf() }},
		{"negative want", func(r *global.LeaseRequest) { r.Want = -1 }},
		{"NaN rate", func(r *global.LeaseRequest) { r.Rate = nan() }},
		{"infinite rate", func(r *global.LeaseRequest) { r.Rate = inf() }},
		{"negative rate", func(r *global.LeaseRequest) { r.Rate = -0.5 }},
		{"zero instances", func(r *global.LeaseRequest) { r.Instances = 0 }},
		{"zero ttl", func(r *global.LeaseRequest) { r.TTL = 0 }},
		{"negative ttl", func(r *global.LeaseRequest) { r.TTL = -time.Second }},
		{"ttl below a microsecond", func(r *global.LeaseRequest) { r.TTL = time.Nanosecond }},
		{"NaN running", func(r *global.LeaseRequest) { r.Running = nan() }},
		{"infinite running", func(r *global.LeaseRequest) { r.Running = inf() }},
		{"negative running", func(r *global.LeaseRequest) { r.Running = -1 }},
		{"negative running for", func(r *global.LeaseRequest) { r.RunningFor = -time.Millisecond }},
		{"negative max ttl", func(r *global.LeaseRequest) { r.MaxTTL = -time.Second }},
	}
	store := global.New(noNetwork{}, "") // any network call panics
	ctx := context.Background()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ok
			tt.edit(&r)
			out := make([]global.Lease, 1)
			if err := store.Lease(ctx, []global.LeaseRequest{r}, out); err != nil {
				t.Fatalf("Lease returned %v, want the error in out[0].Err", err)
			}
			if !errors.Is(out[0].Err, global.ErrInvalid) {
				t.Errorf("Lease(%+v).Err = %v, want ErrInvalid", r, out[0].Err)
			}
		})
	}
	if err := store.Lease(ctx, []global.LeaseRequest{ok}, nil); !errors.Is(err, global.ErrInvalid) {
		t.Errorf("Lease with a short out slice: error = %v, want ErrInvalid", err)
	}
	if err := store.Release(ctx, []global.LeaseRequest{{Limit: "l", Key: "k"}}); !errors.Is(err, global.ErrInvalid) {
		t.Errorf("Release without instance: error = %v, want ErrInvalid", err)
	}

	// A valid request in the same batch still goes through.
	srv := redistest.Start(t)
	store = global.New(srv.Client(t), "")
	bad := ok
	bad.Want = -1
	out := make([]global.Lease, 2)
	if err := store.Lease(ctx, []global.LeaseRequest{bad, ok}, out); err != nil {
		t.Fatalf("Lease: %v", err)
	}
	if !errors.Is(out[0].Err, global.ErrInvalid) || out[1].Err != nil || out[1].Granted <= 0 {
		t.Errorf("Lease(bad, ok) = %+v", out)
	}
}

// TestLeaseRunningIsCounted: an instance whose grant shrinks says, in the
// request, what it runs until the answer reaches it. Until that ends Redis
// counts it at the larger grant, so the other instance is not granted the
// difference early (were the answer lost, both would run more than the
// rate); once it ends, the other gets its fair share.
func TestLeaseRunningIsCounted(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	const rate = 10.0
	req := func(inst string, want, running float64, runningFor time.Duration) global.LeaseRequest {
		return global.LeaseRequest{Limit: "run", Key: "k", Instance: inst, Want: want, Rate: rate, Instances: 2,
			TTL: 10 * time.Second, Running: running, RunningFor: runningFor, Held: running > 0}
	}
	key := store.LeaseKey("run", "k")
	// b yields to 0.5, so a, wanting 9, gets 9 and half of what is left.
	yield := req("b", 0.5, 0, 0)
	yield.Yield = true
	if b := lease(t, store, yield); !approx(b.Granted, 0.5) {
		t.Fatalf("b yielding to 0.5: granted %v, want 0.5", b.Granted)
	}
	a := lease(t, store, req("a", 9, 0, 0))
	if !approx(a.Granted, 9.25) {
		t.Fatalf("a wanting 9 beside b's 0.5: granted %v, want 9 + half of what nobody wants = 9.25", a.Granted)
	}
	if b := lease(t, store, req("b", 10, 0.5, 10*time.Second)); !approx(b.Granted, 0.75) {
		t.Fatalf("b wanting 10 beside a's 9.25: granted %v, want the 0.75 left", b.Granted)
	}
	const claim = 300 * time.Millisecond
	// Redis counts the claim from when the request reaches it, which is
	// after it was sent and before its answer is back: the claim surely
	// lives until claim after it was sent, and no longer than claim after
	// the answer. (Timed from the answer, b was once granted a's share
	// 60us early by this test's clock.)
	claimed := time.Now()
	shrunk := lease(t, store, req("a", 9, 9.25, claim))
	if !approx(shrunk.Granted, 5) {
		t.Fatalf("a renewing against b: granted %v, want its fair 5", shrunk.Granted)
	}
	checkSum(t, rdb, key, rate, "after a shrank")
	if b := lease(t, store, req("b", 10, 0.75, 10*time.Second)); time.Since(claimed) < claim && !approx(b.Granted, 0.75) {
		t.Fatalf("b while a may still run 9.25: granted %v, want 0.75", b.Granted)
	}
	checkSum(t, rdb, key, rate, "b beside a's claim")
	waitFor(t, "b gets its fair share once a's claim ends", func() bool {
		return approx(lease(t, store, req("b", 10, 0.75, 10*time.Second)).Granted, 5)
	})
	if time.Since(claimed) < claim {
		t.Errorf("b got a's share %v after a's claim was made, before its %v ran out", time.Since(claimed), claim)
	}
	checkSum(t, rdb, key, rate, "after a's claim ended")
}

// leaseStep is one request of a sequence on one key, and its grant.
type leaseStep struct {
	inst    string
	want    float64
	yield   bool
	exact   bool // ExactBursts: unrecorded instances are counted at 0
	young   bool // Young: its want above what it holds cuts nobody
	n       int
	granted float64
	// returnsIn, for a release, is how long after the call the instance
	// may run its default share again (Lease.Expires), to within a second;
	// 0 means at once.
	returnsIn time.Duration
	// ttl is the lease's TTL; zero means 10s.
	ttl time.Duration
	// after is how long after the sequence began the step is sent.
	after time.Duration
}

// TestLeaseCounting: every live instance is counted, always: an instance
// that never asked at its default share however old the key, a yielding
// one at its record, one that released at its default share again.
func TestLeaseCounting(t *testing.T) {
	const rate = 100.0
	tests := []struct {
		name string
		// old writes a version 1 "born" field 10 minutes in the past first.
		old   bool
		steps []leaseStep
	}{
		{"unrecorded counted on an old key", true, []leaseStep{
			// c never asks: a and b are each granted what it leaves.
			{inst: "a", want: 100, n: 3, granted: 100.0 / 3},
			{inst: "b", want: 100, n: 3, granted: 100.0 / 3},
			{inst: "a", want: 100, n: 3, granted: 100.0 / 3},
		}},
		{"fresh asker gets its default share when free", false, []leaseStep{
			// Alone of four, wanting 10: 25, not 10 + 15/4.
			{inst: "a", want: 10, n: 4, granted: 25},
			// b beside a's 25 and two unrecorded: 25 of its fair share.
			{inst: "b", want: 30, n: 4, granted: 25},
			// a again: 20 is free beside the others' wants, its want plus
			// a quarter of what nobody wants would be 12.5.
			{inst: "a", want: 10, n: 4, granted: 20},
		}},
		{"exact bursts count the unrecorded at 0", false, []leaseStep{
			// Under exact bursts an instance never runs a default share
			// unasked: alone of four, a may lease the whole rate.
			{inst: "a", want: 100, exact: true, n: 4, granted: 100},
			// Split bursts on the same key: the three it does not know of
			// are counted at 25 each (a's 100 is in force as well).
			{inst: "b", want: 100, n: 4, granted: 0},
		}},
		{"yield caps at want", false, []leaseStep{
			// Without Yield, 10 of two would get 50.
			{inst: "a", want: 10, yield: true, n: 2, granted: 10},
			{inst: "b", want: 100, n: 2, granted: 90},
		}},
		{"yield 0 keeps its slot", false, []leaseStep{
			{inst: "a", want: 0, yield: true, n: 2, granted: 0},
			// a is counted at 0, not at its default share 50.
			{inst: "b", want: 100, n: 2, granted: 100},
		}},
		{"release puts the instance back to unrecorded", false, []leaseStep{
			{inst: "a", want: 0, yield: true, n: 2, granted: 0},
			{inst: "b", want: 100, n: 2, granted: 100},
			// b's lease counted a at 0: a may run its share once it ends.
			{inst: "a", want: 0, n: 2, granted: 0, returnsIn: 10 * time.Second},
			// a is counted at its default share again.
			{inst: "b", want: 100, n: 2, granted: 50},
			// A release of a record of the default share or more: at once.
			{inst: "b", want: 0, n: 2, granted: 0},
		}},
		{"young demand cuts nobody", false, []leaseStep{
			{inst: "b", want: 0, yield: true, n: 2, granted: 0},
			{inst: "a", want: 100, n: 2, granted: 100},
			// b's young want takes what is free, nothing, and its record
			// wants what it holds: a keeps the whole rate.
			{inst: "b", want: 100, young: true, n: 2, granted: 0},
			{inst: "a", want: 100, n: 2, granted: 100},
			// Once b's want is not young, a's fair share is half.
			{inst: "b", want: 100, n: 2, granted: 0},
			{inst: "a", want: 100, n: 2, granted: 50},
		}},
		{"young demand keeps what nobody wants from the others", false, []leaseStep{
			{inst: "b", want: 0, yield: true, n: 2, granted: 0},
			// a alone wants 10: 10 + 90/2.
			{inst: "a", want: 10, n: 2, granted: 55},
			// b wants 80, young: it takes the 45 that are free, and records
			// wanting 45 (and 80 young).
			{inst: "b", want: 80, young: true, n: 2, granted: 45},
			// a again: all fits, but b's young demand is unmet, so a gets
			// its want, not 10 + 45/2.
			{inst: "a", want: 10, n: 2, granted: 10},
		}},
		{"a lapsed record returns through a release", false, []leaseStep{
			{inst: "a", want: 0, yield: true, n: 2, granted: 0, ttl: 50 * time.Millisecond},
			{inst: "b", want: 100, n: 2, granted: 100},
			// a's record has lapsed, b's lease that counted a at 0 has
			// not: a may not run its share before it ends.
			{inst: "a", want: 0, n: 2, granted: 0, returnsIn: 10 * time.Second, after: 100 * time.Millisecond},
		}},
	}
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := store.LeaseKey("count", tt.name)
			if tt.old {
				now, err := rdb.Time(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				if err := rdb.HSet(ctx, key, "born", now.Add(-10*time.Minute).UnixMicro()).Err(); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			for i, s := range tt.steps {
				waitFor(t, fmt.Sprint("step ", i, "'s time"), func() bool { return time.Since(start) >= s.after })
				before := time.Now()
				ttl := s.ttl
				if ttl == 0 {
					ttl = 10 * time.Second
				}
				got := lease(t, store, global.LeaseRequest{Limit: "count", Key: tt.name, Instance: s.inst,
					Want: s.want, Yield: s.yield, ExactBursts: s.exact, Young: s.young, Rate: rate, Instances: s.n, TTL: ttl})
				if !approx(got.Granted, s.granted) || got.Lost {
					t.Errorf("step %d (%+v): %+v, want granted %v", i, s, got, s.granted)
				}
				if s.want == 0 && !s.yield {
					if d := got.Expires.Sub(before); d < s.returnsIn-time.Second || d > s.returnsIn+time.Second {
						t.Errorf("step %d (%+v): the release says return in %v, want %v", i, s, d, s.returnsIn)
					}
				}
				checkSum(t, rdb, key, rate, fmt.Sprint("step ", i))
			}
			if h, err := rdb.HExists(ctx, key, "born").Result(); err != nil || h {
				t.Errorf("the hash still has version 1's born field: %v, %v", h, err)
			}
		})
	}
}

// TestLeaseLostExactUserKeepsItsShare: while Redis has lost leases, an
// instance that decides a key exactly and then asks for a lease (running
// nothing locally, as it leaves the exact placement) is granted what it may
// take from the pool meanwhile: its default share of the rate and of the
// burst, which the pool holds for each exact user while lost. It is not
// held at 0 until the loss is forgotten: that left its traffic with
// nothing for up to MaxTTL after a Redis restart. An instance without an
// exact record is still granted only what it runs.
func TestLeaseLostExactUserKeepsItsShare(t *testing.T) {
	const (
		rate   = 100.0
		burst  = 20
		ttl    = time.Second
		maxTTL = time.Minute // the loss outlasts the test
	)
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	ctx := context.Background()
	for _, exactBursts := range []bool{false, true} {
		t.Run(fmt.Sprint("exact_bursts=", exactBursts), func(t *testing.T) {
			req := func(inst string, running float64, held bool) global.LeaseRequest {
				r := global.LeaseRequest{Limit: "lostx", Key: "k", Instance: inst, Want: rate, Rate: rate, Instances: 2,
					TTL: ttl, MaxTTL: maxTTL, Running: running, Held: held, ExactBursts: exactBursts,
					Burst: burst, WantBurst: burst}
				if running > 0 {
					r.RunningFor, r.RunningBurst = ttl, burst/2
				}
				return r
			}
			if got := lease(t, store, req("a", 0, false)); got.Granted <= 0 {
				t.Fatalf("a before the loss: %+v", got)
			}
			srv.FlushAll(t)
			// a proves the loss: it runs a grant Redis has no record of.
			if got := lease(t, store, req("a", rate/2, true)); !got.Lost || !approx(got.Granted, rate/2) {
				t.Fatalf("a after the loss: %+v, want granted %v (its running), lost", got, rate/2)
			}
			// b decides the key exactly: the pool holds its default share.
			if _, err := store.TakeExact(ctx, global.ExactRequest{Limit: "lostx", Key: "k", Instance: "b", Rate: rate,
				Burst: burst, Instances: 2, N: 1, TTL: ttl, ExactBursts: exactBursts}); err != nil {
				t.Fatal(err)
			}
			got := lease(t, store, req("b", 0, false))
			if !got.Lost || !approx(got.Granted, rate/2) || !approx(got.Burst, burst/2) {
				t.Errorf("b leaving the exact placement while lost: %+v, want granted %v and %v of the burst (its default share), lost",
					got, rate/2, burst/2)
			}
			// c has no record: it runs nothing and may take nothing.
			if got := lease(t, store, req("c", 0, false)); got.Granted != 0 || !got.Lost {
				t.Errorf("c after the loss: %+v, want granted 0, lost", got)
			}
			srv.FlushAll(t)
		})
	}
	// With exact bursts a ran the whole rate before the loss, on a long
	// lease, and still does when b leaves the exact placement: b is
	// granted nothing then, but Redis goes on counting it at its default
	// share, so that once a says it runs its fair share b's renewals are
	// granted b's. a's long claim to the whole rate is not kept past a's
	// word that it runs less: only a claim up to the default share is.
	t.Run("renewal", func(t *testing.T) {
		req := func(inst string, running float64, runningFor time.Duration) global.LeaseRequest {
			r := global.LeaseRequest{Limit: "lostx", Key: "k2", Instance: inst, Want: rate, Rate: rate, Instances: 2,
				TTL: ttl, MaxTTL: maxTTL, Running: running, Held: running > 0, ExactBursts: true}
			if running > 0 {
				r.RunningFor = runningFor
			}
			return r
		}
		// Claims after a hears of a smaller grant are short.
		const short = 20 * time.Millisecond
		if got := lease(t, store, req("a", 0, 0)); !approx(got.Granted, rate) {
			t.Fatalf("a alone before the loss: %+v, want the whole rate", got)
		}
		srv.FlushAll(t)
		aRuns := rate
		// a's lease of the whole rate had most of a minute to run.
		if got := lease(t, store, req("a", aRuns, maxTTL/2)); !got.Lost || !approx(got.Granted, rate) {
			t.Fatalf("a after the loss: %+v, want granted %v (its running), lost", got, rate)
		}
		if _, err := store.TakeExact(ctx, global.ExactRequest{Limit: "lostx", Key: "k2", Instance: "b", Rate: rate,
			Burst: burst, Instances: 2, N: 1, TTL: ttl, ExactBursts: true}); err != nil {
			t.Fatal(err)
		}
		b := lease(t, store, req("b", 0, 0))
		if !b.Lost || b.Granted != 0 {
			t.Fatalf("b leaving the exact placement while a runs the whole rate: %+v, want granted 0, lost", b)
		}
		// a renews while it still runs its long lease: it is granted its
		// fair share, and from then on says it runs that.
		a := lease(t, store, req("a", aRuns, maxTTL/2))
		if !a.Lost || !approx(a.Granted, rate/2) {
			t.Fatalf("a renewing beside b's counted share: %+v, want granted %v, lost", a, rate/2)
		}
		aRuns = a.Granted
		waitFor(t, "b's renewal to be granted its default share while lost", func() bool {
			a := lease(t, store, req("a", aRuns, short))
			aRuns = a.Granted
			b = lease(t, store, req("b", b.Granted, short))
			if a.Granted+b.Granted > rate+1e-9 || !a.Lost || !b.Lost {
				t.Fatalf("a %+v and b %+v: more than the rate, or the loss forgotten", a, b)
			}
			return approx(b.Granted, rate/2)
		})
	})
}

// TestLeaseLost: after a FLUSHALL, an instance that says it holds a grant
// finds no record of it: Redis reports Lost, and until MaxTTL has passed
// no grant exceeds what its instance says it runs, so no instance grows
// into leases granted before the loss that Redis no longer counts.
func TestLeaseLost(t *testing.T) {
	const (
		rate   = 100.0
		ttl    = 100 * time.Millisecond
		maxTTL = 400 * time.Millisecond
	)
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	req := func(inst string, want, running float64, held bool) global.LeaseRequest {
		r := global.LeaseRequest{Limit: "lost", Key: "k", Instance: inst, Want: want, Rate: rate, Instances: 2,
			TTL: ttl, MaxTTL: maxTTL, Running: running, Held: held}
		if running > 0 {
			r.RunningFor = ttl
		}
		return r
	}
	a := req("a", 20, 0, false)
	a.Yield = true
	if got := lease(t, store, a); !approx(got.Granted, 20) || got.Lost {
		t.Fatalf("a yielding to 20: %+v", got)
	}
	if got := lease(t, store, req("b", 100, 0, false)); !approx(got.Granted, 80) || got.Lost {
		t.Fatalf("b beside a's 20: %+v, want 80", got)
	}
	srv.FlushAll(t)
	detected := time.Now()
	// a wants to grow: its fair share is 50, but it says it runs 20.
	if got := lease(t, store, req("a", 100, 20, true)); !approx(got.Granted, 20) || !got.Lost || !approx(got.Fair, 50) {
		t.Fatalf("a after the loss: %+v, want granted 20 (its running), fair 50, lost", got)
	}
	// A request that is not Held, running nothing, is granted nothing.
	if got := lease(t, store, req("c", 100, 0, false)); got.Granted != 0 || !got.Lost {
		t.Fatalf("c after the loss: %+v, want granted 0, lost", got)
	}
	// Once MaxTTL has passed, grants grow again.
	var got global.Lease
	waitFor(t, "a's grant to grow after MaxTTL", func() bool {
		got = lease(t, store, req("a", 100, 20, true))
		return !got.Lost
	})
	if since := time.Since(detected); since < maxTTL {
		t.Errorf("Lost ended %v after the loss was detected, before MaxTTL %v", since, maxTTL)
	}
	if !approx(got.Granted, 50) {
		t.Errorf("a after Lost ended: %+v, want granted 50", got)
	}
}

// TestReleaseWaitsOnlyForLeasesAboveTheirShare: an instance that releases
// a record below its default share waits, before it runs that share again,
// for the others' leases that hold more than their own default shares to
// end: only those can hold what it did not. A long yield record below its
// share does not hold it up (it did when the wait was for every lease).
func TestReleaseWaitsOnlyForLeasesAboveTheirShare(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	const rate, n = 10.0, 4 // default share 2.5
	req := func(inst string, want float64, ttl time.Duration) global.LeaseRequest {
		return global.LeaseRequest{Limit: "above", Key: "k", Instance: inst, Want: want, Rate: rate,
			Instances: n, TTL: ttl, MaxTTL: 20 * time.Second}
	}
	yield := func(inst string, want float64, ttl time.Duration) {
		y := req(inst, want, ttl)
		y.Yield = true
		lease(t, store, y)
	}
	yield("c", 0, 10*time.Second)
	yield("b", 1, 20*time.Second) // below its share, for longer than a's grant
	if a := lease(t, store, req("a", rate, 5*time.Second)); a.Granted <= rate/n {
		t.Fatalf("a is granted %v; the test needs more than its default share %v", a.Granted, rate/n)
	}
	r := lease(t, store, req("c", 0, time.Second))
	if r.In < 4*time.Second || r.In > 6*time.Second {
		t.Errorf("c's release: back in %v; want when a's grant ends, about 5s, not when b's yield does (20s)", r.In)
	}
}

// TestReleaseWaitsForBurstPartsAboveTheirShare: with the burst counted
// apart, a lease that holds no more than its default share of the rate
// but more than its default part of the burst may hold tokens that an
// instance counted below its part did not: that instance's release waits
// for it to end too.
func TestReleaseWaitsForBurstPartsAboveTheirShare(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	const rate, burst, n = 10.0, 8, 4 // default share 2.5 and 2 tokens
	req := func(inst string, want, wantB float64, ttl time.Duration) global.LeaseRequest {
		return global.LeaseRequest{Limit: "above-b", Key: "k", Instance: inst, Want: want, Rate: rate,
			Instances: n, TTL: ttl, MaxTTL: 20 * time.Second, Burst: burst, WantBurst: wantB}
	}
	y := req("c", 0, 0, 10*time.Second)
	y.Yield = true
	lease(t, store, y)
	a := lease(t, store, req("a", 1, 6, 5*time.Second))
	if a.Granted > rate/n || a.Burst <= float64(burst)/n {
		t.Fatalf("a is granted %v/s with %v tokens; the test needs at most the default share %v and more than %v tokens",
			a.Granted, a.Burst, rate/n, float64(burst)/n)
	}
	r := lease(t, store, req("c", 0, 0, time.Second))
	if r.In < 4*time.Second || r.In > 6*time.Second {
		t.Errorf("c's release: back in %v; want when a's grant, above its part of the burst, ends: about 5s", r.In)
	}
}
