package global_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/global"
)

func ExampleStore_RecordKey() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	store := global.New(rdb, "") // no connection is made until a command runs
	fmt.Println(store.RecordKey("api", "user-42"))
	// Output:
	// hybridlimit:v4:{api:user-42}
}

// An instance decides a key exactly, one take per request, until its
// demand is worth a lease: it then bumps its generation of the key and
// asks, taking the lease's part of the pool's tokens with it. This example
// needs a Redis server, so it is compiled but not run.
func ExampleStore_TakePool() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	store := global.New(rdb, "")
	ctx := context.Background()

	// 100 requests per second, bursts of 40, per user, over 4 instances.
	var asked int64
	gen := uint8(1) // the exact placement
	asked++
	take, err := store.TakePool(ctx, global.PoolTake{Limit: "api", Key: "user-42", Instance: "web-1", Gen: gen,
		Rate: 100, Burst: 40, Instances: 4, N: 1, TTL: 2 * time.Second, Asked: asked})
	switch {
	case err != nil:
		fmt.Println("redis could not decide:", err)
	case take.Allowed:
		fmt.Println("allowed,", take.Remaining, "left in the pool")
	default:
		fmt.Println("denied, ask again in", take.RetryAfter)
	}

	gen++ // asking for a lease: a change of placement
	out := make([]global.LeaseGrant, 1)
	if err := store.AskLeases(ctx, []global.LeaseAsk{{Limit: "api", Key: "user-42", Instance: "web-1", Gen: gen,
		Want: 60, Rate: 100, Burst: 40, Instances: 4, TTL: time.Second, Drain: true}}, out); err != nil {
		fmt.Println("redis unreachable:", err)
		return
	}
	if g := out[0]; g.Err == nil && g.Granted > 0 {
		fmt.Printf("leased %.1f tokens/s for %v, with %d tokens of the pool\n", g.Granted, g.In, g.Drained)
	}
}

// Instance "web-1" renews its leases on two keys in one round trip, saying
// what it runs until it hears the answers, and on shutdown releases them.
// This example needs a Redis server, so it is compiled but not run.
func ExampleStore_AskLeases() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	store := global.New(rdb, "")
	ctx := context.Background()

	asks := []global.LeaseAsk{
		{Limit: "api", Key: "user-42", Instance: "web-1", Gen: 3, Want: 40, Rate: 100, Burst: 40, Instances: 4,
			TTL: 500 * time.Millisecond, MaxTTL: 5 * time.Second, Running: 35, RunningFor: 120 * time.Millisecond},
		{Limit: "api", Key: "user-7", Instance: "web-1", Gen: 9, Want: 2, Rate: 100, Burst: 40, Instances: 4,
			TTL: 5 * time.Second, MaxTTL: 5 * time.Second, Running: 2, RunningFor: 3 * time.Second},
	}
	out := make([]global.LeaseGrant, len(asks))
	if err := store.AskLeases(ctx, asks, out); err != nil {
		fmt.Println("redis unreachable:", err)
		return
	}
	for i, g := range out {
		switch {
		case g.Err != nil:
			fmt.Println(asks[i].Key, "failed:", g.Err)
		case g.Stale:
			fmt.Println(asks[i].Key, "was asked in a placement left since")
		default:
			fmt.Printf("%s: %.1f tokens/s for %v (contended: %v)\n", asks[i].Key, g.Granted, g.In, g.Contended)
		}
	}

	// On shutdown, free the leases for the other instances at once.
	for i := range asks {
		asks[i].Release = true
	}
	_ = store.AskLeases(ctx, asks, out)
}
