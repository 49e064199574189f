package hybrid_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// TestHeldLightInstanceYields: end to end, two instances and a real Redis.
// A light instance that holds a lease of a key (its clients' burst went
// past its default part of the burst) while its peer wants twice the
// limit yields to its own demand: its record in Redis turns from a lease,
// which lives at most UncontendedTTL, into a yield record, which lives
// yieldLife UncontendedTTLs, granted about what it uses; the peer's lease
// grows into the rest. Without heldYields it renewed a contended lease
// every few ticks for as long as the peer was starved.
func TestHeldLightInstanceYields(t *testing.T) {
	srv := redistest.Start(t)
	const limitRate, limitBurst = 100.0, 20 // 50/s and 10 tokens a default share
	const lightRate = 5.0                   // a tenth of its share
	lim := hybrid.Limit{Name: "api", Rate: limitRate, Burst: limitBurst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	const uttl = 5 * time.Second // a yield record lives twice that
	inst := cluster(t, srv, 2, func(c *hybrid.Config) { c.UncontendedTTL = uttl }, lim)
	heavy, light := inst[0], inst[1]
	rdb := srv.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	// The light instance's clients send 15 requests at once: 10 admitted
	// by its default part of the burst, and its share asks for a lease.
	for range 15 {
		if _, err := light.Allow(ctx, "api", "k"); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "a lease record of the light instance", func() bool {
		r, ok := leaseRecords(t, rdb, "api", "k")["instance-1"]
		return ok && r.lives <= uttl
	})
	// Then lightRate there, and twice the limit on the heavy instance.
	pace := func(l *hybrid.Limiter, perSec float64) {
		wg.Go(func() {
			every := time.Duration(float64(time.Second) / perSec)
			for next := time.Now(); ctx.Err() == nil; next = next.Add(every) {
				time.Sleep(time.Until(next)) // the arrivals' schedule
				if _, err := l.Allow(ctx, "api", "k"); err != nil && ctx.Err() == nil {
					t.Error(err)
					return
				}
			}
		})
	}
	pace(light, lightRate)
	pace(heavy, 2*limitRate)

	var last leaseRecord
	eventually(t, 20*time.Second, "a yield record of the light instance (living longer than UncontendedTTL)", func() bool {
		r, ok := leaseRecords(t, rdb, "api", "k")["instance-1"]
		last = r
		return ok && r.lives > uttl
	})
	// What it kept: its demand with headroom, well below its share.
	if last.granted < lightRate || last.granted > 2*lightRate {
		t.Errorf("the yield record grants %v; want about %v, the light instance's demand with headroom", last.granted, lightRate)
	}
	// The heavy instance's lease grows into what the light one gave up.
	eventually(t, 10*time.Second, "the heavy instance granted what the light one left", func() bool {
		return leasesOf(t, rdb, "api", "k")["instance-0"] >= limitRate-2*lightRate
	})
}
