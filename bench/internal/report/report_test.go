package report

import (
	"bytes"
	"encoding/json"
	"math"
	"regexp"
	"strings"
	"testing"
)

// sample is a report with the shape of a real one: every target met but
// hybrid's commands on keys (above half of global's).
func sample() *Report {
	r := &Report{Run: Run{Redis: "test <server>", Representative: true, CPUs: 2}}
	for _, sc := range []string{"balanced", "skewed", "keys", "hotkey", "outage", "churn", "thin", "pulse", "shift"} {
		for _, st := range []string{Local, Global, Hybrid, RedisRate} {
			res := Result{Scenario: sc, Strategy: st, Instances: 4, Decisions: 10000, Allowed: 5000, ReferenceAllowed: 5000,
				P50: 200, P99: 800, BucketNS: 1e8, EndNS: 1e9, WarmupNS: 2e8, Rate: 1000, Burst: 100,
				Series: []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, RefSeries: []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}
			switch st {
			case Global, RedisRate:
				res.RedisCommands = 10000
			case Hybrid:
				res.RedisCommands = 5 // 2000x fewer
				switch sc {
				case "skewed", "churn", "pulse", "shift":
					res.RedisCommands = 100 // 100x fewer
				case "keys":
					res.RedisCommands = 6000 // 0.6 of global's: not met
				case "thin":
					res.RedisCommands = 7000
				}
			}
			switch sc {
			case "balanced", "skewed", "hotkey", "outage", "churn", "pulse", "shift":
				res.MaxWindow = &Window{WidthNS: 1e9, Admitted: 1100, Reference: 1100, Bound: 1100}
			}
			if sc == "outage" {
				res.Events = []Event{{AtNS: 4e8, Kind: "pause"}, {AtNS: 5e8, Kind: "kill"}, {AtNS: 7e8, Kind: "restart"}}
				res.OutageDecisions, res.OutageP99, res.UpP99 = 100, 900, 700
			}
			if sc == "churn" {
				res.Events = []Event{{AtNS: 4e8, Kind: "leave", Slot: 3}, {AtNS: 7e8, Kind: "join", Slot: 3}}
			}
			r.Scenarios = append(r.Scenarios, res)
		}
	}
	r.Find("outage", RedisRate).MaxWindow.Admitted = 1430 // failing open
	r.Find("churn", Hybrid).MaxWindow.Admitted = 1500     // within the allowance of 2 changes
	r.ClosedLoop = []ClosedLoop{
		{Strategy: Global, Shape: "one key", DecisionsPerSec: 20000},
		{Strategy: Hybrid, Shape: "one key", DecisionsPerSec: 5e6},
	}
	r.Finish()
	r.CheckTargets()
	return r
}

// target returns the one target of r whose name has frag, failing t if
// there is not exactly one.
func target(t *testing.T, r *Report, frag string) Target {
	t.Helper()
	var found []Target
	for _, tg := range r.Targets {
		if strings.Contains(tg.Name, frag) {
			found = append(found, tg)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d targets about %q, want 1: %+v", len(found), frag, r.Targets)
	}
	return found[0]
}

func TestTargets(t *testing.T) {
	r := sample()
	want := map[string]string{
		"≥ 0.97 on every scenario but outage":      Met,
		"no more Redis commands per decision than": Met,
		"≥ 500x fewer":                            Met,
		"≥ 30x fewer":                             Met,
		"at most half of global's":                NotMet,
		"in any 1 s window of a one-key scenario": Met,
	}
	if len(r.Targets) != len(want) {
		t.Errorf("%d targets, want %d: %+v", len(r.Targets), len(want), r.Targets)
	}
	for frag, status := range want {
		if tg := target(t, r, frag); tg.Status != status {
			t.Errorf("%q: %s (%s), want %s", tg.Name, tg.Status, tg.Got, status)
		}
	}
	for _, tg := range r.Targets {
		if tg.Got == "" || tg.Want == "" {
			t.Errorf("%q: got %q, want %q: a check must say both", tg.Name, tg.Got, tg.Want)
		}
	}
	if tg := target(t, r, "≥ 30x fewer"); tg.Name != "hybrid uses ≥ 30x fewer Redis commands per decision than global on skewed, shift, pulse and churn" {
		t.Errorf("name %q", tg.Name)
	}
}

// TestTargetsMissed changes one figure of the sample at a time and checks
// the status of the target about it.
func TestTargetsMissed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Report)
		frag   string
		want   string
	}{
		{"thin accuracy", func(r *Report) { r.Find("thin", Hybrid).Allowed = 4800 }, "≥ 0.97 on every scenario", NotMet},
		{"thin at 0.97", func(r *Report) { r.Find("thin", Hybrid).Allowed = 4850 }, "≥ 0.97 on every scenario", Met},
		{"outage accuracy does not count", func(r *Report) { r.Find("outage", Hybrid).Allowed = 1000 }, "≥ 0.97 on every scenario", Met},
		{"local's accuracy does not count", func(r *Report) { r.Find("skewed", Local).Allowed = 1000 }, "≥ 0.97 on every scenario", Met},
		{"hybrid not run", func(r *Report) {
			for i := range r.Scenarios {
				if r.Scenarios[i].Strategy == Hybrid {
					r.Scenarios[i].Strategy = "other"
				}
			}
		}, "≥ 0.97 on every scenario", NotMeasured},
		{"hybrid above global on thin", func(r *Report) { r.Find("thin", Hybrid).RedisCommands = 10001 }, "no more Redis commands per decision than", NotMet},
		{"hybrid at global on thin", func(r *Report) { r.Find("thin", Hybrid).RedisCommands = 10000 }, "no more Redis commands per decision than", Met},
		{"hotkey 400x fewer", func(r *Report) { r.Find("hotkey", Hybrid).RedisCommands = 25 }, "≥ 500x fewer", NotMet},
		{"balanced 500x fewer", func(r *Report) { r.Find("balanced", Hybrid).RedisCommands = 20 }, "≥ 500x fewer", Met},
		{"balanced not run", func(r *Report) { r.Find("balanced", Hybrid).Decisions = 0 }, "≥ 500x fewer", NotMeasured},
		{"pulse 25x fewer", func(r *Report) { r.Find("pulse", Hybrid).RedisCommands = 400 }, "≥ 30x fewer", NotMet},
		{"pulse 25x fewer, churn not run", func(r *Report) {
			r.Find("pulse", Hybrid).RedisCommands = 400
			r.Find("churn", Global).Strategy = "other"
		}, "≥ 30x fewer", NotMet},
		{"churn not run", func(r *Report) { r.Find("churn", Global).Strategy = "other" }, "≥ 30x fewer", NotMeasured},
		{"keys at half of global's", func(r *Report) { r.Find("keys", Hybrid).RedisCommands = 5000 }, "at most half of global's", Met},
		{"keys not run", func(r *Report) { r.Find("keys", Hybrid).Strategy = "other" }, "at most half of global's", NotMeasured},
		{"balanced over the bound", func(r *Report) { r.Find("balanced", Hybrid).MaxWindow.Admitted = 1101 }, "in any 1 s window", NotMet},
		{"churn over bound and allowance", func(r *Report) { r.Find("churn", Hybrid).MaxWindow.Admitted = 3301 }, "in any 1 s window", NotMet},
		{"churn at bound and allowance", func(r *Report) { r.Find("churn", Hybrid).MaxWindow.Admitted = 3300 }, "in any 1 s window", Met},
		{"redis_rate over the bound does not count", func(r *Report) { r.Find("balanced", RedisRate).MaxWindow.Admitted = 2000 }, "in any 1 s window", Met},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := sample()
			tc.change(r)
			r.Finish()
			r.CheckTargets()
			if tg := target(t, r, tc.frag); tg.Status != tc.want {
				t.Errorf("%q: %s (%s), want %s", tg.Name, tg.Status, tg.Got, tc.want)
			}
		})
	}
}

func TestMembershipAllowance(t *testing.T) {
	w := func() *Window { return &Window{WidthNS: 1e9, Bound: 1100} }
	for _, tc := range []struct {
		name string
		res  Result
		want float64
	}{
		{"no change", Result{Instances: 4, Rate: 1000, Burst: 100, MaxWindow: w()}, 0},
		{"outage is no membership change", Result{Instances: 4, Rate: 1000, Burst: 100, MaxWindow: w(),
			Events: []Event{{Kind: "pause"}, {Kind: "kill"}, {Kind: "restart"}}}, 0},
		// 2 changes x 4 instances x (1000/4 + 100/4).
		{"churn", Result{Instances: 4, Rate: 1000, Burst: 100, MaxWindow: w(),
			Events: []Event{{Kind: "leave", Slot: 3}, {Kind: "join", Slot: 3}}}, 2200},
		// A 2 s window: 1 change x 4 x (1000/4·2 + 100/4).
		{"wider window", Result{Instances: 4, Rate: 1000, Burst: 100, MaxWindow: &Window{WidthNS: 2e9},
			Events: []Event{{Kind: "leave"}}}, 2100},
		{"many keys", Result{Instances: 4, Rate: 1000, Burst: 100, Events: []Event{{Kind: "leave"}}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := membershipAllowance(&tc.res); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("got %g, want %g", got, tc.want)
			}
		})
	}
}

func TestJSONHasNoInfinity(t *testing.T) {
	r := sample()
	r.Scenarios[0].Allowed, r.Scenarios[0].ReferenceAllowed = 3, 0 // accuracy 3/0
	r.Finish()
	var b bytes.Buffer
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if math.IsInf(back.Scenarios[0].Accuracy, 0) {
		t.Error("infinite accuracy in JSON")
	}
}

func TestMarkdownAndHTML(t *testing.T) {
	r := sample()
	var md bytes.Buffer
	if err := r.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	rows := 0
	for _, line := range strings.Split(md.String(), "\n") {
		if strings.HasPrefix(line, "| balanced | ") || strings.HasPrefix(line, "| keys | ") {
			rows++
		}
	}
	if rows != 8+1 {
		t.Errorf("%d rows for balanced and keys, want 8 results and balanced's 1 s window:\n%s", rows, md.String())
	}
	for _, want := range []string{
		"| keys | hybrid | 10 000 |",
		"| scenario | rate·1 s + burst | exact reference | local | global | hybrid | redis_rate |",
		"| balanced | 1 100 | 1 100 | 1 100 | 1 100 | 1 100 | 1 100 |",
		"| outage | 1 100 | 1 100 | 1 100 | 1 100 | 1 100 | 1 430 ✗ |",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks the 1 s window row %q:\n%s", want, md.String())
		}
	}
	if strings.Contains(md.String(), "| keys | 1") {
		t.Error("a 1 s window row for keys, a scenario of many keys")
	}

	var page bytes.Buffer
	if err := r.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	if regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?\s*(https?:)?//`).MatchString(html) {
		t.Error("the page loads something from the network")
	}
	if strings.Contains(html, "<server>") {
		t.Error("text is not escaped")
	}
	if !strings.Contains(html, "<td>1 430 ✗</td>") {
		t.Error("the page lacks the 1 s window table")
	}
	for _, want := range []string{"<td>keys</td><td>hybrid</td>", `background:#1f77b4"></i>hybrid`} {
		if !strings.Contains(html, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if n := strings.Count(html, "<svg"); n != 9+4 {
		t.Errorf("%d charts, want 9 scatters and 4 time series", n)
	}
	if strings.Contains(md.String()+html, "exact bursts") || strings.Contains(md.String()+html, "split bursts") {
		t.Error("the report speaks of burst semantics: there is one")
	}
}

// TestLeastServed: a result's least-served instance is the one that got
// the smallest part of its fair share, among those owed a request or
// more; the markdown has a row per one-key scenario with it, and none for
// results without instances.
func TestLeastServed(t *testing.T) {
	r := sample()
	r.Find("balanced", Hybrid).Slots = []SlotShare{
		{Arrivals: 900, Allowed: 500, Fair: 500}, {Arrivals: 100, Allowed: 20, Fair: 100}, {Arrivals: 0, Allowed: 0, Fair: 0.5},
	}
	r.Find("balanced", Global).Slots = []SlotShare{{Arrivals: 10, Allowed: 10, Fair: 10}}
	slot, part, ok := r.Find("balanced", Hybrid).LeastServed()
	if !ok || slot != 1 || part != 0.2 {
		t.Errorf("LeastServed = %d, %v, %v; want instance 1 at 0.2", slot, part, ok)
	}
	if _, _, ok := r.Find("keys", Hybrid).LeastServed(); ok {
		t.Error("a least-served instance for a result without instances")
	}
	var md bytes.Buffer
	if err := r.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| scenario | global | hybrid |", "| balanced | 1.000 (0: 10 / 10) | 0.200 (1: 20 / 100) |"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
}
