package global_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/global"
)

func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	// No connection is made until a command runs. An empty prefix means
	// DefaultPrefix.
	fmt.Println(global.New(rdb, "").BucketKey("api", "user-42"))
	fmt.Println(global.New(rdb, "myapp").BucketKey("api", "user-42"))
	// Output:
	// hybridlimit:{api:user-42}:tb
	// myapp:{api:user-42}:tb
}

// A key with a brace, or longer than MaxKeyBytes, is named by its SHA-256,
// so that it cannot move the Redis Cluster hash tag. The token bucket and
// the placement hash of one (limit, key) share the tag, and so one slot.
func ExampleStore_BucketKey() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	store := global.New(rdb, "")
	fmt.Println(store.BucketKey("api", "user-42"))
	fmt.Println(store.BucketKey("api", "{tenant}/user-42"))
	fmt.Println(store.RecordKey("api", "{tenant}/user-42"))
	// Output:
	// hybridlimit:{api:user-42}:tb
	// hybridlimit:{api:#65e71849571b9e2853899da1ae2204cf452bad83e4c635673b6c82ab0df15887}:tb
	// hybridlimit:v4:{api:#65e71849571b9e2853899da1ae2204cf452bad83e4c635673b6c82ab0df15887}
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
	case take.RetryAfter == global.Never:
		fmt.Println("denied: the request is larger than the burst")
	default:
		fmt.Println("denied, retry after", take.RetryAfter)
	}
}

// At startup, Check tells a server that is down or a password that is
// refused from an ACL user that may not run scripts. This example needs a
// Redis server, so it is compiled but not run.
func ExampleStore_Check() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	store := global.New(rdb, "")

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := store.Check(ctx); err != nil {
		fmt.Println("redis unusable:", err)
		return
	}
	fmt.Println("redis answers and runs scripts")
}

// Arguments that cannot be sent are refused before any network call. In a
// batch, an invalid ask fails alone, in its answer.
func ExampleErrInvalid() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	store := global.New(rdb, "")
	ctx := context.Background()

	_, err := store.TakeN(ctx, "api", "user-42", 0, 20, 1)
	fmt.Println(errors.Is(err, global.ErrInvalid))

	out := make([]global.LeaseGrant, 1)
	err = store.AskLeases(ctx, []global.LeaseAsk{{Limit: "api", Key: "user-42", Instance: "web-1",
		Gen: 0, Want: 40, Rate: 100, Burst: 40, Instances: 4, TTL: time.Second}}, out)
	fmt.Println(err, errors.Is(out[0].Err, global.ErrInvalid))
	fmt.Println(out[0].Err)
	// Output:
	// true
	// <nil> true
	// global: ask "user-42": global: invalid argument: gen 0
}

// A reply error is Redis's answer about one command; a failure to reach
// Redis is not one.
func ExampleIsReplyError() {
	fmt.Println(global.IsReplyError(redis.ErrCrossSlot))
	fmt.Println(global.IsReplyError(context.DeadlineExceeded))

	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	_ = rdb.Close()
	err := global.New(rdb, "").Ping(context.Background())
	fmt.Println(err, global.IsReplyError(err))
	// Output:
	// true
	// false
	// redis: client is closed false
}
