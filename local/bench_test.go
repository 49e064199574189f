package local_test

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybridlimit/local"
)

// The benchmarked limits are so generous that every decision is admitted:
// the benchmarks measure the cost of deciding, not of being denied.
const (
	benchLimit = rate.Limit(1e9)
	benchBurst = 1_000_000
)

// benchKeys returns n distinct keys, generated before the timer starts.
func benchKeys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("user-%06d", i)
	}
	return ks
}

func newBenchLimiter(b *testing.B) *local.Limiter {
	b.Helper()
	l, err := local.New(local.Config{Limit: benchLimit, Burst: benchBurst})
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// mapLimiter is the obvious hand-written keyed limiter, the baseline the
// targets are set against: one map of x/time/rate limiters behind one mutex.
type mapLimiter struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter // guarded by mu
}

func newMapLimiter() *mapLimiter {
	return &mapLimiter{m: make(map[string]*rate.Limiter)}
}

func (ml *mapLimiter) allowN(t time.Time, key string, n int) bool {
	ml.mu.Lock()
	lim := ml.m[key]
	if lim == nil {
		lim = rate.NewLimiter(benchLimit, benchBurst)
		ml.m[key] = lim
	}
	ml.mu.Unlock()
	return lim.AllowN(t, n)
}

// BenchmarkAllowN compares local.Limiter with a bare x/time/rate Limiter,
// the cost floor of any decision it makes, and with mapLimiter. Every
// variant reads the clock once per decision, as a caller would. The
// parallel variants on one key share it between all goroutines, the worst
// case for lock contention.
func BenchmarkAllowN(b *testing.B) {
	b.Run("impl=rate/keys=1", func(b *testing.B) {
		b.ReportAllocs()
		lim := rate.NewLimiter(benchLimit, benchBurst)
		for b.Loop() {
			lim.AllowN(time.Now(), 1)
		}
	})
	b.Run("impl=local/keys=1", func(b *testing.B) {
		b.ReportAllocs()
		l := newBenchLimiter(b)
		l.Allow(time.Now(), "user-000000") // create the key outside the loop
		for b.Loop() {
			l.AllowN(time.Now(), "user-000000", 1)
		}
	})
	b.Run("impl=local/keys=1000", func(b *testing.B) {
		b.ReportAllocs()
		l := newBenchLimiter(b)
		keys := benchKeys(1000)
		for _, k := range keys {
			l.Allow(time.Now(), k)
		}
		i := 0
		for b.Loop() {
			l.AllowN(time.Now(), keys[i], 1)
			if i++; i == len(keys) {
				i = 0
			}
		}
	})
	b.Run("impl=map/keys=1000", func(b *testing.B) {
		b.ReportAllocs()
		ml := newMapLimiter()
		keys := benchKeys(1000)
		for _, k := range keys {
			ml.allowN(time.Now(), k, 1)
		}
		i := 0
		for b.Loop() {
			ml.allowN(time.Now(), keys[i], 1)
			if i++; i == len(keys) {
				i = 0
			}
		}
	})
	b.Run("impl=rate/parallel", func(b *testing.B) {
		b.ReportAllocs()
		lim := rate.NewLimiter(benchLimit, benchBurst)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				lim.AllowN(time.Now(), 1)
			}
		})
	})
	b.Run("impl=local/parallel", func(b *testing.B) {
		b.ReportAllocs()
		l := newBenchLimiter(b)
		l.Allow(time.Now(), "user-000000")
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.AllowN(time.Now(), "user-000000", 1)
			}
		})
	})
	// Many keys spread over the shards: what the sharded map is for.
	b.Run("impl=map/keys=1000/parallel", func(b *testing.B) {
		b.ReportAllocs()
		ml := newMapLimiter()
		benchParallel(b, benchKeys(1000), ml.allowN)
	})
	b.Run("impl=local/keys=1000/parallel", func(b *testing.B) {
		b.ReportAllocs()
		l := newBenchLimiter(b)
		benchParallel(b, benchKeys(1000), func(t time.Time, key string, n int) bool {
			return l.AllowN(t, key, n).Allowed
		})
	})
}

// benchParallel creates keys with one decision each, then decides on them
// from every goroutine until the benchmark ends.
func benchParallel(b *testing.B, keys []string, allowN func(t time.Time, key string, n int) bool) {
	b.Helper()
	for _, k := range keys {
		allowN(time.Now(), k, 1)
	}
	b.ResetTimer()
	var goroutines atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		// Each goroutine starts at its own key, so that they do not
		// march over the keys in step.
		i := int(goroutines.Add(1)*131) % len(keys)
		for pb.Next() {
			allowN(time.Now(), keys[i], 1)
			if i++; i == len(keys) {
				i = 0
			}
		}
	})
}

// memoryKeys is how many keys BenchmarkMemory holds, as package hybrid's
// does: enough that the fixed cost of a Limiter is nothing per key. The
// growth steps of the tables do not average out: each is measured where it
// happens to stand at this count.
const memoryKeys = 200_000

// BenchmarkMemory reports the heap each key takes, in bytes/key, after one
// decision on each of memoryKeys keys, against mapLimiter holding the same
// keys. The key strings are made before measuring and shared by both, so
// neither is charged for them. Its ns/op is the time to create the keys.
// Run it with -benchtime 1x: the figure does not depend on b.N.
func BenchmarkMemory(b *testing.B) {
	keys := benchKeys(memoryKeys)
	b.Run("impl=map", func(b *testing.B) {
		benchMemory(b, keys, func(t time.Time) any {
			ml := newMapLimiter()
			for _, k := range keys {
				ml.allowN(t, k, 1)
			}
			return ml
		})
	})
	b.Run("impl=local", func(b *testing.B) {
		benchMemory(b, keys, func(t time.Time) any {
			l := newBenchLimiter(b)
			for _, k := range keys {
				l.AllowN(t, k, 1)
			}
			return l
		})
	})
}

// benchMemory reports the heap that what fill returns holds, per key.
func benchMemory(b *testing.B, keys []string, fill func(t time.Time) any) {
	b.Helper()
	var perKey float64
	for b.Loop() {
		b.StopTimer()
		before := heapAlloc()
		b.StartTimer()
		held := fill(time.Now())
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
