package hybrid_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/global"
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

// TestRedisClusterMasterDown kills one master of three: the keys on its
// slots follow their limit's outage policy once their leases run out, while
// the keys on the other masters keep leasing; the master back, they recover.
func TestRedisClusterMasterDown(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	const instances = 2
	limits := []hybrid.Limit{{Name: "closed", Rate: 1000, Burst: 100, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed}}
	inst := make([]*hybrid.Limiter, instances)
	for i := range inst {
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ReadTimeout: 200 * time.Millisecond,
			WriteTimeout: 200 * time.Millisecond, DialTimeout: 200 * time.Millisecond, MaxRedirects: 1})
		t.Cleanup(func() { _ = cc.Close() })
		inst[i] = newLimiter(t, hybrid.Config{Redis: cc, Members: membership.NewStatic(fmt.Sprint("instance-", i), instances), Limits: limits})
	}
	ks := keys(60)
	// Which master holds each key's lease hash.
	admin := cl.Masters[0].Client(t)
	store := global.New(admin, "hybridlimit")
	owner := make(map[string]int, len(ks))
	for _, k := range ks {
		slot, err := admin.ClusterKeySlot(context.Background(), store.LeaseKey("closed", k)).Result()
		if err != nil {
			t.Fatal(err)
		}
		owner[k] = int(slot) * len(cl.Masters) / 16384
	}

	var mu sync.Mutex
	latest := map[string]hybrid.Source{}
	slow := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range inst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := ks[i%len(ks)]
				start := time.Now()
				d, err := l.Allow(context.Background(), "closed", k)
				took := time.Since(start)
				mu.Lock()
				if err == nil {
					latest[k] = d.Source
				}
				if took > 100*time.Millisecond {
					slow++
				}
				mu.Unlock()
				if i%len(ks) == 0 {
					time.Sleep(time.Millisecond) // pace the load; waits for nothing
				}
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()

	// state reports whether every key on master down decides with want
	// and every other key on a lease.
	state := func(down int, want hybrid.Source) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range ks {
			w := hybrid.SourceLease
			if owner[k] == down {
				w = want
			}
			if latest[k] != w {
				return false
			}
		}
		return true
	}
	eventually(t, 5*time.Second, "every key on a lease", func() bool { return state(-1, hybrid.SourceLease) })
	const victim = 1
	cl.Masters[victim].Kill(t)
	killed := time.Now()
	eventually(t, 10*time.Second, "keys of the dead master fail closed, the others keep leasing", func() bool {
		return state(victim, hybrid.SourceFailClosed)
	})
	t.Logf("keys of the dead master fail closed after %v", time.Since(killed).Round(time.Millisecond))
	for _, l := range inst {
		st, _ := l.Status("closed")
		if st.Degraded || st.FailingKeys == 0 {
			t.Errorf("status while one master is down: %+v; want the limit normal with some failing keys", st)
		}
	}
	cl.Masters[victim].Restart(t)
	back := time.Now()
	eventually(t, 15*time.Second, "every key on a lease again", func() bool { return state(-1, hybrid.SourceLease) })
	t.Logf("leases back %v after the master restarted", time.Since(back).Round(time.Millisecond))
	mu.Lock()
	defer mu.Unlock()
	if slow != 0 {
		t.Errorf("%d decisions took over 100ms", slow)
	}
}
