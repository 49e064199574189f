package main

import (
	"context"
	"fmt"
	"io"

	"github.com/alicebob/miniredis/v2"
)

// embeddedRedis is an in-process Redis (miniredis), which runs the
// library's Lua scripts and reads its clock with TIME like a real one.
//
// miniredis counts key TTLs down only when told to (FastForward), and this
// one is never told: keys stay until it stops. That is harmless, since every
// lease and token bucket carries its own times and reads a stale one as
// expired; counting TTLs down by the wall clock in steps would instead
// expire keys early (a key set just before a step loses the whole step),
// which refills token buckets before their time.
type embeddedRedis struct {
	mr   *miniredis.Miniredis
	addr string
}

// startRedis starts an embedded Redis listening on addr ("127.0.0.1:0" for
// a free port).
func startRedis(addr string) (*embeddedRedis, error) {
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr(addr); err != nil {
		return nil, fmt.Errorf("starting the embedded Redis on %s: %w", addr, err)
	}
	return &embeddedRedis{mr: mr, addr: mr.Addr()}, nil
}

// Addr is the host:port the server listens on; it stays the same across
// Stop and Restart.
func (r *embeddedRedis) Addr() string { return r.addr }

// Stop stops the server, closing every client connection, as if Redis went
// down. The data are kept for Restart.
func (r *embeddedRedis) Stop() { r.mr.Close() }

// Restart starts a stopped server again on the same address.
func (r *embeddedRedis) Restart() error { return r.mr.Restart() }

// Close stops the server for good.
func (r *embeddedRedis) Close() { r.mr.Close() }

// runRedis serves an embedded Redis until ctx ends, for `demo node`
// clusters on a machine without Redis.
func runRedis(ctx context.Context, addr string, stdout io.Writer) error {
	r, err := startRedis(addr)
	if err != nil {
		return err
	}
	defer r.Close()
	fmt.Fprintf(stdout, "embedded Redis (miniredis) listening on %s; Ctrl-C stops it\n", r.Addr())
	fmt.Fprintf(stdout, "start nodes with: go run ./cmd/demo node -redis %s\n", r.Addr())
	<-ctx.Done()
	return nil
}
