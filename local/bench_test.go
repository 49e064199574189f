package local_test

import (
	"fmt"
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

// BenchmarkAllowN compares local.Limiter with a bare x/time/rate Limiter,
// the cost floor of any decision it makes. Every variant reads the clock
// once per decision, as a caller would. The parallel variants share one hot
// key between all goroutines, the worst case for lock contention.
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
	b.Run("impl=local/keys=1000/parallel", func(b *testing.B) {
		b.ReportAllocs()
		l := newBenchLimiter(b)
		keys := benchKeys(1000)
		for _, k := range keys {
			l.Allow(time.Now(), k)
		}
		b.ResetTimer()
		var goroutines atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			// Each goroutine starts at its own key, so that they do not
			// march over the keys in step.
			i := int(goroutines.Add(1)*131) % len(keys)
			for pb.Next() {
				l.AllowN(time.Now(), keys[i], 1)
				if i++; i == len(keys) {
					i = 0
				}
			}
		})
	})
}
