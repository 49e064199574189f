package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/bench/internal/workload"
)

// TestQuickestRun runs the bench in its quickest form on the embedded Redis,
// so that it cannot rot: every scenario with every strategy, JSON and HTML.
func TestQuickestRun(t *testing.T) {
	dir := t.TempDir()
	jsonPath, htmlPath := filepath.Join(dir, "bench.json"), filepath.Join(dir, "bench.html")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"-embedded", "-quick", "-scale", "0.1", "-json", jsonPath, "-html", htmlPath}, &stdout, &stderr)
	if code != exitOK {
		t.Fatalf("exit status %d\nstderr:\n%s", code, stderr.String())
	}

	var rep struct {
		Representative bool `json:"representative"`
		Scenarios      []struct {
			Scenario         string   `json:"scenario"`
			Strategy         string   `json:"strategy"`
			Instances        int      `json:"instances"`
			Decisions        *int64   `json:"decisions"`
			Allowed          *int64   `json:"allowed"`
			ReferenceAllowed *int64   `json:"reference_allowed"`
			RedisCommands    *int64   `json:"redis_commands"`
			CountedBy        string   `json:"redis_commands_counted_by"`
			DecisionsPerSec  *float64 `json:"decisions_per_sec"`
			P50              *int64   `json:"p50_ns"`
			P99              *int64   `json:"p99_ns"`
			Series           []int    `json:"admitted_series"`
			Keys             int      `json:"keys"`
			Rate             float64  `json:"rate_per_key"`
			Burst            int      `json:"burst_per_key"`
			MaxWindow        *struct {
				Admitted  int64   `json:"admitted"`
				Reference int64   `json:"reference_admitted"`
				Bound     float64 `json:"bound"`
			} `json:"max_admitted_1s"`
		} `json:"scenarios"`
		Targets []struct {
			Status string `json:"status"`
		} `json:"targets"`
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("JSON: %v", err)
	}
	if rep.Representative {
		t.Error("a run on the embedded Redis says it is representative")
	}
	seen := map[string]bool{}
	for _, r := range rep.Scenarios {
		name := r.Scenario + " / " + r.Strategy
		if seen[name] {
			t.Errorf("%s: reported twice", name)
		}
		seen[name] = true
		if r.Decisions == nil || r.Allowed == nil || r.ReferenceAllowed == nil || r.RedisCommands == nil ||
			r.DecisionsPerSec == nil || r.P50 == nil || r.P99 == nil {
			t.Errorf("%s: a required field is missing: %+v", name, r)
			continue
		}
		if r.Instances != 4 {
			t.Errorf("%s: %d instances, want 4", name, r.Instances)
		}
		if *r.Allowed < 0 || *r.Allowed > *r.Decisions {
			t.Errorf("%s: allowed %d of %d decisions", name, *r.Allowed, *r.Decisions)
		}
		if *r.ReferenceAllowed <= 0 {
			t.Errorf("%s: reference admits %d", name, *r.ReferenceAllowed)
		}
		if *r.DecisionsPerSec <= 0 {
			t.Errorf("%s: %v decisions per second", name, *r.DecisionsPerSec)
		}
		if *r.Decisions > 0 && (*r.P50 <= 0 || *r.P99 < *r.P50) {
			t.Errorf("%s: p50 %d ns, p99 %d ns", name, *r.P50, *r.P99)
		}
		if r.CountedBy != "client" {
			t.Errorf("%s: commands counted by %q on the embedded Redis, want client", name, r.CountedBy)
		}
		if len(r.Series) == 0 {
			t.Errorf("%s: no time series", name)
		}
		switch w := r.MaxWindow; {
		case r.Keys == 1 && w == nil:
			t.Errorf("%s: one key, and no most admitted in a 1 s window", name)
		case r.Keys == 1 && (w.Bound != r.Rate+float64(r.Burst) || w.Reference <= 0 || w.Reference > int64(w.Bound) || w.Admitted < 0):
			t.Errorf("%s: most admitted in a 1 s window %+v, with rate %g and burst %d", name, *w, r.Rate, r.Burst)
		case r.Keys > 1 && w != nil:
			t.Errorf("%s: %d keys, and a most admitted in a 1 s window", name, r.Keys)
		}
		switch r.Strategy {
		case "local":
			if *r.RedisCommands != 0 {
				t.Errorf("%s: %d Redis commands without Redis", name, *r.RedisCommands)
			}
		case "global", "redis_rate":
			if *r.Decisions > 0 && *r.RedisCommands <= 0 {
				t.Errorf("%s: no Redis commands", name)
			}
		}
		// Local and hybrid decide in process: they keep up with any
		// schedule the bench sets, and must decide something.
		if (r.Strategy == "local" || r.Strategy == "hybrid" || r.Strategy == "hybrid-exact") && *r.Decisions == 0 {
			t.Errorf("%s: no decisions", name)
		}
	}
	// Every strategy on every scenario, but hybrid-exact on keys, thin and
	// sticky only.
	want := 0
	for _, sc := range workload.Scenarios(workload.QuickTiming()) {
		for _, st := range strategies {
			exactOnly := st == "hybrid-exact" && sc.Name != "keys" && sc.Name != "thin" && sc.Name != "sticky"
			switch {
			case exactOnly && seen[sc.Name+" / "+st]:
				t.Errorf("a result for %s / %s: hybrid-exact runs on keys, thin and sticky unless named", sc.Name, st)
			case !exactOnly && !seen[sc.Name+" / "+st]:
				t.Errorf("no result for %s / %s", sc.Name, st)
			case !exactOnly:
				want++
			}
		}
	}
	if len(rep.Scenarios) != want {
		t.Errorf("%d results, want %d (one per scenario x strategy, hybrid-exact on 3 scenarios)", len(rep.Scenarios), want)
	}
	if len(rep.Targets) == 0 {
		t.Error("no target checks")
	}

	md := stdout.String()
	for _, want := range []string{"| scenario | strategy | decisions |", "Targets:", "not representative", "| scenario | rate·1 s + burst |",
		"Burst semantics: hybrid splits", "| sticky | hybrid-exact |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if !regexp.MustCompile(`\[\d+/\d+\] \w+ / \w+`).MatchString(stderr.String()) {
		t.Errorf("no progress line on stderr:\n%s", stderr.String())
	}

	page, err := os.ReadFile(htmlPath)
	if err != nil {
		t.Fatal(err)
	}
	html := string(page)
	if loads := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?\s*(https?:)?//`).FindAllString(html, -1); len(loads) > 0 {
		t.Errorf("HTML loads from the network: %q", loads)
	}
	if strings.Contains(html, "<script") || strings.Contains(html, "<link") || strings.Contains(html, "@import") {
		t.Error("HTML has a script, a link or an @import: it must stand alone")
	}
	if n := strings.Count(html, "<svg"); n < len(workload.Scenarios(workload.QuickTiming()))+1 {
		t.Errorf("HTML has %d charts, want a scatter per scenario and the outage time series", n)
	}
	if !strings.Contains(html, "outage: admitted per second") {
		t.Error("HTML lacks the outage time series")
	}
}

// TestSkips checks which scenarios hybrid-exact runs on: keys, thin and
// sticky by default, every selected one when -strategies names it.
func TestSkips(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		scenario string
		strategy string
		skips    bool
	}{
		{nil, "keys", "hybrid-exact", false},
		{nil, "thin", "hybrid-exact", false},
		{nil, "sticky", "hybrid-exact", false},
		{nil, "balanced", "hybrid-exact", true},
		{nil, "churn", "hybrid-exact", true},
		{nil, "balanced", "hybrid", false},
		{[]string{"-scenarios", "balanced,keys"}, "balanced", "hybrid-exact", true},
		{[]string{"-strategies", "global,hybrid-exact"}, "balanced", "hybrid-exact", false},
		{[]string{"-strategies", "global,hybrid-exact"}, "churn", "hybrid-exact", false},
		{[]string{"-strategies", "global,hybrid"}, "balanced", "global", false},
	} {
		o, err := parse(tc.args, io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if got := o.skips(tc.scenario, tc.strategy); got != tc.skips {
			t.Errorf("%q: skips(%s, %s) = %v, want %v", tc.args, tc.scenario, tc.strategy, got, tc.skips)
		}
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"-embedded", "-redis", "127.0.0.1:1"}, exitUsage},
		{[]string{"-scale", "0"}, exitUsage},
		{[]string{"-scenarios", "nope"}, exitUsage},
		{[]string{"-strategies", "nope"}, exitUsage},
		{[]string{"-contended-ttl", "10ms"}, exitUsage},
		{[]string{"extra"}, exitUsage},
		{[]string{"-h"}, exitOK},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), tc.args, &stdout, &stderr); code != tc.code {
			t.Errorf("%q: exit status %d, want %d\nstderr: %s", tc.args, code, tc.code, stderr.String())
		}
	}
}

// TestNoRedisServer checks the message and exit status when there is no
// redis-server on PATH and neither -redis nor -embedded is given.
func TestNoRedisServer(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"-quick"}, &stdout, &stderr); code != exitUsage {
		t.Fatalf("exit status %d, want %d\nstderr: %s", code, exitUsage, stderr.String())
	}
	if !strings.Contains(stderr.String(), "no redis-server on PATH") || !strings.Contains(stderr.String(), "-embedded") {
		t.Errorf("message does not say what to do: %s", stderr.String())
	}
}
