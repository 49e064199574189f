package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	redis.SetLogger(quietRedis{})
	goleak.VerifyTestMain(m)
}

// syncBuffer is a bytes.Buffer that run may write while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// started runs the command line args in the background until ctx ends and
// returns its output and a channel that receives its exit code.
func started(ctx context.Context, args ...string) (stdout, stderr *syncBuffer, code <-chan int) {
	stdout, stderr = &syncBuffer{}, &syncBuffer{}
	c := make(chan int, 1)
	go func() { c <- run(ctx, args, stdout, stderr) }()
	return stdout, stderr, c
}

// waitOutput polls out until re matches it, and returns the submatches.
func waitOutput(t *testing.T, out *syncBuffer, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("output has nothing matching %q after %v:\n%s", re, timeout, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDemoRunsEveryPhaseAndSummarises(t *testing.T) {
	var stdout, stderr syncBuffer
	begin := time.Now()
	code := run(t.Context(), []string{"-duration", "8s"}, &stdout, &stderr)
	out := stdout.String()
	t.Logf("ran in %v:\n%s", time.Since(begin).Round(time.Millisecond), out)
	if code != exitOK {
		t.Fatalf("run = %d, want %d; stderr:\n%s", code, exitOK, stderr.String())
	}
	i := strings.Index(out, "== summary")
	if i < 0 {
		t.Fatal("no summary")
	}
	summary := out[i:]
	for _, phase := range []string{"balanced load", "skewed load", "redis down", "redis back", "one leaves"} {
		if !regexp.MustCompile(`(?m)^` + phase + ` +[0-9.]+ +[0-9]+ +api `).MatchString(summary) {
			t.Errorf("summary has no row for phase %q", phase)
		}
		if !strings.Contains(out, "== phase") || !strings.Contains(out, ": "+phase+" (") {
			t.Errorf("phase %q was not announced", phase)
		}
	}
	// A smoke test: the library's own tests hold the exact bounds.
	m := regexp.MustCompile(`(?m)^balanced load +[0-9.]+ +3 +api +fail-local +300 +([0-9.]+) `).FindStringSubmatch(summary)
	if m == nil {
		t.Fatal("no balanced-load row for api")
	}
	if admitted, _ := strconv.ParseFloat(m[1], 64); admitted < 300*0.6 || admitted > 300*1.4 {
		t.Errorf("balanced load: api admitted %.1f/s across the cluster, want 300/s ± 40%%", admitted)
	}
	for _, want := range []string{
		"while Redis was down:",
		"refused 100% of requests",     // login, fail-closed
		"let 100% of requests through", // search, fail-open
		"every instance counts N = 2",  // the one that left is gone
		"in all: ",                     // Redis commands against one per request
		"runs on its leases again",     // recovery
		"follows its outage policy",    // policy in force
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output does not contain %q", want)
		}
	}
	if !regexp.MustCompile(`(?m)^ +[0-9.]+ i1 +3 \| normal +100\.0 `).MatchString(out) {
		t.Error("the live table has no row for i1 at its default share of api")
	}
	if strings.Contains(out, "\x1b") {
		t.Error("output has terminal escape codes")
	}
}

func TestDemoInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stdout, stderr, code := started(ctx, "-duration", "60s")
	waitOutput(t, stdout, regexp.MustCompile(`(?m)^ +[0-9.]+ all `), 15*time.Second)
	cancel()
	cancelled := time.Now()
	select {
	case c := <-code:
		if c != exitInterrupted {
			t.Errorf("run = %d after the interrupt, want %d; stderr:\n%s", c, exitInterrupted, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return within 10s of the interrupt")
	}
	if took := time.Since(cancelled); took > 5*time.Second {
		t.Errorf("run took %v to stop after the interrupt", took)
	}
	out := stdout.String()
	if !strings.Contains(out, "interrupted: stopping the cluster") || !strings.Contains(out, "== summary") {
		t.Errorf("output does not say it was interrupted, then summarise:\n%s", out)
	}
}

func TestDemoFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-instances", "0"}, "-instances 0: give 1 to 16"},
		{[]string{"-duration", "1s"}, "-duration 1s: give at least 2s"},
		{[]string{"-load", "0"}, "-load 0: give 0.1 to 10"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-nope"}, "flag provided but not defined: -nope"},
		{[]string{"-config", "no-such-file.yaml"}, "no-such-file.yaml"},
		{[]string{"node"}, "-redis is required"},
		{[]string{"node", "-redis", "127.0.0.1:1", "x"}, `unexpected argument "x"`},
		{[]string{"redis", "x"}, `unexpected argument "x"`},
	} {
		var stdout, stderr syncBuffer
		if code := run(t.Context(), tc.args, &stdout, &stderr); code != exitUsage {
			t.Errorf("run %q = %d, want %d", tc.args, code, exitUsage)
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("run %q: stderr %q does not say %q", tc.args, stderr.String(), tc.want)
		}
	}
}

func TestNodesFormACluster(t *testing.T) {
	r, err := startRedis("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	ctx1, cancel1 := context.WithCancel(t.Context())
	defer cancel1()
	out1, err1, code1 := started(ctx1, "node", "-redis", r.Addr(), "-name", "n1")
	addrs := regexp.MustCompile(`node n1: gossip (\S+), http http://(\S+),`)
	m := waitOutput(t, out1, addrs, 10*time.Second)
	gossip, httpAddr := m[1], m[2]

	ctx2, cancel2 := context.WithCancel(t.Context())
	defer cancel2()
	out2, err2, code2 := started(ctx2, "node", "-redis", r.Addr(), "-name", "n2", "-join", gossip, "-config", "limits.yaml")

	waitOutput(t, out1, regexp.MustCompile(`(?m)s n1 N=2 \| api normal share`), 10*time.Second)
	waitOutput(t, out2, regexp.MustCompile(`(?m)s n2 N=2 \| api normal share`), 10*time.Second)

	// Each node serves the limits behind the middleware, and /healthz.
	resp, err := http.Get("http://" + httpAddr + "/api?key=test")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("RateLimit-Policy") == "" {
		t.Errorf("GET /api: %s, RateLimit-Policy %q", resp.Status, resp.Header.Get("RateLimit-Policy"))
	}
	resp, err = http.Get("http://" + httpAddr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var h health
	err = json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if err != nil || h.Name != "n1" || h.Instances != 2 || len(h.Limits) != 3 {
		t.Errorf("GET /healthz: %+v, %v; want n1 with 2 instances and 3 limits", h, err)
	}
	resp, err = http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	resp.Body.Close()
	if !strings.Contains(body.String(), "hybridlimit_peers 2") {
		t.Errorf("GET /metrics has no hybridlimit_peers 2:\n%s", body.String())
	}
	http.DefaultClient.CloseIdleConnections()

	// n2 leaves; n1 sees N fall back to 1. Each node exits 0 on Ctrl-C.
	cancel2()
	if c := <-code2; c != exitOK {
		t.Errorf("node n2 = %d, want %d; stderr:\n%s", c, exitOK, err2.String())
	}
	waitOutput(t, out1, regexp.MustCompile(`(?m)s n1 N=1 \|`), 10*time.Second)
	cancel1()
	if c := <-code1; c != exitOK {
		t.Errorf("node n1 = %d, want %d; stderr:\n%s", c, exitOK, err1.String())
	}
}

func TestNodeCannotJoin(t *testing.T) {
	var stdout, stderr syncBuffer
	// A free port with nothing listening: bind one and close it.
	code := run(t.Context(), []string{"node", "-redis", "127.0.0.1:1", "-join", freeAddr(t), "-join-timeout", "100ms"}, &stdout, &stderr)
	if code != exitError || !strings.Contains(stderr.String(), "cannot join cluster") {
		t.Errorf("run = %d, stderr %q; want %d and a join error", code, stderr.String(), exitError)
	}
}

func TestRedisCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stdout, _, code := started(ctx, "redis")
	m := waitOutput(t, stdout, regexp.MustCompile(`listening on (\S+);`), 10*time.Second)
	rdb := newRedisClient(m[1])
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Errorf("PING the embedded Redis: %v", err)
	}
	cancel()
	if c := <-code; c != exitOK {
		t.Errorf("run = %d, want %d", c, exitOK)
	}
}

// freeAddr returns a 127.0.0.1 address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
