package redistest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/internal/redisproc"
)

// Cluster is a Redis Cluster of masters only, each a Server of its own,
// formed without redis-cli: the 16384 slots are split evenly with CLUSTER
// ADDSLOTSRANGE and the nodes introduced with CLUSTER MEET. Full coverage is
// not required, so the other masters keep serving while one is down.
type Cluster struct {
	// Masters are the nodes, in slot order: Masters[i] owns the i-th range.
	Masters []*Server
}

// StartCluster starts a cluster of masters nodes (at least 1) and waits
// until it is ready (WaitOK). Each node keeps its cluster
// configuration in its private directory, so Kill and Restart bring it back
// with its slots.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	if masters < 1 {
		t.Fatalf("redistest: a cluster needs at least one master, got %d", masters)
	}
	c := &Cluster{}
	var buses []int
	for range masters {
		bus, err := redisproc.FreePort()
		if err != nil {
			t.Fatalf("redistest: pick a free cluster bus port: %v", err)
		}
		buses = append(buses, bus)
		c.Masters = append(c.Masters, Start(t,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(bus),
			"--cluster-node-timeout", "1000",
			"--cluster-require-full-coverage", "no",
		))
	}
	const slots = 16384
	for i, m := range c.Masters {
		lo, hi := i*slots/masters, (i+1)*slots/masters-1
		m.do(t, "cluster", "addslotsrange", lo, hi)
	}
	host, port, _ := net.SplitHostPort(c.Masters[0].Addr)
	for _, m := range c.Masters[1:] {
		m.do(t, "cluster", "meet", host, port, buses[0])
	}
	c.WaitOK(t, 30*time.Second)
	return c
}

// Addrs returns the masters' addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Masters))
	for i, m := range c.Masters {
		addrs[i] = m.Addr
	}
	return addrs
}

// Client returns a new cluster client, closed in t.Cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// WaitOK polls every running master until it reports cluster_state:ok,
// knows all the others and which of them serves every slot, or fails the
// test after within.
func (c *Cluster) WaitOK(t testing.TB, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		bad := ""
		for _, m := range c.Masters {
			if why := m.clusterNotOK(len(c.Masters)); why != "" {
				bad = m.Addr + ": " + why
				break
			}
		}
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: cluster not ready within %v: %s", within, bad)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

// clusterNotOK says why m is not a settled member of a cluster of n
// masters, or "" when it is.
func (s *Server) clusterNotOK(n int) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := s.proc.Do(ctx, "cluster", "info")
	if err != nil {
		return err.Error()
	}
	// With full coverage not required, a node reports ok before it has
	// heard which node owns every slot: a client that loads the slots
	// from it then sends some keys nowhere until it reloads them.
	state, _ := info.(string)
	switch {
	case !strings.Contains(state, "cluster_state:ok"):
		return "cluster_state is not ok"
	case !strings.Contains(state, "cluster_slots_ok:16384"):
		return "not every slot known to be served"
	}
	v, err := s.proc.Do(ctx, "cluster", "nodes")
	if err != nil {
		return err.Error()
	}
	nodes, _ := v.(string)
	connected := 0
	for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		if len(f) >= 8 && strings.Contains(f[2], "master") && !strings.Contains(f[2], "fail") && f[7] == "connected" {
			connected++
		}
	}
	if connected != n {
		return fmt.Sprintf("%d of %d masters connected", connected, n)
	}
	return ""
}
