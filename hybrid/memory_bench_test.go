package hybrid_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// memoryKeys is how many keys BenchmarkMemory holds: enough that the fixed
// cost of a Limiter and the growth steps of its maps average out.
const memoryKeys = 200_000

// BenchmarkMemory reports the heap each key takes, in bytes/key, after one
// decision on each of memoryKeys keys: for a Limiter with one Local limit,
// one with one Hybrid limit (once the lease loop has asked Redis for every
// key, so that what it keeps per key is counted), and the hand-written map
// of limiters holding the same keys. The key strings are made before
// measuring and shared by all, so none is charged for them. Run it with
// -benchtime 1x: the figure does not depend on b.N, and ns/op is the time
// to create the keys.
func BenchmarkMemory(b *testing.B) {
	srv := redistest.Start(b)
	keys := benchKeyList(memoryKeys)
	ctx := context.Background()

	b.Run("baseline=rate.Limiter+map", func(b *testing.B) {
		benchMemory(b, keys, func(b *testing.B) any {
			return newMapLimiter(keys)
		})
	})
	for _, m := range []hybrid.Mode{hybrid.Local, hybrid.Hybrid} {
		b.Run("mode="+m.String(), func(b *testing.B) {
			benchMemory(b, keys, func(b *testing.B) any {
				var s *redistest.Server
				if m != hybrid.Local {
					s = srv
				}
				l := benchLimiter(b, s, m)
				for _, k := range keys {
					// Twice the whole burst: the second is denied by the
					// default share, so a Hybrid key asks for a lease.
					for range 2 {
						if _, err := l.AllowN(ctx, benchLimit, k, benchBurst); err != nil {
							b.Fatal(err)
						}
					}
				}
				if m != hybrid.Local {
					benchAsked(b, l, len(keys))
				}
				return l
			})
		})
	}
}

// benchAsked waits until l has sent at least n Redis commands for
// benchLimit: one lease request per key.
func benchAsked(b *testing.B, l *hybrid.Limiter, n int) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := l.Status(benchLimit)
		if err != nil {
			b.Fatal(err)
		}
		if st.RedisCommands >= uint64(n) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d Redis commands within a minute, want a lease request for each of %d keys", st.RedisCommands, n)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

// benchMemory reports the heap that what fill returns holds, per key. What
// fill returns stays reachable until the heap has been measured; a Limiter
// is closed by the b.Cleanup of benchLimiter, after the measurement.
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
