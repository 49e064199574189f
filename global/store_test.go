package global_test

import (
	"context"
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
// may send, is named in Redis by its hash, in the lease hash and the token
// bucket alike; each long key keeps a bucket of its own, and shorter keys
// keep their names.
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
		out := make([]global.Lease, 1)
		req := global.LeaseRequest{Limit: "api", Key: key, Instance: "i", Want: 1, Rate: 10, Instances: 1, TTL: time.Minute}
		if err := store.Lease(ctx, []global.LeaseRequest{req}, out); err != nil || out[0].Err != nil {
			t.Fatal(err, out[0].Err)
		}
	}
	names, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 6 {
		t.Fatalf("Redis holds %d keys for 3 keys' leases and buckets: %d bytes of names", len(names), len(strings.Join(names, "")))
	}
	longest := 0
	for _, n := range names {
		longest = max(longest, len(n))
	}
	if limit := len(store.BucketKey("api", edge)); longest > limit {
		t.Errorf("longest Redis key name is %d bytes; want at most %d, that of a key of MaxKeyBytes", longest, limit)
	}
	if !strings.Contains(store.LeaseKey("api", edge), edge) {
		t.Errorf("a key of MaxKeyBytes is not named as it is: %q", store.LeaseKey("api", edge))
	}
	if tk, err := store.TakeN(ctx, "api", other, 0.001, 1, 1); err != nil || tk.Allowed {
		t.Errorf("second take on a long key: %+v, %v; want a denial: its bucket is found again by its hash", tk, err)
	}
}

// TestKeysThatWouldMoveTheHashTagAreHashed: a key with a brace would move
// the Redis Cluster hash tag of its names, and a key starting with "#"
// could spell a long key's hashed name: both are hashed, and every such key
// keeps a name of its own in the tag of its limit.
func TestKeysThatWouldMoveTheHashTagAreHashed(t *testing.T) {
	store := global.New(noNetwork{}, "p")
	long := strings.Repeat("k", global.MaxKeyBytes+1)
	names := map[string]string{}
	for _, key := range []string{"plain", "}x", "{x}", "a}b{c", "#", long, store.LeaseKey("api", long)[len("p:{api:") : len(store.LeaseKey("api", long))-1]} {
		name := store.LeaseKey("api", key)
		if !strings.HasPrefix(name, "p:{api:") || strings.Count(name, "{") != 1 || strings.Count(name, "}") != 1 || !strings.HasSuffix(name, "}") {
			t.Errorf("key %q is named %q: want one hash tag, {api:...}", key, name)
		}
		if other, dup := names[name]; dup {
			t.Errorf("keys %q and %q share the name %q", other, key, name)
		}
		names[name] = key
	}
	if got := store.LeaseKey("api", "plain"); got != "p:{api:plain}" {
		t.Errorf("a plain key is named %q; want it as it is", got)
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
