package faultproxy_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/hybridlimit/hybridlimit/internal/faultproxy"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// client returns a go-redis client through p, with short timeouts and no
// retries, so that each fault shows in the error of one command.
func client(t *testing.T, p *faultproxy.Proxy) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: p.Addr, DialTimeout: 300 * time.Millisecond,
		ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond, MaxRetries: -1,
		DisableIdentity: true, Protocol: 2})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestFaults checks that each fault does to a real redis-server's traffic
// what its name says, and that Clear undoes it.
func TestFaults(t *testing.T) {
	srv := redistest.Start(t)
	p := faultproxy.Start(t, srv.Addr)
	c := client(t, p)
	ctx := context.Background()
	ping := func() (time.Duration, error) {
		start := time.Now()
		err := c.Ping(ctx).Err()
		return time.Since(start), err
	}
	if _, err := ping(); err != nil {
		t.Fatalf("no fault: %v", err)
	}

	p.Latency(t, faultproxy.Downstream, 100*time.Millisecond)
	if d, err := ping(); err != nil || d < 100*time.Millisecond {
		t.Errorf("latency 100ms: PING took %v, err %v; want at least 100ms and no error", d, err)
	}
	p.Clear(t)

	p.Latency(t, faultproxy.Downstream, 2*time.Second)
	if _, err := ping(); !isTimeout(err) {
		t.Errorf("latency 2s: PING error %v, want a timeout", err)
	}
	p.Clear(t)

	p.Blackhole(t)
	if _, err := ping(); !isTimeout(err) {
		t.Errorf("blackhole: PING error %v, want a timeout", err)
	}
	p.Clear(t)

	p.Reset(t)
	if _, err := ping(); err == nil || isTimeout(err) {
		t.Errorf("reset: PING error %v, want a connection error", err)
	}
	p.Clear(t)

	// 1 KB/s: a 4 KiB value takes about 4 s to go up, past the timeout.
	p.Bandwidth(t, faultproxy.Upstream, 1)
	if err := c.Set(ctx, "big", make([]byte, 4096), 0).Err(); !isTimeout(err) {
		t.Errorf("bandwidth 1 KB/s: SET of 4 KiB error %v, want a timeout", err)
	}
	if _, err := ping(); err != nil {
		t.Errorf("bandwidth 1 KB/s: PING (14 bytes) error %v, want none", err)
	}
	p.Clear(t)

	if _, err := ping(); err != nil {
		t.Errorf("after Clear: %v", err)
	}
}
