//go:build unix

package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestNodeReloadsLimitsOnSIGHUP: a node reloads its -config file on
// SIGHUP: a changed rate and a new limit are in force and served at once,
// a file with problems is reported with its lines and changes nothing, and
// a limit left out of the file is no longer served.
func TestNodeReloadsLimitsOnSIGHUP(t *testing.T) {
	r, err := startRedis("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	path := filepath.Join(t.TempDir(), "limits.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const api = "limits:\n  - {name: api, rate: 300, burst: 30, mode: hybrid, on_outage: fail-local}\n"
	write(api)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stdout, stderr, code := started(ctx, "node", "-redis", r.Addr(), "-name", "n1", "-config", path)
	m := waitOutput(t, stdout, regexp.MustCompile(`node n1: gossip \S+, http http://(\S+),`), 10*time.Second)
	base := "http://" + m[1]
	defer http.DefaultClient.CloseIdleConnections()
	get := func(p string) int {
		t.Helper()
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	rates := func() map[string]float64 {
		t.Helper()
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var h health
		if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, l := range h.Limits {
			out[l.Name] = l.Rate
		}
		return out
	}
	// hup sends SIGHUP and checks what the node says about it.
	const said = "demo node: SIGHUP: "
	hup := func(want string) {
		t.Helper()
		before := strings.Count(stderr.String(), said)
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		re := regexp.MustCompile(want)
		deadline := time.Now().Add(10 * time.Second)
		for {
			out := stderr.String()
			if strings.Count(out, said) > before {
				if last := out[strings.LastIndex(out, said):]; !re.MatchString(last) {
					t.Fatalf("after SIGHUP the node said\n%s\nwant it to match %q", last, want)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("nothing said about SIGHUP within 10s:\n%s", out)
			}
			time.Sleep(20 * time.Millisecond) // polls the output
		}
	}

	write(strings.Replace(api, "rate: 300", "rate: 600", 1) + "  - {name: search, rate: 6000/min, burst: 20, mode: hybrid, on_outage: fail-open}\n")
	hup(`limits reloaded from \S+: api, search`)
	if got := rates(); got["api"] != 600 || got["search"] != 100 {
		t.Errorf("after the reload: rates %v, want api 600 and search 100", got)
	}
	if c := get("/search?key=k"); c != http.StatusOK {
		t.Errorf("GET /search after it was added: %d", c)
	}

	write("limits:\n  - {name: api, rate: 10, burst: 0, mode: hybrid, on_outage: fail-local}\n  - {name: metrics, rate: 1, burst: 1, mode: local, on_outage: fail-open}\n")
	hup(`limits not reloaded from \S+, the limits in force stay:\n\S+:2: limit "api": burst is 0.*\n\S+:3: limit "metrics": name "metrics": taken by the /metrics endpoint`)
	if got := rates(); got["api"] != 600 || got["search"] != 100 {
		t.Errorf("after a bad file: rates %v, want the limits in force kept", got)
	}

	write(api)
	hup(`limits reloaded from \S+: api\n`)
	if c := get("/search?key=k"); c != http.StatusNotFound {
		t.Errorf("GET /search after it was removed: %d, want 404", c)
	}
	if c := get("/api?key=k"); c != http.StatusOK {
		t.Errorf("GET /api: %d", c)
	}
	cancel()
	if c := <-code; c != exitOK {
		t.Errorf("node = %d, want %d; stderr:\n%s", c, exitOK, stderr.String())
	}
}
