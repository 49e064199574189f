package global_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// BenchmarkScripts times one call of each decision script against a real
// Redis, one after another: the Global token bucket (tokenbucket.lua) and
// a Hybrid key's exact take (take.lua) on a hash that holds the records of
// four instances, as a sprayed key's does. The difference is what the
// exact placement's decisions pay beyond a Global one's round trip.
func BenchmarkScripts(b *testing.B) {
	srv := redistest.Start(b)
	store := global.New(srv.Client(b), "")
	ctx := context.Background()
	const rate, burst = 1e9, 1 << 30 // never denies
	b.Run("tokenbucket", func(b *testing.B) {
		for b.Loop() {
			if _, err := store.TakeN(ctx, "bench", "k", rate, burst, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("take, 4 records", func(b *testing.B) {
		take := func(inst string, asked int64) {
			if _, err := store.TakePool(ctx, global.PoolTake{Limit: "bench", Key: "k", Instance: inst, Gen: 1,
				Rate: rate, Burst: burst, Instances: 4, N: 1, TTL: time.Minute, Asked: asked}); err != nil {
				b.Fatal(err)
			}
		}
		for i := range 4 {
			take(fmt.Sprintf("instance-%d", i), 1)
		}
		var asked int64 = 1
		for b.Loop() {
			asked++
			take("instance-0", asked)
		}
	})
}
