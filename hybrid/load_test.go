package hybrid_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// TestLoadManyKeys is the load and resources case: 64 goroutines
// make a fixed number of decisions over 10 000 keys on four instances (run
// it under -race): invariant 1 holds on every key, and once the keys go
// idle they are evicted, their leases leave Redis, and the heap returns to
// where it started.
func TestLoadManyKeys(t *testing.T) {
	const (
		instances  = 4
		goroutines = 64
		numKeys    = 10_000
		decisions  = 250_000
		// Per key: about 25 decisions over a run of a few seconds, well
		// above what the limit admits, so that the bound is what is tested
		// (four instances each admitting the whole rate would break it).
		rate  = 1.0
		burst = 2
	)
	srv := redistest.Start(t)
	lim := hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	const idle = time.Second
	var clients []*redis.Client
	inst := clusterEach(t, srv, instances, func(_ int, c *hybrid.Config) {
		c.IdleAfter = idle
		c.UncontendedTTL = 2 * time.Second
		clients = append(clients, c.Redis.(*redis.Client))
	}, lim)
	conns := func() int {
		n := 0
		for _, c := range clients {
			n += int(c.PoolStats().TotalConns)
		}
		return n
	}
	ks := keys(numKeys)
	// Keys decided exactly take a connection each: the clients' pools grow
	// to the goroutines' concurrency and stay so (go-redis closes idle
	// connections only as it takes them). Grown first, they are not what
	// the heap is compared for.
	var warm sync.WaitGroup
	for g := range goroutines {
		warm.Go(func() {
			for i := range 20 {
				_, _ = inst[g%instances].Allow(context.Background(), "api", fmt.Sprint("warm-", g, "-", i))
			}
		})
	}
	warm.Wait()

	start, startConns := heapAfterGC(), conns()
	base := ourGoroutines()

	type admission struct {
		key int32
		at  time.Duration
	}
	logs := make([][]admission, goroutines)
	var wg sync.WaitGroup
	begin := time.Now()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := inst[g%instances]
			rnd := rand.New(rand.NewPCG(uint64(g), 42))
			ctx := context.Background()
			for range decisions / goroutines {
				k := rnd.IntN(numKeys)
				d, err := l.Allow(ctx, "api", ks[k])
				if err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
				if d.Allowed {
					logs[g] = append(logs[g], admission{int32(k), time.Since(begin)})
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin)

	keysHeld := 0
	for _, l := range inst {
		st, _ := l.Status("api")
		keysHeld += st.Keys
	}
	held := heapAfterGC()
	perKey := make([][]time.Duration, numKeys)
	total := 0
	for _, lg := range logs {
		for _, a := range lg {
			perKey[a.key] = append(perKey[a.key], a.at)
			total++
		}
	}
	logs = nil
	t.Logf("%d decisions in %v (%.0f/s), %d admitted; %d keys held over %d instances",
		decisions, elapsed.Round(time.Millisecond), decisions/elapsed.Seconds(), total, keysHeld, instances)

	// Invariant 1 per key, with an allowance kept from version 2, where
	// each instance could start a key at its default share before Redis
	// counted it (cold). Version 3 has no such start (a key's first
	// decisions are exact against its pool), so cold only loosens the
	// bound; the numbers are unchanged.
	tick := hybrid.DefaultConfig(nil, nil).Tick
	cold := float64(instances) * (max(1, float64(burst/instances)) + rate/instances*tick.Seconds())
	for _, w := range []time.Duration{100 * time.Millisecond, time.Second, elapsed} {
		bound := rate*w.Seconds() + burst + cold + instances
		worst := 0
		for k, adm := range perKey {
			slices.Sort(adm)
			got := maxInWindow(adm, w)
			worst = max(worst, got)
			if float64(got) > bound {
				t.Errorf("key %s: %d admitted in a %v window, bound %.1f", ks[k], got, w, bound)
				break
			}
		}
		t.Logf("window %v: at most %d admitted on a key, bound %.1f", w, worst, bound)
	}
	perKey = nil

	// Idle keys are evicted after IdleAfter, and their leases leave Redis
	// (released or run out).
	eventually(t, idle+10*time.Second, "every key evicted", func() bool {
		for _, l := range inst {
			if st, _ := l.Status("api"); st.Keys != 0 || st.LeasedRate != 0 {
				return false
			}
		}
		return true
	})
	rdb := srv.Client(t)
	eventually(t, 10*time.Second, "no lease left in Redis", func() bool {
		held, err := rdb.Keys(context.Background(), "hybridlimit:v4:*").Result()
		return err == nil && len(held) == 0
	})
	// What a limiter keeps once its keys are gone is a few fixed-size
	// structures; anything proportional to the keys it held would be
	// megabytes. Buffers sized for a burst are given back after a couple of
	// seconds of smaller batches. The clients' pools may have grown past
	// the warm-up's on a slow machine: each connection they opened since
	// holds its read and write buffers. What stays measured 0.5-1.1 MiB
	// above the start with 7 500-8 800 keys held (alone and in CI; not yet
	// explained); a whole entry per key held would be 5 MiB.
	var end uint64
	var allowed uint64
	deadline := time.Now().Add(10 * time.Second)
	for {
		end, allowed = heapAfterGC(), start+2<<20+uint64(max(0, conns()-startConns))*connBuffers
		if end <= allowed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("heap %.1f MiB once the keys were evicted, %.1f MiB at the start (%d connections, %d now), %.1f MiB with the keys held: want at most %.1f MiB",
				mib(end), mib(start), startConns, conns(), mib(held), mib(allowed))
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	t.Logf("heap: %.1f MiB at the start, %.1f MiB with the keys held, %.1f MiB once they were evicted; %d connections at the start, %d at the end",
		mib(start), mib(held), mib(end), startConns, conns())
	eventually(t, 5*time.Second, "the limiter's goroutines back to what they were", func() bool { return ourGoroutines() <= base })
}

// heapAfterGC returns the bytes of live heap objects after a full
// collection.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC() // the first may leave objects freed only by finalizers
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// connBuffers is what a go-redis connection holds: a read and a write
// buffer of 32 KiB each.
const connBuffers = 64 << 10

func mib(b uint64) float64 { return float64(b) / (1 << 20) }
