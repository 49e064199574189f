package global_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/global"
)

func ExampleStore_LeaseKey() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	store := global.New(rdb, "") // no connection is made until a command runs
	fmt.Println(store.LeaseKey("api", "user-42"))
	fmt.Println(store.BucketKey("api", "user-42"))
	// Output:
	// hybridlimit:{api:user-42}
	// hybridlimit:{api:user-42}:tb
}

// This example needs a Redis server, so it is compiled but not run.
func ExampleStore_TakeN() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	store := global.New(rdb, "")

	// 10 requests per second, bursts of 20, per user.
	take, err := store.TakeN(context.Background(), "api", "user-42", 10, 20, 1)
	switch {
	case err != nil:
		fmt.Println("redis could not decide:", err)
	case take.Allowed:
		fmt.Println("allowed,", take.Remaining, "left")
	default:
		fmt.Println("denied, retry after", take.RetryAfter)
	}
}

// This example needs a Redis server, so it is compiled but not run.
func ExampleStore_Lease() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	store := global.New(rdb, "")

	// Instance "web-1" of 4 renews its leases on two keys in one round trip.
	reqs := []global.LeaseRequest{
		{Limit: "api", Key: "user-42", Instance: "web-1", Want: 40, Rate: 100, Instances: 4, TTL: 500 * time.Millisecond},
		{Limit: "api", Key: "user-7", Instance: "web-1", Want: 2, Rate: 100, Instances: 4, TTL: 5 * time.Second},
	}
	out := make([]global.Lease, len(reqs))
	if err := store.Lease(context.Background(), reqs, out); err != nil {
		fmt.Println("redis unreachable:", err)
		return
	}
	for i, l := range out {
		if l.Err != nil {
			fmt.Println(reqs[i].Key, "failed:", l.Err)
			continue
		}
		fmt.Printf("%s: %.1f tokens/s until %v (contended: %v)\n", reqs[i].Key, l.Granted, l.Expires, l.Contended)
	}

	// On shutdown, free the shares for the other instances at once.
	_ = store.Release(context.Background(), reqs)
}

// A lease can hold a part of the burst of its own, counted by Redis apart
// from its rate: here an instance light on the key (2/s of 100/s) asks
// for its default part of a burst of 40 (40/4 = 10 tokens), where its
// rate's part would be under one token. This example needs a Redis server,
// so it is compiled but not run.
func ExampleStore_Lease_burst() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	store := global.New(rdb, "")

	reqs := []global.LeaseRequest{{Limit: "api", Key: "user-42", Instance: "web-1", Want: 2, Rate: 100,
		Instances: 4, TTL: 5 * time.Second, Burst: 40, WantBurst: 10, RunningBurst: 10,
		Running: 25, RunningFor: 5 * time.Second}} // it runs its default share, 25/s and 10 tokens, until the answer
	out := make([]global.Lease, 1)
	if err := store.Lease(context.Background(), reqs, out); err != nil || out[0].Err != nil {
		fmt.Println("no lease:", err, out[0].Err)
		return
	}
	// Run the grant locally with the part of the burst Redis gave, rounded down.
	fmt.Printf("%.1f tokens/s, burst %d\n", out[0].Granted, int(out[0].Burst))
}

// This example needs a Redis server, so it is compiled but not run.
func ExampleStore_TakeExact() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	store := global.New(rdb, "")

	// Instance "web-1" of 4 decides key "user-42" exactly: it hands the
	// pool the 2 tokens left in its local bucket when it joins, then takes
	// one token per request.
	take, err := store.TakeExact(context.Background(), global.ExactRequest{
		Limit: "api", Key: "user-42", Instance: "web-1",
		Rate: 100, Burst: 8, Instances: 4,
		N: 1, TTL: 5 * time.Second, Give: 2,
	})
	switch {
	case err != nil:
		fmt.Println("redis could not decide:", err)
	case take.Allowed:
		fmt.Printf("allowed, %d left in a pool of %.0f tokens/s\n", take.Remaining, take.PoolRate)
	case take.RetryAfter == global.Never:
		fmt.Println("denied: the pool is too small for this request now")
	default:
		fmt.Println("denied, retry after", take.RetryAfter)
	}
}

// With exact bursts an instance may ask for credit: tokens of the pool
// handed ahead of its next requests, which it admits itself until the
// credit ends, and gives back what it has left when it next asks. While it
// moves to a lease it sets KeepLease, so that a take landing after its
// lease request keeps the lease. This example needs a Redis server, so it
// is compiled but not run.
func ExampleStore_TakeExact_credit() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	store := global.New(rdb, "")

	credit, until := 0, time.Time{}
	allow := func() bool {
		now := time.Now()
		if credit > 0 && now.Before(until) {
			credit--
			return true
		}
		back := 0
		if now.Before(until) {
			back = credit
		}
		credit = 0
		take, err := store.TakeExact(context.Background(), global.ExactRequest{
			Limit: "api", Key: "user-42", Instance: "web-1",
			Rate: 10, Burst: 10, Instances: 4, N: 1, TTL: 5 * time.Second,
			ExactBursts: true, KeepLease: true,
			Credit: 2, Return: back, CreditTTL: 2 * time.Second,
		})
		if err != nil {
			return false
		}
		// Stop admitting it before Redis stops counting it.
		credit, until = take.Credit, now.Add(1800*time.Millisecond)
		return take.Allowed
	}
	admitted := 0
	for range 12 {
		if allow() {
			admitted++
		}
	}
	fmt.Println("admitted", admitted, "of 12")
}
