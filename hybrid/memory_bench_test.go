package hybrid_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// memoryKeys is how many keys BenchmarkMemory holds, the count the
// memory target is set at: enough that the fixed cost of a Limiter is
// nothing per key, few enough that the whole benchmark runs in under a
// minute (the lease placement, two rounds of Redis calls per key, takes
// most of it). The growth steps of the maps do not average out: each
// placement is measured where its tables happen to stand at this count.
const memoryKeys = 200_000

// memoryProbe is the second limit of the Limiters BenchmarkMemory measures,
// which shows that the loop has ticked (see memoryTicks).
const memoryProbe = "probe"

// memoryRound is how many keys of the lease placement BenchmarkMemory
// makes worth a lease before it waits (see benchAsked).
const memoryRound = 10_000

// memorySettle is how many ticks BenchmarkMemory lets pass before it
// measures: more than the loop takes to give back the buffers of a round of
// requests for every key (shrinkAfter), so that what is measured is what
// the keys hold, not the peak of their first round.
const memorySettle = 45

// BenchmarkMemory reports the heap each key takes, in bytes/key, with
// memoryKeys keys held: for the hand-written map of limiters holding the
// same keys (the baseline), a Limiter with one Local limit, and one with a
// Hybrid limit whose keys are all in one placement. In the lease placement
// each key is made worth a lease (two whole-burst decisions) and holds
// one; in the exact placement each makes one exact decision, and the
// policy keeps what it keeps of a key not worth a lease. Both then let
// memorySettle ticks pass, so that the buffers of the first round are
// given back. The key strings are made before measuring and shared by
// all, so none is charged for them. Run it with -benchtime 1x: the figure
// does not depend on b.N, and ns/op is the time to fill the keys.
func BenchmarkMemory(b *testing.B) {
	srv := redistest.Start(b)
	keys := benchKeyList(memoryKeys)
	ctx := context.Background()

	b.Run("baseline=rate.Limiter+map", func(b *testing.B) {
		benchMemory(b, keys, func(b *testing.B) any {
			return newMapLimiter(keys)
		})
	})
	b.Run("mode=local", func(b *testing.B) {
		benchMemory(b, keys, func(b *testing.B) any {
			l := memoryLimiter(b, nil, hybrid.Limit{Mode: hybrid.Local})
			for _, k := range keys {
				if _, err := l.Allow(ctx, benchLimit, k); err != nil {
					b.Fatal(err)
				}
			}
			return l
		})
	})
	b.Run("mode=hybrid/placement=lease", func(b *testing.B) {
		benchMemory(b, keys, func(b *testing.B) any {
			l := memoryLimiter(b, srv, hybrid.Limit{Mode: hybrid.Hybrid})
			// In rounds of memoryRound keys: a pipeline of a request for
			// every key would outlast the client's read timeout.
			for i, k := range keys {
				// Twice the whole burst, exact decisions: the tokens
				// asked for make the key worth a lease at the next tick.
				for range 2 {
					if _, err := l.AllowN(ctx, benchLimit, k, benchBurst); err != nil {
						b.Fatal(err)
					}
				}
				if i+1 == len(keys) || (i+1)%memoryRound == 0 {
					benchAsked(b, l, i+1)
				}
			}
			memoryTicks(b, l, memorySettle)
			if st, _ := l.Status(benchLimit); st.FailingKeys != 0 || !(st.LeasedRate > 0) {
				b.Fatalf("leased rate %v, %d failing keys: want the keys leased", st.LeasedRate, st.FailingKeys)
			}
			return l
		})
	})
	b.Run("mode=hybrid/placement=exact", func(b *testing.B) {
		benchMemory(b, keys, func(b *testing.B) any {
			l := memoryLimiter(b, srv, hybrid.Limit{Mode: hybrid.Hybrid})
			// Exact decisions wait on Redis: several at a time.
			const workers = 8
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Go(func() {
					for i := w; i < len(keys); i += workers {
						if _, err := l.Allow(ctx, benchLimit, keys[i]); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			if st, _ := l.Status(benchLimit); st.RedisCommands < uint64(len(keys)) {
				b.Fatalf("%d Redis commands, want an exact decision on each of %d keys", st.RedisCommands, len(keys))
			}
			memoryTicks(b, l, memorySettle)
			return l
		})
	})
}

// memoryLimiter starts a Limiter on a single static instance with two
// limits, closed in b.Cleanup: benchLimit, lim with the benchmarks' rate
// and burst, and memoryProbe (Hybrid, unless lim is Local). Its timings
// keep every key as it was put for the length of the benchmark: none goes
// idle, and one pipeline of a request for every key fits in RedisTimeout.
// srv may be nil for a Local limit.
func memoryLimiter(b *testing.B, srv *redistest.Server, lim hybrid.Limit) *hybrid.Limiter {
	b.Helper()
	lim.Name, lim.Rate, lim.Burst, lim.OnOutage = benchLimit, benchRate, benchBurst, hybrid.FailLocal
	probe := lim
	probe.Name = memoryProbe
	cfg := hybrid.Config{
		Members:        membership.NewStatic("bench-1", 1),
		Limits:         []hybrid.Limit{lim, probe},
		Tick:           10 * time.Millisecond,
		ContendedTTL:   time.Minute,
		UncontendedTTL: 10 * time.Minute,
		RedisTimeout:   30 * time.Second,
		IdleAfter:      time.Hour,
	}
	return startBench(b, srv, cfg)
}

// memoryTicks waits until l's loop has ticked at least ticks times: each
// time, a fresh key of memoryProbe is made worth a lease (two whole-burst
// decisions, exact, sent before RedisCommands is read), and the lease ask
// that follows is sent at a tick that looked at every key decided before.
func memoryTicks(b *testing.B, l *hybrid.Limiter, ticks int) {
	b.Helper()
	ctx := context.Background()
	for i := range ticks {
		key := fmt.Sprintf("probe-%d", i)
		for range 2 {
			if _, err := l.AllowN(ctx, memoryProbe, key, benchBurst); err != nil {
				b.Fatal(err)
			}
		}
		sent := commands(b, l, memoryProbe)
		deadline := time.Now().Add(time.Minute)
		for commands(b, l, memoryProbe) == sent {
			if time.Now().After(deadline) {
				b.Fatalf("no lease ask for %s within a minute", key)
			}
			time.Sleep(time.Millisecond) // poll interval
		}
	}
}

// commands is the number of Redis commands l has sent for limit.
func commands(b *testing.B, l *hybrid.Limiter, limit string) uint64 {
	b.Helper()
	st, err := l.Status(limit)
	if err != nil {
		b.Fatal(err)
	}
	return st.RedisCommands
}

// benchAsked waits until the first n keys of benchLimit have asked for
// their leases: each sent one exact take (its second whole-burst decision
// is held in process, the pool being empty) and sends one lease ask, so
// that l has sent 2n commands for benchLimit.
func benchAsked(b *testing.B, l *hybrid.Limiter, n int) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for commands(b, l, benchLimit) < uint64(2*n) {
		if time.Now().After(deadline) {
			b.Fatalf("%d Redis commands within a minute, want an exact take and a lease ask for each of %d keys",
				commands(b, l, benchLimit), n)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

// benchMemory reports the heap that what fill returns holds, per key. What
// fill returns stays reachable until the heap has been measured; a Limiter
// is closed by the b.Cleanup of memoryLimiter, after the measurement.
func benchMemory(b *testing.B, keys []string, fill func(b *testing.B) any) {
	b.Helper()
	var perKey float64
	for b.Loop() {
		b.StopTimer()
		before := heapAlloc()
		b.StartTimer()
		held := fill(b)
		b.StopTimer()
		perKey = float64(heapAlloc()-before) / float64(len(keys))
		runtime.KeepAlive(held)
		b.StartTimer()
	}
	b.ReportMetric(perKey, "bytes/key")
}

// heapAlloc returns the bytes of live heap objects after a full collection.
func heapAlloc() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
