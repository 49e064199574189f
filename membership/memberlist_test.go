package membership

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startNode joins a Local-profile node on 127.0.0.1, port 0, and closes it
// at the end of the test.
func startNode(t *testing.T, name string, mod func(*Config), seeds ...string) *Memberlist {
	t.Helper()
	cfg := Config{
		Name:     name,
		BindAddr: "127.0.0.1",
		Seeds:    seeds,
		Profile:  Local,
		Logger:   testLogger(t),
	}
	if mod != nil {
		mod(&cfg)
	}
	m, err := Join(cfg)
	if err != nil {
		t.Fatalf("Join(%s): %v", name, err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// testLogger sends logs to t.Log, so they show only for failing tests or -v.
// Lines logged after the test has ended (memberlist's timers may fire after
// its Shutdown) are dropped: t.Log would panic.
func testLogger(t *testing.T) *slog.Logger {
	w := &tWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
}

func (w *tWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func waitCount(t *testing.T, d time.Duration, want int, ms ...*Memberlist) {
	t.Helper()
	eventually(t, d, fmt.Sprintf("every node counts %d", want), func() bool {
		for _, m := range ms {
			if m.Count() != want {
				return false
			}
		}
		return true
	})
}

func TestMemberlistCluster(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	n1 := startNode(t, "n1", nil)
	if got := n1.Count(); got != 1 {
		t.Fatalf("single node Count() = %d, want 1", got)
	}
	var r recorder
	stop := n1.Watch(r.fn)
	defer stop()

	n2 := startNode(t, "n2", nil, n1.Addr())
	waitCount(t, 5*time.Second, 2, n1, n2)
	n3 := startNode(t, "n3", nil, n2.Addr())
	waitCount(t, 5*time.Second, 3, n1, n2, n3)

	eventually(t, 5*time.Second, "watcher sees 2 then 3", func() bool {
		return slices.Equal(r.values(), []int{2, 3})
	})
	if got, want := n2.Members(), []string{"n1", "n2", "n3"}; !slices.Equal(got, want) {
		t.Errorf("Members() = %v, want %v", got, want)
	}
	if n1.Name() != "n1" {
		t.Errorf("Name() = %q, want n1", n1.Name())
	}

	// Graceful leave: the others notice within a few gossip rounds.
	start := time.Now()
	if err := n3.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := n3.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	waitCount(t, 3*time.Second, 2, n1, n2)
	t.Logf("graceful leave seen after %v", time.Since(start))
	eventually(t, 5*time.Second, "watcher sees 3 then 2", func() bool {
		return slices.Equal(r.values(), []int{2, 3, 2})
	})
	if got, want := n1.Members(), []string{"n1", "n2"}; !slices.Equal(got, want) {
		t.Errorf("Members() after leave = %v, want %v", got, want)
	}
}

func TestMemberlistCrash(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	n1 := startNode(t, "n1", nil)
	n2 := startNode(t, "n2", nil, n1.Addr())
	n3 := startNode(t, "n3", nil, n1.Addr())
	waitCount(t, 5*time.Second, 3, n1, n2, n3)

	start := time.Now()
	if err := n3.close(false); err != nil { // no leave message: a crash
		t.Fatalf("crash: %v", err)
	}
	waitCount(t, 10*time.Second, 2, n1, n2)
	t.Logf("crash detected after %v", time.Since(start))
}

// countingTransport is a memberlist.NetTransport on 127.0.0.1, port 0, that
// counts the packets it sends, to show that memberlist used it.
type countingTransport struct {
	*memberlist.NetTransport
	packets atomic.Int64
}

func newCountingTransport(t *testing.T) *countingTransport {
	t.Helper()
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{"127.0.0.1"},
		Logger:    slog.NewLogLogger(testLogger(t).Handler(), slog.LevelDebug),
	})
	if err != nil {
		t.Fatal(err)
	}
	return &countingTransport{NetTransport: nt}
}

func (c *countingTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	c.packets.Add(1)
	return c.NetTransport.WriteTo(b, addr)
}

func (c *countingTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	c.packets.Add(1)
	return c.NetTransport.WriteToAddress(b, a)
}

// TestMemberlistTransport: a node on a transport of its own advertises the
// address the transport is bound to, so that another node can join the
// cluster through it, and gossips over it; BindAddr and BindPort are not
// bound (they name an address this host does not have).
func TestMemberlistTransport(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	for _, tt := range []struct {
		name          string
		advertiseAddr string
	}{
		{"bound address", ""},
		// memberlist would advertise port 0 here, taking AdvertisePort as given.
		{"advertised address without a port", "127.0.0.1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tr := newCountingTransport(t)
			n1 := startNode(t, "n1", func(c *Config) {
				c.Transport = tr
				c.BindAddr, c.BindPort = "192.0.2.1", 1 // TEST-NET-1: not bound
				c.AdvertiseAddr = tt.advertiseAddr
			})
			if want := net.JoinHostPort("127.0.0.1", strconv.Itoa(tr.GetAutoBindPort())); n1.Addr() != want {
				t.Fatalf("Addr() = %s, want the transport's %s", n1.Addr(), want)
			}
			n2 := startNode(t, "n2", nil, n1.Addr())
			waitCount(t, 5*time.Second, 2, n1, n2)
			eventually(t, 5*time.Second, "packets sent through the transport", func() bool { return tr.packets.Load() > 0 })
		})
	}
}

// TestJoinShutsDownTransport: Join owns the transport, even when it fails.
func TestJoinShutsDownTransport(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	tr := newCountingTransport(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tr.GetAutoBindPort()))
	m, err := Join(Config{Name: "n1", Transport: tr, MaxInstances: -1})
	if !errors.Is(err, ErrInvalidConfig) {
		if m != nil {
			_ = m.Close()
		}
		t.Fatalf("Join: err = %v, want ErrInvalidConfig", err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("the transport still listens on %s after a failed Join", addr)
	}
}

// TestMemberlistMaxInstancesWarns: MaxInstances does not cap Count, which
// would inflate every default share; a node that sees more members than
// MaxInstances reports them all and logs one warning per crossing: once when
// a third node joins two with MaxInstances 2, none when it leaves, once
// more when a fourth joins.
func TestMemberlistMaxInstancesWarns(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	warns := &warnCounter{}
	capAt2 := func(c *Config) { c.MaxInstances = 2 }
	logTo := func(c *Config) {
		c.MaxInstances = 2
		c.Logger = slog.New(warns)
	}
	n1 := startNode(t, "n1", logTo)
	n2 := startNode(t, "n2", capAt2, n1.Addr())
	waitCount(t, 5*time.Second, 2, n1, n2)
	if got := warns.count(); got != 0 {
		t.Fatalf("%d warnings with 2 members and MaxInstances 2, want none", got)
	}
	n3 := startNode(t, "n3", capAt2, n1.Addr())
	waitCount(t, 5*time.Second, 3, n1, n2, n3)
	if got := warns.count(); got != 1 {
		t.Errorf("%d warnings once 3 members joined with MaxInstances 2, want 1", got)
	}
	if err := n3.Close(); err != nil {
		t.Fatal(err)
	}
	waitCount(t, 5*time.Second, 2, n1, n2)
	n4 := startNode(t, "n4", capAt2, n1.Addr())
	waitCount(t, 5*time.Second, 3, n1, n2, n4)
	if got := warns.count(); got != 2 {
		t.Errorf("%d warnings after the count crossed MaxInstances twice, want 2", got)
	}
}

// warnCounter is a slog.Handler that counts the warnings about
// MaxInstances.
type warnCounter struct{ n atomic.Int64 }

func (w *warnCounter) count() int64                                 { return w.n.Load() }
func (w *warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnCounter) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w *warnCounter) WithGroup(string) slog.Handler                { return w }
func (w *warnCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn && strings.Contains(r.Message, "more members than MaxInstances") {
		w.n.Add(1)
	}
	return nil
}

// TestMemberlistEncryption: a node whose gossip key does not match the
// cluster's (another key, no key, or a key where the cluster has none)
// cannot join, gets an error that names the seed and says the encryption is
// why, and leaves the cluster's count as it was.
func TestMemberlistEncryption(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	key := bytes.Repeat([]byte{7}, 32)
	withKey := func(k []byte) func(*Config) {
		return func(c *Config) { c.SecretKey = k }
	}
	for _, tt := range []struct {
		name                  string
		clusterKey, joinerKey []byte
		why                   string // in memberlist's words
	}{
		{"another key", key, bytes.Repeat([]byte{8}, 32), "no installed keys could decrypt"},
		{"no key", key, nil, "remote state is encrypted and encryption is not configured"},
		{"a key where the cluster has none", nil, key, "encryption is configured but remote state is not encrypted"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n1 := startNode(t, "n1", withKey(tt.clusterKey))
			n2 := startNode(t, "n2", withKey(tt.clusterKey), n1.Addr())
			waitCount(t, 5*time.Second, 2, n1, n2)

			cfg := Config{
				Name:      "intruder",
				BindAddr:  "127.0.0.1",
				Seeds:     []string{n1.Addr()},
				SecretKey: tt.joinerKey,
				Profile:   Local,
				Logger:    testLogger(t),
			}
			fastRetries(&cfg)
			m, err := Join(cfg)
			if !errors.Is(err, ErrJoin) {
				if m != nil {
					_ = m.Close()
				}
				t.Fatalf("Join with %s: err = %v, want ErrJoin", tt.name, err)
			}
			t.Logf("%s: %v", tt.name, err)
			if !strings.Contains(err.Error(), n1.Addr()) {
				t.Errorf("error %q does not name the seed %s", err, n1.Addr())
			}
			if !strings.Contains(err.Error(), tt.why) {
				t.Errorf("error %q does not say why (%q)", err, tt.why)
			}
			for _, n := range []*Memberlist{n1, n2} {
				if got := n.Members(); !slices.Equal(got, []string{"n1", "n2"}) || n.Count() != 2 {
					t.Errorf("%s after the rejected join: Members() = %v, Count() = %d, want [n1 n2] and 2", n.Name(), got, n.Count())
				}
			}
		})
	}
}

func TestJoinInvalidConfig(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	tests := []struct {
		name string
		cfg  Config
	}{
		{"key of 10 bytes", Config{SecretKey: make([]byte, 10)}},
		{"key of 33 bytes", Config{SecretKey: make([]byte, 33)}},
		{"unknown profile", Config{Profile: 9}},
		{"negative max", Config{MaxInstances: -1}},
		{"name too long", Config{Name: strings.Repeat("n", MaxNameLength+1)}},
		{"negative leave timeout", Config{LeaveTimeout: -time.Second}},
		{"port out of range", Config{BindPort: 70000}},
		{"negative join timeout", Config{JoinTimeout: -time.Second}},
		{"negative retry interval", Config{RetryInterval: -time.Second}},
		{"negative max retry interval", Config{MaxRetryInterval: -time.Second}},
		{"max retry interval below retry interval", Config{RetryInterval: time.Second, MaxRetryInterval: time.Millisecond}},
		{"seed port out of range", Config{Seeds: []string{"127.0.0.1:70000"}}},
		{"seed port zero", Config{Seeds: []string{"members.example:0"}}},
		{"seed without host", Config{Seeds: []string{":7946"}}},
		{"seed with empty node name", Config{Seeds: []string{"/10.0.0.1:7946"}}},
		{"seed port not a number", Config{Seeds: []string{"10.0.0.1:http"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.BindAddr = "127.0.0.1"
			m, err := Join(tt.cfg)
			if !errors.Is(err, ErrInvalidConfig) {
				if m != nil {
					_ = m.Close()
				}
				t.Fatalf("Join: err = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func TestJoinUnreachableSeed(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	// A port that was free a moment ago: nobody listens there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seed := ln.Addr().String()
	ln.Close()

	cfg := Config{Name: "lonely", BindAddr: "127.0.0.1", Seeds: []string{seed}, Profile: Local, Logger: testLogger(t)}
	fastRetries(&cfg)
	m, err := Join(cfg)
	if !errors.Is(err, ErrJoin) {
		if m != nil {
			_ = m.Close()
		}
		t.Fatalf("Join(%s): err = %v, want ErrJoin", seed, err)
	}
	if !strings.Contains(err.Error(), seed) {
		t.Errorf("error %q does not name the seed %s", err, seed)
	}
	t.Logf("unreachable seed: %v", err)
}

func TestJoinAddrInUse(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	n1 := startNode(t, "n1", nil)
	_, port, _ := net.SplitHostPort(n1.Addr())
	var p int
	fmt.Sscan(port, &p)
	m, err := Join(Config{Name: "n2", BindAddr: "127.0.0.1", BindPort: p, Profile: Local})
	if !errors.Is(err, ErrStart) {
		if m != nil {
			_ = m.Close()
		}
		t.Fatalf("Join on a used port: err = %v, want ErrStart", err)
	}
}

// A node whose name a live member already has is refused, naming the
// name and where it lives, and the cluster goes on counting its members
// right; whether the name's owner is the seed or a member the seed knows.
func TestJoinNameInUse(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	a := startNode(t, "a", nil)
	b := startNode(t, "b", nil, a.Addr())
	waitCount(t, 5*time.Second, 2, a, b)
	for _, name := range []string{"a", "b"} {
		m, err := Join(Config{Name: name, BindAddr: "127.0.0.1", Seeds: []string{a.Addr()}, Profile: Local, Logger: testLogger(t)})
		if m != nil {
			_ = m.Close()
		}
		owner := map[string]*Memberlist{"a": a, "b": b}[name]
		if !errors.Is(err, ErrNameInUse) || !strings.Contains(err.Error(), strconv.Quote(name)) || !strings.Contains(err.Error(), owner.Addr()) {
			t.Errorf("Join as %q: err = %v, want ErrNameInUse naming it and %s", name, err, owner.Addr())
		}
	}
	c := startNode(t, "c", nil, a.Addr())
	waitCount(t, 5*time.Second, 3, a, b, c)
}

func TestMemberlistDefaults(t *testing.T) {
	t.Cleanup(func() { verifyNoLeaks(t) })
	var buf syncBuffer
	m, err := Join(Config{BindAddr: "127.0.0.1", Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	if m.Name() == "" || !strings.Contains(m.Name(), "-") {
		t.Errorf("generated Name() = %q, want host-suffix", m.Name())
	}
	if host, port, err := net.SplitHostPort(m.Addr()); err != nil || host != "127.0.0.1" || port == "0" {
		t.Errorf("Addr() = %q, want 127.0.0.1 and the chosen port", m.Addr())
	}
	if err := m.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if !strings.Contains(buf.String(), "memberlist:") {
		t.Errorf("memberlist's logs were not routed to Logger; got:\n%s", buf.String())
	}
	if got := m.Count(); got != 1 {
		t.Errorf("Count() after Close = %d, want 1", got)
	}
	// A watcher registered after Close is accepted and never called.
	m.Watch(func(int) { t.Error("watcher called after Close") })()
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestProfileString(t *testing.T) {
	for p, want := range map[Profile]string{LAN: "lan", Local: "local", 7: "Profile(7)"} {
		if got := p.String(); got != want {
			t.Errorf("Profile(%d).String() = %q, want %q", int(p), got, want)
		}
	}
}
