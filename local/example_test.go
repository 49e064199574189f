package local_test

import (
	"fmt"
	"log"
	"math"
	"time"

	"github.com/hybridlimit/hybridlimit/local"
)

// t0 is the fixed instant the examples start at, so that their output does
// not depend on the clock.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func ExampleNew() {
	// A limit of 100 tokens/s with bursts of 20, on one of 4 instances: each
	// key starts at a default share of a quarter of both.
	l, err := local.New(local.Config{Limit: 100, Burst: 20, Instances: 4})
	if err != nil {
		log.Fatal(err)
	}
	def := l.Default()
	fmt.Printf("limit %v/s burst %d, default share %v/s burst %d\n", l.Limit(), l.Burst(), def.Limit, def.Burst)

	// A bad Config is an error wrapping local.ErrInvalid.
	_, err = local.New(local.Config{Limit: 100})
	fmt.Println(err)
	// Output:
	// limit 100/s burst 20, default share 25/s burst 5
	// local: invalid config: burst 0 must be at least 1
}

func ExampleLimiter_AllowN() {
	// 10 tokens/s with bursts of 5 on a single instance.
	l, err := local.New(local.Config{Limit: 10, Burst: 5})
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range []struct {
		at time.Duration
		n  int
	}{
		{0, 3},                      // a new key starts full: 5 tokens
		{0, 2},                      // takes the rest
		{0, 1},                      // empty: denied, 1 token comes in 100ms
		{100 * time.Millisecond, 1}, // refilled by one token
		{300 * time.Millisecond, 3}, // only 2 tokens have come in
		{time.Second, 6},            // more than the burst: never
	} {
		r := l.AllowN(t0.Add(s.at), "user-42", s.n)
		retry := fmt.Sprint(r.RetryAfter)
		if r.RetryAfter == math.MaxInt64 {
			retry = "never"
		}
		fmt.Printf("t=%v n=%d: allowed=%v remaining=%d retry=%s\n", s.at, s.n, r.Allowed, r.Remaining, retry)
	}
	// Output:
	// t=0s n=3: allowed=true remaining=2 retry=0s
	// t=0s n=2: allowed=true remaining=0 retry=0s
	// t=0s n=1: allowed=false remaining=0 retry=100ms
	// t=100ms n=1: allowed=true remaining=0 retry=0s
	// t=300ms n=3: allowed=false remaining=2 retry=100ms
	// t=1s n=6: allowed=false remaining=5 retry=never
}

func ExampleLimiter_AllowNInto() {
	// 10 tokens/s with bursts of 2 on a single instance.
	l, err := local.New(local.Config{Limit: 10, Burst: 2})
	if err != nil {
		log.Fatal(err)
	}
	// One Result, written over by every decision: on a hot path this
	// saves copying it on the way back.
	var r local.Result
	for i := range 3 {
		l.AllowNInto(t0, "user-42", 1, &r)
		fmt.Printf("request %d: allowed=%v remaining=%d retry=%v\n", i+1, r.Allowed, r.Remaining, r.RetryAfter)
	}
	// Output:
	// request 1: allowed=true remaining=1 retry=0s
	// request 2: allowed=true remaining=0 retry=0s
	// request 3: allowed=false remaining=0 retry=100ms
}

func ExampleLimiter_Counts() {
	// 10 tokens/s with bursts of 2 on a single instance.
	l, err := local.New(local.Config{Limit: 10, Burst: 2})
	if err != nil {
		log.Fatal(err)
	}
	var r local.Result
	for range 3 {
		l.AllowNInto(t0, "user-42", 1, &r) // counted under the share it ran at
	}
	// user-7 runs an assigned share of 5 tokens/s, burst 1, for a second.
	l.AssignNew(t0, "user-7", local.Share{Limit: 5, Burst: 1}, t0.Add(time.Second))
	for range 2 {
		l.AllowNTallyInto(t0, "user-7", 1, local.TallyAssigned, &r)
	}
	// TallyAssigned leaves a decision at the default share to the caller.
	l.AllowNTallyInto(t0, "user-99", 1, local.TallyAssigned, &r)
	fmt.Printf("%+v\n", l.Counts())
	// Output:
	// {DefaultAllowed:2 DefaultDenied:1 AssignedAllowed:1 AssignedDenied:1}
}

func ExampleSplit() {
	// 100 tokens/s with bursts of 10 over 3 instances: the first rank gets
	// the token of the remainder, so that the bursts sum to 10.
	for rank := range 3 {
		s := local.Split(100, 10, 3, rank)
		fmt.Printf("rank %d: %.2f/s burst %d\n", rank, float64(s.Limit), s.Burst)
	}

	// With fewer tokens of burst than instances, the higher ranks get none:
	// they admit nothing until they ask for more.
	fmt.Println("burst 2 over 4:", local.Split(100, 2, 4, 0).Burst, local.Split(100, 2, 4, 3).Burst)

	// An instance that does not know its rank gets no remainder.
	fmt.Println("unranked:", local.Split(100, 10, 3, local.NoRank).Burst)
	// Output:
	// rank 0: 33.33/s burst 4
	// rank 1: 33.33/s burst 3
	// rank 2: 33.33/s burst 3
	// burst 2 over 4: 1 0
	// unranked: 3
}

func ExampleLimiter_SetPlace() {
	// Unranked, as created: 20 tokens of burst over 3 instances is 6 each.
	l, err := local.New(local.Config{Limit: 90, Burst: 20, Instances: 3})
	if err != nil {
		panic(err)
	}
	fmt.Println("unranked:", l.Default().Burst)

	// The first two ranks hold the remainder: 7 + 7 + 6 = 20.
	l.SetPlace(t0, local.Place{Instances: 3, Rank: 1})
	fmt.Println("rank 1:", l.Default().Burst)

	// Over 30 instances, rank 25 gets none of the 20 tokens: its keys admit
	// nothing at the default share. With MinBurst 1 each instance keeps one
	// (a new key starts with it).
	l.SetPlace(t0, local.Place{Instances: 30, Rank: 25})
	fmt.Println("rank 25 of 30:", l.Default().Burst, l.Allow(t0, "a").Allowed)
	l.SetPlace(t0, local.Place{Instances: 30, Rank: 25, MinBurst: 1})
	fmt.Println("with MinBurst 1:", l.Default().Burst, l.Allow(t0, "b").Allowed)
	fmt.Printf("%+v\n", l.Place())
	// Output:
	// unranked: 6
	// rank 1: 7
	// rank 25 of 30: 0 false
	// with MinBurst 1: 1 true
	// {Instances:30 Rank:25 MinBurst:1}
}

func ExampleLimiter_Assign() {
	// Default share: 100/4 = 25 tokens/s, burst 20/4 = 5.
	l, err := local.New(local.Config{Limit: 100, Burst: 20, Instances: 4})
	if err != nil {
		log.Fatal(err)
	}

	// Only a key that exists can be assigned a share.
	fmt.Println("assign unknown key:", l.Assign(t0, "user-42", local.Share{Limit: 60, Burst: 12}, t0.Add(time.Second)))
	l.Allow(t0, "user-42") // creates the key at the default share

	// Run the key at 60 tokens/s, burst 12, for one second (a lease, say).
	fmt.Println("assign:", l.Assign(t0, "user-42", local.Share{Limit: 60, Burst: 12}, t0.Add(time.Second)))
	r := l.AllowN(t0.Add(500*time.Millisecond), "user-42", 10)
	fmt.Printf("at 500ms: allowed=%v remaining=%d assigned=%v\n", r.Allowed, r.Remaining, r.Assigned)

	// Once the share ends the key is back at the default share by itself:
	// 10 tokens are now more than its burst of 5.
	r = l.AllowN(t0.Add(2*time.Second), "user-42", 10)
	fmt.Printf("at 2s:    allowed=%v remaining=%d assigned=%v\n", r.Allowed, r.Remaining, r.Assigned)
	r = l.AllowN(t0.Add(2*time.Second), "user-42", 5)
	fmt.Printf("at 2s:    allowed=%v remaining=%d assigned=%v\n", r.Allowed, r.Remaining, r.Assigned)
	// Output:
	// assign unknown key: false
	// assign: true
	// at 500ms: allowed=true remaining=2 assigned=true
	// at 2s:    allowed=false remaining=5 assigned=false
	// at 2s:    allowed=true remaining=0 assigned=false
}

func ExampleLimiter_SetLimit() {
	// 100 tokens/s with bursts of 20 on one of 4 instances.
	l, err := local.New(local.Config{Limit: 100, Burst: 20, Instances: 4})
	if err != nil {
		log.Fatal(err)
	}
	l.Allow(t0, "user-42")
	fmt.Println("before:", l.Default())

	// The limit is raised to 400 tokens/s with bursts of 40 while the
	// process runs: the default share is split anew over the same 4
	// instances, and keys at the default share move to it at once.
	if err := l.SetLimit(t0, 400, 40); err != nil {
		log.Fatal(err)
	}
	fmt.Println("after: ", l.Default(), l.AppendStats(nil)[0].Share)

	// A bad limit is an error and changes nothing.
	fmt.Println(l.SetLimit(t0, 400, 0))
	// Output:
	// before: {25 5}
	// after:  {100 10} {100 10}
	// local: invalid config: burst 0 must be at least 1
}

func ExampleLimiter_AppendShardStats() {
	l, err := local.New(local.Config{Limit: 10, Burst: 5})
	if err != nil {
		log.Fatal(err)
	}
	for i := range 1000 {
		l.Allow(t0, fmt.Sprintf("key-%d", i))
	}
	// Every key, a shard at a time: the buffer holds one shard's keys.
	var buf []local.KeyStats
	keys, most := 0, 0
	for i := range l.Shards() {
		buf = l.AppendShardStats(i, buf[:0])
		keys, most = keys+len(buf), max(most, len(buf))
	}
	fmt.Printf("%d keys in %d shards, none holding a tenth of them: %v\n", keys, l.Shards(), most < keys/10)
	// Output:
	// 1000 keys in 64 shards, none holding a tenth of them: true
}

func ExampleLimiter_Stats() {
	l, err := local.New(local.Config{Limit: 10, Burst: 5})
	if err != nil {
		log.Fatal(err)
	}
	l.AllowN(t0, "k", 3)
	l.AllowN(t0.Add(time.Second), "k", 9) // more than the burst: denied
	st, ok := l.Stats("k")
	fmt.Println(ok, st.Attempted, st.Denied, st.LastSeen.Sub(st.Created))
	_, ok = l.Stats("never seen")
	fmt.Println(ok)
	// Output:
	// true 12 9 1s
	// false
}
