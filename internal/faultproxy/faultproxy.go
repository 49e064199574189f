package faultproxy

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// quiet silences the logger Toxiproxy's toxics write to (zerolog's global
// one, which would print to stderr).
var quiet sync.Once

// Proxy is a TCP proxy to one upstream address. Its methods are safe for
// concurrent use.
type Proxy struct {
	// Addr is the "127.0.0.1:PORT" clients connect to instead of the
	// upstream.
	Addr string

	p *toxiproxy.Proxy

	mu     sync.Mutex
	toxics []string // names of the toxics in force
}

// Start starts a proxy to upstream on a free port of 127.0.0.1, with no
// fault in force, and stops it in t.Cleanup.
func Start(t testing.TB, upstream string) *Proxy {
	t.Helper()
	quiet.Do(func() { zerolog.SetGlobalLevel(zerolog.Disabled) })
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "upstream", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("faultproxy: start a proxy to %s: %v", upstream, err)
	}
	t.Cleanup(p.Stop)
	return &Proxy{Addr: p.Listen, p: p}
}

// Direction says which way a fault acts: on what clients send (Upstream) or
// on what the server answers (Downstream).
type Direction string

// The directions of a fault.
const (
	Upstream   Direction = "upstream"
	Downstream Direction = "downstream"
)

// Latency delays every chunk of data going dir by d.
func (p *Proxy) Latency(t testing.TB, dir Direction, d time.Duration) {
	t.Helper()
	p.add(t, "latency", dir, map[string]any{"latency": d.Milliseconds()})
}

// Blackhole lets clients connect but passes no data either way: requests
// never reach the server and nothing is answered.
func (p *Proxy) Blackhole(t testing.TB) {
	t.Helper()
	// A timeout toxic with timeout 0 swallows data until it is removed.
	p.add(t, "timeout", Upstream, map[string]any{"timeout": 0})
	p.add(t, "timeout", Downstream, map[string]any{"timeout": 0})
}

// Reset resets (TCP RST) every connection as soon as a client sends on it;
// clients can still connect.
func (p *Proxy) Reset(t testing.TB) {
	t.Helper()
	p.add(t, "reset_peer", Upstream, map[string]any{"timeout": 0})
}

// Bandwidth limits data going dir to kbps kilobytes per second.
func (p *Proxy) Bandwidth(t testing.TB, dir Direction, kbps int) {
	t.Helper()
	p.add(t, "bandwidth", dir, map[string]any{"rate": kbps})
}

// Clear removes every fault: data flows freely again, on the connections
// that survived the fault and on new ones.
func (p *Proxy) Clear(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	names := p.toxics
	p.toxics = nil
	p.mu.Unlock()
	for _, name := range names {
		if err := p.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
			t.Fatalf("faultproxy: remove %s: %v", name, err)
		}
	}
}

func (p *Proxy) add(t testing.TB, typ string, dir Direction, attrs map[string]any) {
	t.Helper()
	name := typ + "_" + string(dir)
	spec, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": dir, "toxicity": 1, "attributes": attrs})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(string(spec))); err != nil {
		t.Fatalf("faultproxy: add %s: %v", name, err)
	}
	p.mu.Lock()
	p.toxics = append(p.toxics, name)
	p.mu.Unlock()
}
