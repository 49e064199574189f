package global_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// TestPing: Ping answers nil while the server runs and an error, within
// its context, once it is gone.
func TestPing(t *testing.T) {
	srv := redistest.Start(t)
	store := global.New(srv.Client(t), "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := store.Ping(ctx); err != nil {
		t.Fatalf("Ping with the server up: %v", err)
	}
	srv.Kill(t)
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := store.Ping(ctx); err == nil {
		t.Fatal("Ping with the server killed: got nil, want an error")
	}
}

// TestLongKeysAreHashedInRedis: a key longer than MaxKeyBytes, as a client
// may send, is named in Redis by its hash, in the token bucket and the
// placement hash alike; each long key keeps a bucket and a hash of its
// own, and shorter keys keep their names.
func TestLongKeysAreHashedInRedis(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := global.New(rdb, "")
	ctx := context.Background()
	long := strings.Repeat("k", 1<<20)
	other := long[:len(long)-1] + "x"
	edge := strings.Repeat("e", global.MaxKeyBytes)
	for _, key := range []string{long, other, edge} {
		// Each long key has a bucket of its own: its first token is there.
		if tk, err := store.TakeN(ctx, "api", key, 0.001, 1, 1); err != nil || !tk.Allowed {
			t.Fatalf("first take on a key of %d bytes: %+v, %v; want it allowed", len(key), tk, err)
		}
		ask(t, store, global.LeaseAsk{Limit: "api", Key: key, Instance: "i", Gen: 1, Want: 1, Rate: 10, Burst: 1,
			Instances: 1, TTL: time.Minute})
	}
	names, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 6 {
		t.Fatalf("Redis holds %d keys for 3 keys' buckets and placement hashes: %d bytes of names", len(names), len(strings.Join(names, "")))
	}
	longest := 0
	for _, n := range names {
		longest = max(longest, len(n))
	}
	if limit := max(len(store.BucketKey("api", edge)), len(store.RecordKey("api", edge))); longest > limit {
		t.Errorf("longest Redis key name is %d bytes; want at most %d, that of a key of MaxKeyBytes", longest, limit)
	}
	for _, name := range []string{store.BucketKey("api", edge), store.RecordKey("api", edge)} {
		if !strings.Contains(name, edge) {
			t.Errorf("a key of MaxKeyBytes is not named as it is: %q", name)
		}
	}
	if tk, err := store.TakeN(ctx, "api", other, 0.001, 1, 1); err != nil || tk.Allowed {
		t.Errorf("second take on a long key: %+v, %v; want a denial: its bucket is found again by its hash", tk, err)
	}
}

// TestBucketKeyNames pins the names of the token buckets, which Global
// mode has used from the start: a key that moved would reset every bucket.
func TestBucketKeyNames(t *testing.T) {
	store := global.New(noNetwork{}, "p")
	long := strings.Repeat("k", global.MaxKeyBytes+1)
	sum := sha256.Sum256([]byte(long))
	for key, want := range map[string]string{
		"plain": "p:{api:plain}:tb",
		long:    "p:{api:#" + hex.EncodeToString(sum[:]) + "}:tb",
	} {
		if got := store.BucketKey("api", key); got != want {
			t.Errorf("BucketKey(api, %.20q) = %q, want %q", key, got, want)
		}
	}
	if got := global.New(noNetwork{}, "").BucketKey("l", "k"); got != global.DefaultPrefix+":{l:k}:tb" {
		t.Errorf("with an empty prefix: %q, want DefaultPrefix", got)
	}
}

// TestKeysThatWouldMoveTheHashTagAreHashed: a key with a brace would move
// the Redis Cluster hash tag of its names, and a key starting with "#"
// could spell a long key's hashed name: both are hashed, and every such key
// keeps a name of its own in the tag of its limit, in its bucket and its
// placement hash alike.
func TestKeysThatWouldMoveTheHashTagAreHashed(t *testing.T) {
	store := global.New(noNetwork{}, "p")
	long := strings.Repeat("k", global.MaxKeyBytes+1)
	longName := store.BucketKey("api", long)
	spelled := longName[len("p:{api:") : len(longName)-len("}:tb")] // "#" and the hash
	names := map[string]string{}
	for _, key := range []string{"plain", "}x", "{x}", "a}b{c", "#", long, spelled} {
		bucket, record := store.BucketKey("api", key), store.RecordKey("api", key)
		for _, name := range []string{bucket, record} {
			if strings.Count(name, "{") != 1 || strings.Count(name, "}") != 1 {
				t.Errorf("key %q is named %q: want one hash tag, {api:...}", key, name)
			}
		}
		if !strings.HasPrefix(bucket, "p:{api:") || !strings.HasSuffix(bucket, "}:tb") {
			t.Errorf("key %q has the bucket %q: want p:{api:...}:tb", key, bucket)
		}
		if tag := strings.TrimSuffix(strings.TrimPrefix(bucket, "p:"), ":tb"); record != "p:v4:"+tag {
			t.Errorf("key %q has the bucket %q and the placement hash %q: want one hash tag", key, bucket, record)
		}
		if other, dup := names[bucket]; dup {
			t.Errorf("keys %q and %q share the name %q", other, key, bucket)
		}
		names[bucket] = key
	}
}

// TestUniversalClient: a Store runs every script through a
// redis.UniversalClient as well.
func TestUniversalClient(t *testing.T) {
	srv := redistest.Start(t)
	var rdb redis.UniversalClient = redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{srv.Addr}})
	t.Cleanup(func() { _ = rdb.Close() })
	store := global.New(rdb, "uni")
	ctx := context.Background()
	if tk, err := store.TakeN(ctx, "u", "a", 1, 1, 1); err != nil || !tk.Allowed {
		t.Errorf("TakeN = %+v, %v", tk, err)
	}
	// Alone on the key: the whole rate.
	if g := ask(t, store, global.LeaseAsk{Limit: "u", Key: "a", Instance: "x", Gen: 1, Want: 3, Rate: 10, Burst: 10,
		Instances: 1, TTL: time.Second}); !approx(g.Granted, 10) {
		t.Errorf("AskLeases = %+v, want 10", g)
	}
	if tk, err := store.TakePool(ctx, global.PoolTake{Limit: "u", Key: "b", Instance: "x", Gen: 1, Rate: 10, Burst: 10,
		Instances: 1, N: 1, TTL: time.Second, Asked: 1}); err != nil || !tk.Allowed {
		t.Errorf("TakePool = %+v, %v", tk, err)
	}
	if err := store.Check(ctx); err != nil {
		t.Errorf("Check: %v", err)
	}
}

// TestCheck: Check is nil for a client Redis answers and lets run scripts,
// and an error for one it does not let run them, and for no server.
func TestCheck(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	if err := global.New(srv.Client(t), "").Check(ctx); err != nil {
		t.Fatalf("Check as the default user: %v", err)
	}
	if err := srv.Client(t).Do(ctx, "ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "+@all", "-@scripting").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "noscripts", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := global.New(rdb, "").Check(ctx); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("Check as a user who may not run scripts: %v; want NOPERM", err)
	}
	srv.Kill(t)
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := global.New(srv.Client(t), "").Check(cctx); err == nil {
		t.Error("Check with the server killed: nil, want an error")
	}
}

// TestServerDown: with no server, every call fails with the connection's
// error: TakeN and TakePool, and AskLeases as a whole.
func TestServerDown(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	store := global.New(rdb, "")
	srv.Kill(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := store.TakeN(ctx, "down", "k", 1, 1, 1); err == nil || errors.Is(err, global.ErrInvalid) || global.IsReplyError(err) {
		t.Errorf("TakeN on a dead server: error = %v, want a connection error", err)
	}
	if _, err := store.TakePool(ctx, global.PoolTake{Limit: "down", Key: "k", Instance: "a", Gen: 1, Rate: 1, Burst: 1,
		Instances: 1, N: 1, TTL: time.Second, Asked: 1}); err == nil || errors.Is(err, global.ErrInvalid) || global.IsReplyError(err) {
		t.Errorf("TakePool on a dead server: error = %v, want a connection error", err)
	}
	asks := []global.LeaseAsk{{Limit: "down", Key: "k", Instance: "a", Gen: 1, Want: 1, Rate: 1, Burst: 1, Instances: 1, TTL: time.Second}}
	for _, release := range []bool{false, true} {
		asks[0].Release = release
		if err := store.AskLeases(ctx, asks, make([]global.LeaseGrant, 1)); err == nil || global.IsReplyError(err) {
			t.Errorf("AskLeases (release %v) on a dead server: error = %v, want a connection error", release, err)
		}
	}
}
