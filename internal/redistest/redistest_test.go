package redistest_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStartClientAndStats(t *testing.T) {
	s := redistest.Start(t)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	for range 3 {
		if err := c.Get(ctx, "k").Err(); err != nil {
			t.Fatalf("GET: %v", err)
		}
	}
	stats := s.CommandStats(t)
	if stats["get"] != 3 || stats["set"] != 1 {
		t.Errorf("CommandStats: get=%d set=%d, want 3 and 1 (all: %v)", stats["get"], stats["set"], stats)
	}

	s.FlushAll(t)
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Errorf("after FlushAll: EXISTS = %d, %v; want 0", n, err)
	}
}

func TestScriptFlush(t *testing.T) {
	s := redistest.Start(t)
	c := s.Client(t)
	ctx := context.Background()
	sha, err := c.ScriptLoad(ctx, "return 1").Result()
	if err != nil {
		t.Fatalf("SCRIPT LOAD: %v", err)
	}
	s.ScriptFlush(t)
	ok, err := c.ScriptExists(ctx, sha).Result()
	if err != nil || ok[0] {
		t.Errorf("after ScriptFlush: SCRIPT EXISTS = %v, %v; want false", ok, err)
	}
}

func TestKillRestart(t *testing.T) {
	s := redistest.Start(t)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	addr := s.Addr
	s.Kill(t)
	pingCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := c.Ping(pingCtx).Err(); err == nil {
		t.Fatal("PING after Kill succeeded")
	}
	s.Restart(t)
	if s.Addr != addr {
		t.Errorf("Addr after Restart = %s, want %s", s.Addr, addr)
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Errorf("after Restart: EXISTS = %d, %v; want 0 and no error", n, err)
	}
}

func TestPause(t *testing.T) {
	s := redistest.Start(t)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	const d = 200 * time.Millisecond
	s.Pause(t, d)
	start := time.Now()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING during pause: %v", err)
	}
	if took := time.Since(start); took < d/2 {
		t.Errorf("PING during a %v pause answered after %v", d, took)
	}
}

func TestParallelServers(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	if a.Addr == b.Addr {
		t.Fatalf("two servers on the same address %s", a.Addr)
	}
}
