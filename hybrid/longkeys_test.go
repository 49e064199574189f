package hybrid_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// longKey is the i-th of a client's hostile keys: 900 KiB, differing only
// in their last bytes.
func longKey(i int) string {
	return strings.Repeat("x", 900<<10) + fmt.Sprintf("-%08d", i)
}

// heapInUse returns the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// Keys longer than MaxKeyBytes are held as digests: 50 keys of 900 KiB
// grow the heap by less than 1 MiB in every mode (held whole, they took
// 44 MiB), and each still has its own bucket.
func TestLongKeysAreHeldAsDigests(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	for _, mode := range []hybrid.Mode{hybrid.Local, hybrid.Global, hybrid.Hybrid} {
		t.Run(mode.String(), func(t *testing.T) {
			l := newLimiter(t, hybrid.Config{Redis: fastClient(t, srv), Prefix: "long-" + mode.String(), Limits: []hybrid.Limit{
				{Name: "api", Rate: 1, Burst: 1, Mode: mode, OnOutage: hybrid.FailLocal},
			}})
			before := heapInUse()
			for i := range 50 {
				if d, err := l.Allow(ctx, "api", longKey(i)); err != nil || !d.Allowed {
					t.Fatalf("key %d: first request %+v, %v: want admitted", i, d, err)
				}
			}
			grown := int64(heapInUse()) - int64(before)
			t.Logf("heap grown by %d bytes for 50 keys of 900 KiB", grown)
			if grown > 1<<20 {
				t.Errorf("50 keys of 900 KiB grew the heap by %d bytes, want under 1 MiB", grown)
			}
			// Each long key is its own bucket, and so is a short key that
			// spells a long key's digest.
			if d, _ := l.Allow(ctx, "api", longKey(0)); d.Allowed {
				t.Error("a long key's second request within its burst of 1 was admitted")
			}
			sum := sha256.Sum256([]byte(longKey(0)))
			if d, err := l.Allow(ctx, "api", "#"+hex.EncodeToString(sum[:])); err != nil || !d.Allowed {
				t.Errorf("the text of a long key's digest shares its bucket: %+v, %v", d, err)
			}
			// Through the middleware, a client's header as its key.
			h := hybrid.Middleware(l, "api", byHeader)(http.NotFoundHandler())
			before = heapInUse()
			for i := range 50 {
				serve(t, h, longKey(100+i))
			}
			if grown := int64(heapInUse()) - int64(before); grown > 1<<20 {
				t.Errorf("50 keys of 900 KiB through the middleware grew the heap by %d bytes, want under 1 MiB", grown)
			}
		})
	}
}

// BenchmarkLongKeys reports the heap that 50 keys of 900 KiB take in a
// Local limit (heap-bytes), and 50 short keys for comparison. Run it with
// -benchtime 1x.
func BenchmarkLongKeys(b *testing.B) {
	for _, tc := range []struct {
		name string
		key  func(int) string
	}{{"900KiB", longKey}, {"short", func(i int) string { return fmt.Sprintf("client-%08d", i) }}} {
		b.Run(tc.name, func(b *testing.B) {
			var grown int64
			for range b.N {
				l := newLimiter(b, hybrid.Config{Limits: []hybrid.Limit{
					{Name: "api", Rate: 1, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
				}})
				before := heapInUse()
				for i := range 50 {
					if _, err := l.Allow(context.Background(), "api", tc.key(i)); err != nil {
						b.Fatal(err)
					}
				}
				grown = int64(heapInUse()) - int64(before)
				runtime.KeepAlive(l)
			}
			b.ReportMetric(float64(grown), "heap-bytes")
		})
	}
}
