package hybrid

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/global"
)

// A call to Redis that ends at its deadline says nothing of why. go-redis
// dials in the background, retrying DialerRetries times DialerRetryTimeout
// apart (5 and 100ms by default), and a caller whose deadline ends first
// gets only "context deadline exceeded", though the first dial was refused
// at once. So when an outage is logged with a deadline as its cause, the
// Limiter dials Redis once more itself, bounded by RedisTimeout, and adds
// what that dial says: connection refused, no such host, a certificate the
// client rejects. It does so once per state change, never per decision.

// explain returns err, for a log line, with the cause a deadline hid, if a
// dial finds one.
func (l *Limiter) explain(err error) error {
	if err == nil || l.diagnose == nil || !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.RedisTimeout)
	defer cancel()
	// A dial that only ran out of time too says no more than err (a
	// dial's own timeout does: "dial tcp ...: i/o timeout").
	if derr := l.diagnose(ctx); derr != nil && derr != context.DeadlineExceeded {
		return fmt.Errorf("%w; dialing Redis again: %w", err, derr)
	}
	return err
}

// dialFunc dials like a go-redis client's Options.Dialer.
type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// dialCheck returns a function that dials the Redis of rdb once with the
// client's own dialer and reports the error, or nil if the dial succeeds.
// It returns nil for a client it cannot dial for (a Ring, a wrapper): only
// the deadline is logged then.
func dialCheck(rdb global.Rediser) func(context.Context) error {
	switch c := rdb.(type) {
	case interface{ Options() *redis.Options }:
		// A single node, or Sentinel: its Dialer asks the sentinels for the
		// master and ignores the address.
		o := c.Options()
		if o.Dialer == nil {
			return nil
		}
		dial, network, addr := dialFunc(o.Dialer), o.Network, o.Addr
		return func(ctx context.Context) error { return dialOnce(ctx, dial, network, addr) }
	case interface{ Options() *redis.ClusterOptions }:
		o := c.Options()
		dial := dialFunc(o.Dialer)
		if dial == nil {
			dial = redis.NewDialer(&redis.Options{DialTimeout: o.DialTimeout, TLSConfig: o.TLSConfig})
		}
		addrs := append([]string(nil), o.Addrs...)
		// Redis is reachable if any seed is: report the first failure only
		// if none is.
		return func(ctx context.Context) error {
			var first error
			for _, a := range addrs {
				err := dialOnce(ctx, dial, "tcp", a)
				if err == nil {
					return nil
				}
				if first == nil {
					first = err
				}
			}
			return first
		}
	}
	return nil
}

// dialOnce dials addr, closes the connection, and reports the dial's error,
// or ctx's if ctx ends first: a TLS dialer may not heed ctx, and its dial
// then ends by itself within the client's DialTimeout.
func dialOnce(ctx context.Context, dial dialFunc, network, addr string) error {
	done := make(chan error, 1)
	go func() {
		conn, err := dial(ctx, network, addr)
		if err == nil {
			_ = conn.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
