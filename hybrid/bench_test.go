package hybrid_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// The benchmarked limits are so generous that decisions are admitted: the
// benchmarks measure the cost of deciding. Each reports admitted/op, the
// fraction of decisions admitted, so that a run measuring denials shows.
const (
	benchRate  = 1e9
	benchBurst = 1_000_000
	benchLimit = "bench"
)

// benchKeyList returns n distinct keys, generated before the timer starts.
func benchKeyList(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("user-%06d", i)
	}
	return ks
}

// benchLimiter starts a Limiter with the one limit benchLimit of mode m on a
// single static instance, closed in b.Cleanup. srv may be nil for Local.
func benchLimiter(b *testing.B, srv *redistest.Server, m hybrid.Mode) *hybrid.Limiter {
	b.Helper()
	return benchLimiterWith(b, srv, m, nil)
}

// benchLimiterWith is benchLimiter with its metrics registered with reg
// (nil: none).
func benchLimiterWith(b *testing.B, srv *redistest.Server, m hybrid.Mode, reg prometheus.Registerer) *hybrid.Limiter {
	b.Helper()
	cfg := hybrid.Config{
		Registerer: reg,
		Members:    membership.NewStatic("bench-1", 1),
		Limits: []hybrid.Limit{{
			Name: benchLimit, Rate: benchRate, Burst: benchBurst, Mode: m, OnOutage: hybrid.FailLocal,
		}},
	}
	return startBench(b, srv, cfg)
}

// startBench starts a Limiter with cfg, on srv's Redis unless srv is nil,
// and closes it in b.Cleanup, failing the benchmark if Close fails.
func startBench(b *testing.B, srv *redistest.Server, cfg hybrid.Config) *hybrid.Limiter {
	b.Helper()
	if srv != nil {
		cfg.Redis = srv.Client(b)
	}
	l, err := hybrid.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			b.Error(err)
		}
	})
	return l
}

// benchWarm decides once on every key, waits until the lease loop has put
// leases in force, then until every key decides on its lease, so that the
// benchmark measures the leased path rather than the cold start.
func benchWarm(b *testing.B, l *hybrid.Limiter, keys []string) {
	b.Helper()
	ctx := context.Background()
	// A key is worth a lease once the tokens asked for on it, denied ones
	// included, measure demand enough: take the whole burst twice in a
	// row, two exact decisions, and the next tick asks for a lease.
	ask := func(k string) {
		for range 2 {
			if _, err := l.AllowN(ctx, benchLimit, k, benchBurst); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, k := range keys {
		ask(k)
	}
	deadline := time.Now().Add(30 * time.Second)
	poll := func(what string) {
		b.Helper()
		if time.Now().After(deadline) {
			b.Fatalf("not within 30s: %s", what)
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	// Every round decides on every key still waiting, so that none sits
	// idle long enough to give its lease back while others wait on theirs
	// (on a busy machine a round can take a while), and a key still
	// without a lease after a second asks again (its ask, or its grant,
	// may have come and gone in the meantime).
	pending, asked := keys, time.Now()
	for {
		var still []string
		for _, k := range pending {
			d, err := l.Allow(ctx, benchLimit, k)
			if err != nil {
				b.Fatal(err)
			}
			if d.Source != hybrid.SourceLease {
				still = append(still, k)
			}
		}
		if pending = still; len(pending) == 0 {
			break
		}
		if time.Since(asked) > time.Second {
			for _, k := range pending {
				ask(k)
			}
			asked = time.Now()
		}
		poll(fmt.Sprintf("%d keys deciding on their leases (first: %s)", len(pending), pending[0]))
	}
	// A lease follows the key's measured demand, so a key that jumps from
	// one decision to millions per second is denied until renewals catch
	// up. Drive the keys at full speed until a whole round of decisions is
	// admitted, as it would be in a service that has been running a while.
	for {
		denied, ops := 0, 0
		for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
			for range 100 {
				d, err := l.Allow(ctx, benchLimit, keys[ops%len(keys)])
				if err != nil {
					b.Fatal(err)
				}
				if !d.Allowed {
					denied++
				}
				ops++
			}
		}
		if denied == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("leases did not catch up with demand within 30s: %d of %d decisions denied in the last 100ms", denied, ops)
		}
	}
}

// benchCheck fails the benchmark if the limit went degraded during the run,
// which would mean it measured the outage policy instead.
func benchCheck(b *testing.B, l *hybrid.Limiter) {
	b.Helper()
	st, err := l.Status(benchLimit)
	if err != nil {
		b.Fatal(err)
	}
	if st.Degraded {
		b.Fatalf("limit %s degraded during the run: Redis was unreachable", benchLimit)
	}
}

// mapLimiter is the obvious hand-written keyed limiter: one map of
// x/time/rate limiters behind one mutex.
type mapLimiter struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter // guarded by mu
}

func newMapLimiter(keys []string) *mapLimiter {
	ml := &mapLimiter{m: make(map[string]*rate.Limiter, len(keys))}
	for _, k := range keys {
		ml.m[k] = rate.NewLimiter(benchRate, benchBurst)
	}
	return ml
}

func (ml *mapLimiter) allow(key string) bool {
	ml.mu.Lock()
	lim := ml.m[key]
	if lim == nil {
		lim = rate.NewLimiter(benchRate, benchBurst)
		ml.m[key] = lim
	}
	ml.mu.Unlock()
	return lim.AllowN(time.Now(), 1)
}

// benchLoop decides on keys in turn until b.Loop ends and reports the
// fraction admitted, the fraction decided on a lease, and the CPU time.
func benchLoop(b *testing.B, l *hybrid.Limiter, keys []string) {
	b.Helper()
	ctx := context.Background()
	var ops, admitted, leased int
	i := 0
	cpu := startCPU()
	for b.Loop() {
		d, err := l.Allow(ctx, benchLimit, keys[i])
		if err != nil {
			b.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
		if d.Source == hybrid.SourceLease {
			leased++
		}
		ops++
		if i++; i == len(keys) {
			i = 0
		}
	}
	cpu.report(b)
	b.ReportMetric(float64(admitted)/float64(ops), "admitted/op")
	b.ReportMetric(float64(leased)/float64(ops), "leased/op")
}

// cpuClock measures the CPU time the whole process uses from startCPU on:
// on a machine shared with other work, wall-clock ns/op grows with the
// time the benchmark waits for a core, and CPU time does not. It counts
// the lease loop and the garbage collector as well: they are part of what
// a decision costs.
type cpuClock struct {
	start time.Duration
	ok    bool
}

func startCPU() cpuClock {
	t, ok := cpuTime()
	return cpuClock{t, ok}
}

// report reports the CPU time per operation since c started, in
// cpu-ns/op. In a parallel benchmark it adds up every core's time.
func (c cpuClock) report(b *testing.B) {
	b.Helper()
	if t, ok := cpuTime(); ok && c.ok && b.N > 0 {
		b.ReportMetric(float64(t-c.start)/float64(b.N), "cpu-ns/op")
	}
}

// benchParallel decides on keys from every goroutine, each starting at its
// own key, and reports the fraction admitted.
func benchParallel(b *testing.B, keys []string, allow func(key string) (bool, error)) {
	b.Helper()
	var start, ops, admitted atomic.Int64
	b.ResetTimer()
	cpu := startCPU()
	b.RunParallel(func(pb *testing.PB) {
		i := int(start.Add(131)) % len(keys)
		var n, ok int64
		for pb.Next() {
			allowed, err := allow(keys[i])
			if err != nil {
				b.Error(err)
				return
			}
			if allowed {
				ok++
			}
			n++
			if i++; i == len(keys) {
				i = 0
			}
		}
		ops.Add(n)
		admitted.Add(ok)
	})
	cpu.report(b)
	b.ReportMetric(float64(admitted.Load())/float64(max(ops.Load(), 1)), "admitted/op")
}

// BenchmarkAllow compares the decision cost of each mode with bare
// x/time/rate limiters. mode=hybrid decides on a leased share (the lease
// loop runs against a real Redis in the background); mode=global makes one
// Redis round trip per decision, the classic design.
func BenchmarkAllow(b *testing.B) {
	srv := redistest.Start(b)
	one, thousand := benchKeyList(1), benchKeyList(1000)

	b.Run("baseline=rate.Limiter/keys=1", func(b *testing.B) {
		b.ReportAllocs()
		lim := rate.NewLimiter(benchRate, benchBurst)
		admitted, ops := 0, 0
		cpu := startCPU()
		for b.Loop() {
			if lim.AllowN(time.Now(), 1) {
				admitted++
			}
			ops++
		}
		cpu.report(b)
		b.ReportMetric(float64(admitted)/float64(ops), "admitted/op")
	})
	b.Run("baseline=rate.Limiter+map/keys=1000", func(b *testing.B) {
		b.ReportAllocs()
		ml := newMapLimiter(thousand)
		admitted, ops, i := 0, 0, 0
		cpu := startCPU()
		for b.Loop() {
			if ml.allow(thousand[i]) {
				admitted++
			}
			ops++
			if i++; i == len(thousand) {
				i = 0
			}
		}
		cpu.report(b)
		b.ReportMetric(float64(admitted)/float64(ops), "admitted/op")
	})
	b.Run("mode=local/keys=1", func(b *testing.B) {
		b.ReportAllocs()
		l := benchLimiter(b, nil, hybrid.Local)
		benchLoop(b, l, one)
	})
	b.Run("mode=hybrid/keys=1", func(b *testing.B) {
		b.ReportAllocs()
		l := benchLimiter(b, srv, hybrid.Hybrid)
		benchWarm(b, l, one)
		benchLoop(b, l, one)
		benchCheck(b, l)
	})
	// "share" is version 2's placement, which version 3 does not have:
	// without benchWarm every key starts exact, a script against its pool
	// per decision, and leases once the loop finds it worth one, so these
	// runs mix exact and leased decisions (leased/op says how many).
	b.Run("mode=hybrid/share/keys=1", func(b *testing.B) {
		b.ReportAllocs()
		l := benchLimiter(b, srv, hybrid.Hybrid)
		benchLoop(b, l, one)
		benchCheck(b, l)
	})
	b.Run("mode=hybrid/share/keys=1000", func(b *testing.B) {
		b.ReportAllocs()
		l := benchLimiter(b, srv, hybrid.Hybrid)
		benchLoop(b, l, thousand)
		benchCheck(b, l)
	})
	b.Run("mode=hybrid/keys=1000", func(b *testing.B) {
		b.ReportAllocs()
		l := benchLimiter(b, srv, hybrid.Hybrid)
		benchWarm(b, l, thousand)
		benchLoop(b, l, thousand)
		benchCheck(b, l)
	})
	// With metrics: every decision is counted, as in a service that
	// exports them.
	b.Run("mode=hybrid/share/keys=1000/metrics", func(b *testing.B) {
		b.ReportAllocs()
		l := benchLimiterWith(b, srv, hybrid.Hybrid, prometheus.NewRegistry())
		benchLoop(b, l, thousand)
		benchCheck(b, l)
	})
	b.Run("mode=global/keys=1", func(b *testing.B) {
		b.ReportAllocs()
		l := benchLimiter(b, srv, hybrid.Global)
		// Load the script and check the decisions are Redis's own.
		d, err := l.Allow(context.Background(), benchLimit, one[0])
		if err != nil {
			b.Fatal(err)
		}
		if d.Source != hybrid.SourceGlobal {
			b.Fatalf("warm-up decided by %v, want %v", d.Source, hybrid.SourceGlobal)
		}
		benchLoop(b, l, one)
		benchCheck(b, l)
	})

	// The parallel variants spread all goroutines over 1000 keys.
	b.Run("baseline=rate.Limiter+map/parallel", func(b *testing.B) {
		b.ReportAllocs()
		ml := newMapLimiter(thousand)
		benchParallel(b, thousand, func(key string) (bool, error) { return ml.allow(key), nil })
	})
	// Each placement in parallel without and with metrics registered: a
	// service that exports them counts every decision.
	for _, placement := range []string{"", "/share"} {
		for _, metrics := range []bool{false, true} {
			name := "mode=hybrid" + placement + "/parallel"
			if metrics {
				name += "/metrics"
			}
			b.Run(name, func(b *testing.B) {
				b.ReportAllocs()
				var reg prometheus.Registerer
				if metrics {
					reg = prometheus.NewRegistry()
				}
				l := benchLimiterWith(b, srv, hybrid.Hybrid, reg)
				if placement == "" {
					benchWarm(b, l, thousand) // the lease placement
				}
				ctx := context.Background()
				benchParallel(b, thousand, func(key string) (bool, error) {
					d, err := l.Allow(ctx, benchLimit, key)
					return d.Allowed, err
				})
				b.StopTimer()
				benchCheck(b, l)
			})
		}
	}
}
