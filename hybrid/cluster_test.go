package hybrid_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// pipelineCounter counts the pipelines a client sends to each node.
type pipelineCounter struct {
	mu     sync.Mutex
	byNode map[string]int
}

func (p *pipelineCounter) hook(addr string) redis.Hook {
	return pipelineHook{p, addr}
}

type pipelineHook struct {
	p    *pipelineCounter
	addr string
}

func (h pipelineHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h pipelineHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h pipelineHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.p.mu.Lock()
		h.p.byNode[h.addr]++
		h.p.mu.Unlock()
		return next(ctx, cmds)
	}
}

// TestRedisCluster runs Hybrid limits over 1000 keys spread across the slots
// of a three-master Redis Cluster, through redis.ClusterClient: invariant 1
// holds per key, every master arbitrates its share of the keys, and each
// instance sends at most one pipeline per node per tick.
func TestRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 6 s; run without -short")
	}
	cl := redistest.StartCluster(t, 3)
	const instances, rate, burst = 2, 20.0, 10
	lim := hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	counters := make([]*pipelineCounter, instances)
	inst := make([]*hybrid.Limiter, instances)
	for i := range inst {
		pc := &pipelineCounter{byNode: map[string]int{}}
		counters[i] = pc
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ReadTimeout: 200 * time.Millisecond,
			WriteTimeout: 200 * time.Millisecond, DialTimeout: 200 * time.Millisecond})
		cc.OnNewNode(func(c *redis.Client) { c.AddHook(pc.hook(c.Options().Addr)) })
		t.Cleanup(func() { _ = cc.Close() })
		inst[i] = newLimiter(t, hybrid.Config{Redis: cc, Members: membership.NewStatic(fmt.Sprint("instance-", i), instances), Limits: []hybrid.Limit{lim}})
	}
	before := make([]int64, len(cl.Masters))
	for i, m := range cl.Masters {
		before[i] = m.CommandStats(t)["evalsha"]
	}
	start := time.Now()
	o := drive(t, inst, load{limit: "api", keys: keys(1000), perInst: []float64{1.8 * rate * 1000, 0.2 * rate * 1000}, duration: 4 * time.Second})
	elapsed := time.Since(start)
	if o.errs != 0 || o.sources[hybrid.SourceLease] == 0 {
		t.Fatalf("errors %d, sources %v", o.errs, o.sources)
	}
	tick := hybrid.DefaultConfig(nil, nil).Tick
	cold := float64(instances) * (float64(burst)/instances + rate/instances*tick.Seconds())
	for k, adm := range o.admitted {
		for _, w := range []time.Duration{time.Second, o.elapsed} {
			bound := rate*w.Seconds() + burst + cold + instances
			if got := maxInWindow(adm, w); float64(got) > bound {
				t.Fatalf("key %s: %d admitted in a %v window, bound %.0f", k, got, w, bound)
			}
		}
	}
	for i, m := range cl.Masters {
		if n := m.CommandStats(t)["evalsha"] - before[i]; n == 0 {
			t.Errorf("master %s served no lease script", m.Addr)
		} else {
			t.Logf("master %s: %d lease scripts", m.Addr, n)
		}
	}
	ticks := int(elapsed/tick) + 2
	for i, pc := range counters {
		pc.mu.Lock()
		for node, n := range pc.byNode {
			t.Logf("instance %d -> %s: %d pipelines in %d ticks", i, node, n, ticks)
			if n > ticks {
				t.Errorf("instance %d sent %d pipelines to %s in %d ticks: want at most one per node per tick", i, n, node, ticks)
			}
		}
		pc.mu.Unlock()
	}
	t.Logf("decisions %d, sources %v", o.decided, o.sources)
}
