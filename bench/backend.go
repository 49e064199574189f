package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/internal/redisproc"
)

// backend is the Redis the strategies run against.
type backend interface {
	// addr is where clients connect.
	addr() string
	// describe names the server for the report.
	describe(ctx context.Context) string
	// kind is "redis-server", "external" or "embedded".
	kind() string
	// commands returns the server's own count of the calls of each
	// command it executed for the clients under test, scripts' calls
	// included; ok is false when the server cannot count them (the
	// embedded Redis), in which case the clients count.
	commands(ctx context.Context) (calls map[string]int64, ok bool, err error)
	// reset empties the server between runs.
	reset(ctx context.Context) error
	// outage reports whether pause, kill and restart can be staged.
	outage() bool
	pause(ctx context.Context, d time.Duration) error
	kill(ctx context.Context) error
	restart(ctx context.Context) error
	close()
}

// own is a redis-server child process of the bench program.
type own struct{ srv *redisproc.Server }

func (o *own) addr() string { return o.srv.Addr }
func (o *own) kind() string { return "redis-server" }
func (o *own) describe(ctx context.Context) string {
	return fmt.Sprintf("redis-server %s, started by the bench on 127.0.0.1", o.srv.Version(ctx))
}
func (o *own) commands(ctx context.Context) (map[string]int64, bool, error) {
	n, err := o.srv.Commands(ctx)
	return n, true, err
}
func (o *own) reset(ctx context.Context) error { return o.srv.FlushAll(ctx) }
func (o *own) outage() bool                    { return true }
func (o *own) pause(ctx context.Context, d time.Duration) error {
	return o.srv.Pause(ctx, d)
}
func (o *own) kill(ctx context.Context) error    { o.srv.Kill(ctx); return nil }
func (o *own) restart(ctx context.Context) error { return o.srv.Restart(ctx) }
func (o *own) close()                            { o.srv.Close() }

// external is a Redis the user pointed the bench at. It is never flushed,
// paused or killed: every run uses its own key prefix, and the keys expire
// by themselves.
type external struct {
	address string
	admin   *redis.Client
}

func newExternal(ctx context.Context, addr string) (*external, error) {
	e := &external{address: addr, admin: redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, Protocol: 2})}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := e.admin.Ping(cctx).Err(); err != nil {
		_ = e.admin.Close()
		return nil, fmt.Errorf("redis at %s: %w", addr, err)
	}
	return e, nil
}

func (e *external) addr() string { return e.address }
func (e *external) kind() string { return "external" }
func (e *external) describe(ctx context.Context) string {
	v := ""
	if info, err := e.admin.Info(ctx, "server").Result(); err == nil {
		for line := range strings.SplitSeq(info, "\n") {
			if s, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				v = s
			}
		}
	}
	return fmt.Sprintf("Redis %s at %s (given with -redis; other clients' commands are counted too)", v, e.address)
}
func (e *external) commands(ctx context.Context) (map[string]int64, bool, error) {
	info, err := e.admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, true, err
	}
	stats, err := redisproc.ParseCommandStats(info)
	if err != nil {
		return nil, true, err
	}
	return redisproc.Without(stats, redisproc.Harness), true, nil
}
func (e *external) reset(context.Context) error { return nil }
func (e *external) outage() bool                { return false }
func (e *external) pause(context.Context, time.Duration) error {
	return errors.New("no outage on an external Redis")
}
func (e *external) kill(context.Context) error { return errors.New("no outage on an external Redis") }
func (e *external) restart(context.Context) error {
	return errors.New("no outage on an external Redis")
}
func (e *external) close() { _ = e.admin.Close() }

// embedded is an in-process miniredis: handy where there is no
// redis-server, but nothing it measures is representative. It cannot pause
// or count commands; an outage closes it and restarts it on the same port.
type embedded struct {
	m    *miniredis.Miniredis
	down atomic.Bool
}

func newEmbedded() (*embedded, error) {
	m, err := miniredis.Run()
	if err != nil {
		return nil, err
	}
	return &embedded{m: m}, nil
}

func (e *embedded) addr() string { return e.m.Addr() }
func (e *embedded) kind() string { return "embedded" }
func (e *embedded) describe(context.Context) string {
	return "embedded miniredis (in process): not representative"
}
func (e *embedded) commands(context.Context) (map[string]int64, bool, error) {
	return nil, false, nil
}
func (e *embedded) reset(context.Context) error { e.m.FlushAll(); return nil }
func (e *embedded) outage() bool                { return true }

// pause closes the server: miniredis cannot hold commands, so a pause is
// emulated by refusing them.
func (e *embedded) pause(context.Context, time.Duration) error {
	if !e.down.Swap(true) {
		e.m.Close()
	}
	return nil
}
func (e *embedded) kill(ctx context.Context) error { return e.pause(ctx, 0) }
func (e *embedded) restart(context.Context) error {
	if e.down.Swap(false) {
		return e.m.Restart()
	}
	return nil
}
func (e *embedded) close() { e.m.Close() }

// countHook counts the commands a client sends: one per command, pipelines
// by their length.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
