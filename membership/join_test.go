package membership

import (
	"context"
	"errors"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/internal/gossiptest"
)

// fastRetries sets back-off timings small enough for tests: a failed join
// takes about a fifth of a second.
func fastRetries(c *Config) {
	c.JoinTimeout = 200 * time.Millisecond
	c.RetryInterval = 10 * time.Millisecond
	c.MaxRetryInterval = 50 * time.Millisecond
}

// freePort returns a port of 127.0.0.1 that nothing listened on a moment
// ago, for a node that must be seeded before it starts.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// resolver is a Config.Resolve whose answers the test sets, and which
// counts its calls.
type resolver struct {
	mu      sync.Mutex
	answers []func() ([]string, error) // for the next calls; the last one repeats
	calls   int
	hosts   []string
	called  chan struct{} // receives a value at every call, if there is room
}

func newResolver(answers ...func() ([]string, error)) *resolver {
	return &resolver{answers: answers, called: make(chan struct{}, 100)}
}

func (r *resolver) resolve(_ context.Context, host string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	r.hosts = append(r.hosts, host)
	select {
	case r.called <- struct{}{}:
	default:
	}
	a := r.answers[0]
	if len(r.answers) > 1 {
		r.answers = r.answers[1:]
	}
	return a()
}

// answer sets what the later calls return.
func (r *resolver) answer(a func() ([]string, error)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answers = []func() ([]string, error){a}
}

func (r *resolver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// waitCalls waits for n more calls of the resolver.
func (r *resolver) waitCalls(t *testing.T, n int, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for range n {
		select {
		case <-r.called:
		case <-deadline:
			t.Fatalf("the resolver was not called %d more times within %v", n, within)
		}
	}
}

func ips(addrs ...string) func() ([]string, error) {
	return func() ([]string, error) { return addrs, nil }
}

func notFound(host string) func() ([]string, error) {
	return func() ([]string, error) {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
}

// joined is the result of a Join run in the background.
type joined struct {
	m   *Memberlist
	err error
}

func joinAsync(t *testing.T, cfg Config) <-chan joined {
	t.Helper()
	c := make(chan joined, 1)
	go func() {
		m, err := Join(cfg)
		if m != nil {
			t.Cleanup(func() { _ = m.Close() })
		}
		c <- joined{m, err}
	}()
	return c
}

func wait(t *testing.T, c <-chan joined, within time.Duration) *Memberlist {
	t.Helper()
	select {
	case j := <-c:
		if j.err != nil {
			t.Fatalf("Join: %v", j.err)
		}
		return j.m
	case <-time.After(within):
		t.Fatalf("Join did not return within %v", within)
		return nil
	}
}

func TestBackoff(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name        string
		first, most time.Duration
		u           float64
		want        []time.Duration
	}{
		{"shortest waits: half of each bound", 100 * ms, time.Second, 0,
			[]time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 500 * ms, 500 * ms}},
		{"middle", 100 * ms, time.Second, 0.5,
			[]time.Duration{75 * ms, 150 * ms, 300 * ms, 600 * ms, 750 * ms, 750 * ms}},
		{"cap not a power of two of the first", 100 * ms, 300 * ms, 0,
			[]time.Duration{50 * ms, 100 * ms, 150 * ms, 150 * ms}},
		{"first equal to the cap", time.Second, time.Second, 0,
			[]time.Duration{500 * ms, 500 * ms}},
		{"no overflow near the largest duration", math.MaxInt64 / 3, math.MaxInt64, 0,
			[]time.Duration{math.MaxInt64 / 6, math.MaxInt64 / 3, math.MaxInt64 / 2, math.MaxInt64 / 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := backoff{first: tt.first, most: tt.most}
			for i, want := range tt.want {
				if got := b.next(tt.u); got != want {
					t.Fatalf("wait %d = %v, want %v", i, got, want)
				}
			}
		})
	}
	// Any u in [0, 1) stays in [d/2, d).
	b := backoff{first: 100 * ms, most: 100 * ms}
	if got := b.next(math.Nextafter(1, 0)); got < 50*ms || got >= 100*ms {
		t.Errorf("wait with u just below 1 = %v, want in [50ms, 100ms)", got)
	}
}

func TestParseSeeds(t *testing.T) {
	got, err := parseSeeds([]string{"10.0.0.1:7000", "members.example", "[::1]:7001", "::1", "n1/10.0.0.2:7002"}, 7946)
	if err != nil {
		t.Fatal(err)
	}
	want := []seed{
		{raw: "10.0.0.1:7000", host: "10.0.0.1", port: "7000", isIP: true},
		{raw: "members.example", host: "members.example", port: "7946"},
		{raw: "[::1]:7001", host: "::1", port: "7001", isIP: true},
		{raw: "::1", host: "::1", port: "7946", isIP: true},
		{raw: "n1/10.0.0.2:7002", nodeName: "n1/", host: "10.0.0.2", port: "7002", isIP: true},
	}
	if len(got) != len(want) {
		t.Fatalf("parseSeeds = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("seed %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestJoinRetriesUntilSeedListens: two nodes of a deployment start at about
// the same moment, each seeding the other. The first one's attempts fail
// while the second is not yet listening; it retries, and they end up as
// one cluster.
func TestJoinRetriesUntilSeedListens(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	portA, portB := freePort(t), freePort(t)
	// a names b through a resolver, to see its attempts: a second
	// resolution means the first attempt failed.
	r := newResolver(ips("127.0.0.1"))
	cfgA := Config{Name: "a", BindAddr: "127.0.0.1", BindPort: portA, Profile: Local, Logger: testLogger(t).With("node", "a"),
		Seeds: []string{net.JoinHostPort("b.test", strconv.Itoa(portB))}, Resolve: r.resolve}
	fastRetries(&cfgA)
	cfgA.JoinTimeout = 20 * time.Second
	resA := joinAsync(t, cfgA)
	r.waitCalls(t, 2, 10*time.Second)

	cfgB := Config{Name: "b", BindAddr: "127.0.0.1", BindPort: portB, Profile: Local, Logger: testLogger(t).With("node", "b"),
		Seeds: []string{loopback(portA)}}
	fastRetries(&cfgB)
	resB := joinAsync(t, cfgB)

	a, b := wait(t, resA, 20*time.Second), wait(t, resB, 20*time.Second)
	waitCount(t, 5*time.Second, 2, a, b)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hosts[0] != "b.test" {
		t.Errorf("resolved %q, want the seed's host b.test", r.hosts[0])
	}
}

// TestJoinGivesUp: when no seed answers within JoinTimeout, Join retries
// until then, shuts the node down and returns ErrJoin, saying why the last
// attempt failed; nothing keeps trying afterwards (goleak).
func TestJoinGivesUp(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	port := freePort(t) // nothing listens there
	for _, tt := range []struct {
		name    string
		answers func() ([]string, error)
		why     string
	}{
		{"nothing listening", ips("127.0.0.1"), "connection refused"},
		{"name not found", notFound("members.test"), "no such host"},
		{"name without addresses", ips(), "no addresses"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newResolver(tt.answers)
			cfg := Config{Name: "lonely", BindAddr: "127.0.0.1", Profile: Local, Logger: testLogger(t),
				Seeds: []string{net.JoinHostPort("members.test", strconv.Itoa(port))}, Resolve: r.resolve}
			fastRetries(&cfg)
			start := time.Now()
			m, err := Join(cfg)
			took := time.Since(start)
			if !errors.Is(err, ErrJoin) {
				if m != nil {
					_ = m.Close()
				}
				t.Fatalf("Join: err = %v, want ErrJoin", err)
			}
			t.Logf("after %v: %v", took, err)
			if took < cfg.JoinTimeout {
				t.Errorf("Join gave up after %v, before JoinTimeout %v", took, cfg.JoinTimeout)
			}
			// 200ms of waits from 5ms to 50ms: several attempts.
			if n := r.count(); n < 3 {
				t.Errorf("the seed was resolved %d times, want an attempt every 50ms at most", n)
			}
			for _, want := range []string{"members.test", tt.why, "attempts"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			calls := r.count()
			verifyNoLeaks(t)
			if r.count() != calls {
				t.Errorf("the seed was resolved again after Join gave up")
			}
		})
	}
}

// TestJoinContextCancelled: cancelling JoinContext's context stops the
// retries; the error wraps both ErrJoin and the context's error.
func TestJoinContextCancelled(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	r := newResolver(notFound("members.test"))
	cfg := Config{Name: "n1", BindAddr: "127.0.0.1", Profile: Local, Logger: testLogger(t),
		Seeds: []string{"members.test:7946"}, Resolve: r.resolve}
	fastRetries(&cfg)
	cfg.JoinTimeout = time.Hour
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		m, err := JoinContext(ctx, cfg)
		if m != nil {
			_ = m.Close()
		}
		done <- err
	}()
	r.waitCalls(t, 2, 10*time.Second)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, ErrJoin) || !errors.Is(err, context.Canceled) {
			t.Errorf("JoinContext after cancel: err = %v, want ErrJoin and context.Canceled", err)
		}
		t.Logf("cancelled: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("JoinContext still retrying 10s after its context was cancelled")
	}

	// A context that has ended already: no attempt at all.
	m, err := JoinContext(ctx, cfg)
	if m != nil {
		_ = m.Close()
	}
	if !errors.Is(err, ErrJoin) || !errors.Is(err, context.Canceled) {
		t.Errorf("JoinContext with a cancelled context: err = %v, want ErrJoin and context.Canceled", err)
	}
}

// TestJoinItself: the first instance of a deployment whose seeds name every
// instance, itself included, starts the cluster at once, and the others
// join it as they come up.
func TestJoinItself(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	portA, portB := freePort(t), freePort(t)
	seeds := []string{loopback(portA), loopback(portB)}
	start := func(name string, port int) *Memberlist {
		cfg := Config{Name: name, BindAddr: "127.0.0.1", BindPort: port, Profile: Local, Logger: testLogger(t).With("node", name), Seeds: seeds}
		fastRetries(&cfg)
		cfg.JoinTimeout = time.Hour // must not matter
		return wait(t, joinAsync(t, cfg), 10*time.Second)
	}
	a := start("a", portA)
	if a.Count() != 1 {
		t.Fatalf("a alone: Count() = %d, want 1", a.Count())
	}
	b := start("b", portB)
	waitCount(t, 5*time.Second, 2, a, b)
}

// TestRejoin: a node whose peers all left or died tries its seeds in the
// background until one is back, then counts it again.
func TestRejoin(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	for _, tt := range []struct {
		name  string
		leave bool
	}{
		{"peer left", true},
		{"peer crashed", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			port := freePort(t)
			seed := func(c *Config) { c.BindPort = port }
			n1 := startNode(t, "n1", seed)
			n2 := startNode(t, "n2", fastRetries, loopback(port))
			waitCount(t, 5*time.Second, 2, n1, n2)

			if err := n1.close(tt.leave); err != nil {
				t.Fatal(err)
			}
			waitCount(t, 20*time.Second, 1, n2)

			// A new instance at the seed's address, which does not know n2.
			n3 := startNode(t, "n3", seed)
			waitCount(t, 10*time.Second, 2, n2, n3)
		})
	}
}

// TestRejoinAfterPartition: a node cut off from every other member by a
// partition counts 1; once the partition heals, it rejoins through its
// seed, although memberlist alone would no longer gossip with a node it
// declared dead long ago.
func TestRejoinAfterPartition(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	nw := gossiptest.NewNetwork(nil)
	t.Cleanup(nw.Shutdown)
	transport := func(group string) func(*Config) {
		tr, err := nw.Transport(group)
		if err != nil {
			t.Fatal(err)
		}
		return func(c *Config) {
			c.Transport = tr
			fastRetries(c)
		}
	}
	l := startNode(t, "l", transport("left"))
	r := startNode(t, "r", transport("right"), l.Addr())
	waitCount(t, 5*time.Second, 2, l, r)

	nw.Split("left", "right")
	split := time.Now()
	waitCount(t, 60*time.Second, 1, l, r)
	t.Logf("partition detected after %v", time.Since(split))
	_, dials := nw.Dropped()
	// r keeps trying its seed across the split: its dials are refused.
	eventually(t, 5*time.Second, "r tries its seed while alone", func() bool {
		_, d := nw.Dropped()
		return d > dials
	})

	nw.Heal()
	healed := time.Now()
	waitCount(t, 10*time.Second, 2, l, r)
	t.Logf("merged %v after the heal", time.Since(healed))
}

// TestRejoinDNS: seeds named by DNS are resolved again at every attempt,
// at Join and in the background: the name first resolves to nothing, then
// to an address where nothing listens, then to a member; when that member
// is gone, the name moves to another instance, which the node joins.
func TestRejoinDNS(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	port := freePort(t)
	a := startNode(t, "a", func(c *Config) { c.BindPort = port })

	r := newResolver(notFound("members.test"), ips("127.0.0.2"), ips("127.0.0.1"))
	b := startNode(t, "b", func(c *Config) {
		fastRetries(c)
		c.JoinTimeout = 20 * time.Second
		c.Resolve = r.resolve
	}, net.JoinHostPort("members.test", strconv.Itoa(port)))
	waitCount(t, 5*time.Second, 2, a, b)
	if n := r.count(); n < 3 {
		t.Errorf("the seed name was resolved %d times to join, want 3", n)
	}

	// The instance at 127.0.0.1 goes away and the name now gives another
	// address: 127.0.0.2, the same port.
	r.answer(ips("127.0.0.2"))
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	waitCount(t, 10*time.Second, 1, b)
	calls := r.count()
	c, err := Join(Config{Name: "c", BindAddr: "127.0.0.2", BindPort: port, Profile: Local, Logger: testLogger(t).With("node", "c")})
	if err != nil {
		t.Skipf("cannot bind 127.0.0.2 on this system: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	waitCount(t, 10*time.Second, 2, b, c)
	if r.count() == calls {
		t.Errorf("b joined c without resolving the seed name again")
	}
}

// TestCloseStopsRejoin: Close ends the background attempts at once, even
// when they are waiting for a long back-off, and leaves no goroutine.
func TestCloseStopsRejoin(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	port := freePort(t)
	r := newResolver(ips("127.0.0.1"))
	m := startNode(t, "n1", func(c *Config) {
		c.BindPort = port
		c.Resolve = r.resolve
		c.RetryInterval = time.Hour
	}, net.JoinHostPort("self.test", strconv.Itoa(port)))
	if m.Count() != 1 {
		t.Fatalf("Count() = %d, want 1", m.Count())
	}
	start := time.Now()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Close took %v while the node waited to retry its seeds", took)
	}
}
