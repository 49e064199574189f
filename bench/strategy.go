package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybridlimit/bench/internal/report"
	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/membership"
)

// strategies are the limiters compared, in report order.
var strategies = []string{report.Local, report.Global, report.Hybrid, report.RedisRate}

// bare is the latency baseline: no library at all, a map of
// golang.org/x/time/rate limiters under a mutex per instance, each at
// rate/N and burst/N. It is run on a few scenarios to show what the
// machine and the driver cost a decision.
const bare = report.BlindSplit

// limitName is the one limit every Limiter of the bench holds.
const limitName = "bench"

// instance is one service instance's limiter.
type instance interface {
	// allow decides one request on key. An error means the limiter could
	// not decide; allowed then says what the caller's code does anyway.
	allow(ctx context.Context, key string) (allowed bool, err error)
	close(ctx context.Context) error
}

// setup is what the instances of one run share.
type setup struct {
	strategy string
	backend  backend
	rate     float64
	burst    int
	// prefix starts every Redis key of the run, so that runs never see
	// one another's keys even on a Redis that is not flushed.
	prefix string
	// sent counts the commands every client of the run sends.
	sent *atomic.Int64
	// tune adjusts the Config of Local, Global and Hybrid instances.
	tune func(*hybrid.Config)
	// timeout bounds every redis_rate call, as hybrid.Config.RedisTimeout
	// bounds the library's.
	timeout time.Duration
	// bare: the instances' counters are not on a Bus (see options.bare).
	bare bool
}

// client returns a new go-redis client to the backend for one instance,
// with timeouts like the library's tests use and no retries, so that one
// decision is one command, counted by the run's hook.
func (s *setup) client() *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr:                  s.backend.addr(),
		DialTimeout:           200 * time.Millisecond,
		ReadTimeout:           200 * time.Millisecond,
		WriteTimeout:          200 * time.Millisecond,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
	})
	c.AddHook(countHook{s.sent})
	return c
}

// newInstance starts one instance of the run's strategy, named by members.
func (s *setup) newInstance(members *membership.Static) (instance, error) {
	var mode hybrid.Mode
	switch s.strategy {
	case report.Local:
		mode = hybrid.Local
	case report.Global:
		mode = hybrid.Global
	case report.Hybrid:
		mode = hybrid.Hybrid
	case report.RedisRate:
		rdb := s.client()
		return &redisRate{
			rdb: rdb, lim: redis_rate.NewLimiter(rdb), prefix: s.prefix + ":", timeout: s.timeout,
			limit: redis_rate.Limit{Rate: int(s.rate), Burst: s.burst, Period: time.Second},
		}, nil
	case bare:
		return &bareInstance{members: members, rate: s.rate, burst: s.burst, m: make(map[string]*rate.Limiter)}, nil
	default:
		return nil, fmt.Errorf("unknown strategy %q", s.strategy)
	}
	var rdb *redis.Client
	if mode != hybrid.Local {
		rdb = s.client()
	}
	lim := hybrid.Limit{Name: limitName, Rate: s.rate, Burst: s.burst, Mode: mode, OnOutage: hybrid.FailLocal}
	cfg := hybrid.DefaultConfig(nil, members, lim)
	if rdb != nil {
		cfg.Redis = rdb
	}
	cfg.Prefix = s.prefix
	if s.tune != nil {
		s.tune(&cfg)
	}
	l, err := hybrid.New(cfg)
	if err != nil {
		if rdb != nil {
			_ = rdb.Close()
		}
		return nil, err
	}
	return &hybridInstance{lim: l, rdb: rdb}, nil
}

// hybridInstance is a hybrid.Limiter in Local, Global or Hybrid mode.
type hybridInstance struct {
	lim *hybrid.Limiter
	rdb *redis.Client // nil in Local mode
}

func (h *hybridInstance) allow(ctx context.Context, key string) (bool, error) {
	d, err := h.lim.Allow(ctx, limitName, key)
	return d.Allowed, err
}

func (h *hybridInstance) close(ctx context.Context) error {
	err := h.lim.Close(ctx)
	if h.rdb != nil {
		err = errors.Join(err, h.rdb.Close())
	}
	return err
}

// redisRate is github.com/go-redis/redis_rate, one GCRA script per
// decision. When Redis cannot answer it fails open, as callers of it
// commonly write.
type redisRate struct {
	timeout time.Duration
	rdb     *redis.Client
	lim     *redis_rate.Limiter
	prefix  string
	limit   redis_rate.Limit
}

func (r *redisRate) allow(ctx context.Context, key string) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, r.timeout)
	res, err := r.lim.Allow(cctx, r.prefix+key, r.limit)
	cancel()
	if err != nil {
		return true, err
	}
	return res.Allowed > 0, nil
}

func (r *redisRate) close(context.Context) error { return r.rdb.Close() }

// bareInstance is the baseline: x/time/rate limiters in a map under a
// mutex, at rate/N and burst/N (at least 1), N read when a key is first
// seen.
type bareInstance struct {
	members  *membership.Static
	rate     float64
	burst, n int
	mu       sync.Mutex
	m        map[string]*rate.Limiter
}

func (b *bareInstance) allow(_ context.Context, key string) (bool, error) {
	b.mu.Lock()
	l := b.m[key]
	if l == nil {
		n := b.members.Count()
		l = rate.NewLimiter(rate.Limit(b.rate/float64(n)), max(b.burst/n, 1))
		b.m[key] = l
	}
	ok := l.AllowN(time.Now(), 1)
	b.mu.Unlock()
	return ok, nil
}

func (b *bareInstance) close(context.Context) error { return nil }

// cluster is the instances of one run, one per slot, each with its own
// static membership counter; instances leave and join as in a deploy.
type cluster struct {
	setup *setup
	// slots[i] is used only by slot i's driver once the run has started.
	slots []instance

	mu      sync.Mutex // guards the fields below
	members map[int]*membership.Static
	names   int
	// bus is the instances' roster, as a gossip cluster would be: each
	// counter sees the others' names, and a leave (membership.Static.Leave)
	// lowers the others' counts at once.
	bus *membership.Bus
}

// newCluster starts n instances.
func newCluster(s *setup, n int) (*cluster, error) {
	c := &cluster{setup: s, slots: make([]instance, n), members: make(map[int]*membership.Static), bus: membership.NewBus()}
	for i := range c.slots {
		c.members[i] = c.member(n)
	}
	for i := range c.slots {
		inst, err := s.newInstance(c.members[i])
		if err != nil {
			c.close(context.Background())
			return nil, err
		}
		c.slots[i] = inst
	}
	return c, nil
}

// member returns a counter with a fresh name. Called with mu held, or
// before the run starts.
func (c *cluster) member(n int) *membership.Static {
	c.names++
	m := membership.NewStatic(fmt.Sprintf("bench-%d", c.names), n)
	if !c.setup.bare {
		m.Connect(c.bus)
	}
	return m
}

// leave closes slot's instance, then leaves the bus gracefully, as a
// deployment stops an instance: the Limiter stops deciding and releases
// its records (hybrid.Limiter.Close) before the others hear of the leave,
// so they may stop counting it at once. Only slot's driver calls it.
func (c *cluster) leave(ctx context.Context, slot int) error {
	inst := c.slots[slot]
	c.slots[slot] = nil
	var err error
	if inst != nil {
		err = inst.close(ctx)
	}
	c.mu.Lock()
	if m := c.members[slot]; m != nil {
		m.Leave() // lowers the others' counts by one and reports the leave
	}
	delete(c.members, slot)
	for _, m := range c.members {
		m.Set(len(c.members)) // already so, unless the counts had drifted
	}
	c.mu.Unlock()
	return err
}

// join starts a new instance in slot and tells the others they are one
// more. Only slot's driver calls it.
func (c *cluster) join(slot int) error {
	c.mu.Lock()
	m := c.member(len(c.members) + 1)
	c.members[slot] = m
	c.mu.Unlock()
	inst, err := c.setup.newInstance(m)
	if err != nil {
		return err
	}
	c.slots[slot] = inst
	c.mu.Lock()
	for _, m := range c.members {
		m.Set(len(c.members))
	}
	c.mu.Unlock()
	return nil
}

// close closes every instance; it runs after the drivers have stopped.
func (c *cluster) close(ctx context.Context) error {
	var errs []error
	for i, inst := range c.slots {
		if inst != nil {
			errs = append(errs, inst.close(ctx))
			c.slots[i] = nil
		}
	}
	return errors.Join(errs...)
}
