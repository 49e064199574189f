package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
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
		if (r.Strategy == "local" || r.Strategy == "hybrid") && *r.Decisions == 0 {
			t.Errorf("%s: no decisions", name)
		}
	}
	// Every strategy on every scenario.
	want := 0
	for _, sc := range workload.Scenarios(workload.QuickTiming()) {
		for _, st := range strategies {
			if !seen[sc.Name+" / "+st] {
				t.Errorf("no result for %s / %s", sc.Name, st)
			}
			want++
		}
	}
	if len(rep.Scenarios) != want {
		t.Errorf("%d results, want %d (one per scenario x strategy)", len(rep.Scenarios), want)
	}
	if len(rep.Targets) == 0 {
		t.Error("no target checks")
	}

	md := stdout.String()
	for _, want := range []string{"| scenario | strategy | decisions |", "Targets:", "not representative", "| scenario | rate·1 s + burst |",
		"| sticky | hybrid |"} {
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

// TestSweep runs the sweep in its quickest form on the embedded Redis, on
// two scenarios, so that it cannot rot: a result per scenario, strategy
// and grid point, a row per scenario in each table of worst figures, and
// the JSON.
func TestSweep(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "sweep.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"-embedded", "-quick", "-scale", "0.05", "-sweep", "-scenarios", "skewed,churn", "-json", jsonPath}, &stdout, &stderr)
	if code != exitOK {
		t.Fatalf("exit status %d\nstderr:\n%s", code, stderr.String())
	}
	var sw struct {
		Points  []struct{ Instances int } `json:"points"`
		Results []struct {
			Scenario  string `json:"scenario"`
			Strategy  string `json:"strategy"`
			Instances int    `json:"instances"`
			Point     *struct {
				Instances int    `json:"instances"`
				Name      string `json:"name"`
			} `json:"grid_point"`
		} `json:"results"`
		Extremes []struct {
			Scenario string `json:"scenario"`
			Strategy string `json:"strategy"`
			Points   int    `json:"points"`
		} `json:"extremes"`
		Targets []struct {
			Status string `json:"status"`
		} `json:"targets"`
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &sw); err != nil {
		t.Fatalf("JSON: %v", err)
	}
	points := len(sweepInstances) * len(sweepRateFactors) * len(sweepBurstFactors)
	if len(sw.Points) != points || len(grid()) != points {
		t.Errorf("%d points, want %d, every combination of the axes", len(sw.Points), points)
	}
	seen := map[string]bool{}
	for _, r := range sw.Results {
		if r.Point == nil || r.Point.Instances != r.Instances {
			t.Errorf("%s / %s: point %+v on %d instances", r.Scenario, r.Strategy, r.Point, r.Instances)
			continue
		}
		seen[r.Scenario+" / "+r.Strategy+" / "+r.Point.Name] = true
	}
	for _, v := range grid() {
		for _, sc := range []string{"skewed", "churn"} {
			for _, st := range sweepStrategies {
				if !seen[sc+" / "+st+" / "+v.String()] {
					t.Errorf("no result for %s / %s at %s", sc, st, v)
				}
			}
		}
	}
	if want := points * 2 * len(sweepStrategies); len(sw.Results) != want {
		t.Errorf("%d results, want %d", len(sw.Results), want)
	}
	if len(sw.Extremes) != 2*len(sweepStrategies) || len(sw.Targets) != 3 {
		t.Errorf("%d extremes and %d targets, want %d and 3", len(sw.Extremes), len(sw.Targets), 2*len(sweepStrategies))
	}
	md := stdout.String()
	for _, want := range []string{"Worst accuracy", "Most Redis commands per 1000 decisions", "| scenario | hybrid | global | local |", "Targets:"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	// A row per scenario in each of the two tables of worst figures.
	for _, sc := range []string{"skewed", "churn"} {
		if n := regexp.MustCompile(`(?m)^\| `+sc+` \| \d`).FindAllString(md, -1); len(n) != 2 {
			t.Errorf("%d rows of worst figures for %s, want 2:\n%s", len(n), sc, md)
		}
	}
	if !strings.Contains(stderr.String(), "(n=16 rate×2.1 burst×1.4)") {
		t.Errorf("the progress lines do not say the grid point:\n%s", stderr.String())
	}
}

func TestSweepUsage(t *testing.T) {
	o, err := parse([]string{"-sweep"}, io.Discard)
	if err != nil || !slices.Equal(o.strategies, sweepStrategies) {
		t.Errorf("-sweep: strategies %v, %v; want %v", o.strategies, err, sweepStrategies)
	}
	o, err = parse([]string{"-sweep", "-strategies", "hybrid,redis_rate"}, io.Discard)
	if err != nil || !slices.Equal(o.strategies, []string{"hybrid", "redis_rate"}) {
		t.Errorf("-sweep -strategies hybrid,redis_rate: %v, %v", o.strategies, err)
	}
	if _, err := parse([]string{"-sweep", "-html", "x.html"}, io.Discard); err == nil {
		t.Error("-sweep with -html: no error")
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
