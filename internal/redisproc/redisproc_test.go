package redisproc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestParseCommandStats(t *testing.T) {
	info := "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=3,usec=40,usec_per_call=13.33,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_time:calls=3,usec=4,usec_per_call=1.33,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_client|setinfo:calls=2,usec=4,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=7,usec=400,usec_per_call=57.14,rejected_calls=0,failed_calls=0\r\n"
	stats, err := ParseCommandStats(info)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"evalsha": 3, "time": 3, "client|setinfo": 2, "info": 7}
	if len(stats) != len(want) {
		t.Fatalf("got %v, want %v", stats, want)
	}
	for k, v := range want {
		if stats[k] != v {
			t.Errorf("%s: got %d, want %d", k, stats[k], v)
		}
	}
	sent, scripted := Split(Without(stats, Harness))
	if sent != 5 || scripted != 3 {
		t.Errorf("Split: sent %d, scripted %d; want 5 and 3", sent, scripted)
	}
	if _, err := ParseCommandStats("cmdstat_get:calls=x,usec=1"); err == nil {
		t.Error("a bad count parses")
	}
}

func TestSentByClient(t *testing.T) {
	for name, want := range map[string]bool{
		"evalsha": true, "eval": true, "ping": true, "hello": true, "client|setinfo": true, "script|load": true,
		"time": false, "hgetall": false, "hset": false, "pexpire": false, "get": false, "set": false, "hmget": false,
	} {
		if got := SentByClient(name); got != want {
			t.Errorf("SentByClient(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestCommandsSurviveRestart counts a client's commands across a pause, a
// kill and a restart, without the Server's own.
func TestCommandsSurviveRestart(t *testing.T) {
	ctx := context.Background()
	s, err := Start(ctx, t.TempDir(), Options{})
	if errors.Is(err, ErrNotFound) {
		t.Fatalf("%v: install the Debian package redis-server", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: 3})
	t.Cleanup(func() { _ = c.Close() })

	base, err := s.Commands(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Pause(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	s.Kill(ctx)
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	end, err := s.Commands(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := end["set"] - base["set"]; got != 5 {
		t.Errorf("%d SETs counted, want 5 (3 before the kill, 2 after the restart)", got)
	}
	for _, name := range []string{"info", "client|pause", "ping"} {
		if d := end[name] - base[name]; d != 0 {
			t.Errorf("%d %s of the harness counted", d, name)
		}
	}
	if d := end["hello"] - base["hello"]; d > 2 {
		// The client connects once, and once more after the restart.
		t.Errorf("%d HELLOs counted, want at most the client's two", d)
	}
}
