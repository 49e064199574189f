package report

import (
	"bytes"
	"encoding/json"
	"math"
	"regexp"
	"strings"
	"testing"
)

// sample is a report with the shape of a real one.
func sample() *Report {
	r := &Report{Redis: "test <server>", Representative: true, CPUs: 2}
	for _, sc := range []string{"balanced", "keys", "hotkey", "outage", "churn"} {
		for _, st := range []string{Local, Global, Hybrid, RedisRate} {
			res := Result{Scenario: sc, Strategy: st, Instances: 4, Decisions: 10000, Allowed: 5000, ReferenceAllowed: 5000,
				P50: 200, P99: 800, BucketNS: 1e8, EndNS: 1e9, WarmupNS: 2e8,
				Series: []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, RefSeries: []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}
			switch st {
			case Global, RedisRate:
				res.RedisCommands = 10000
			case Hybrid:
				res.RedisCommands = 5
			}
			if sc != "keys" {
				res.MaxWindow = &Window{WidthNS: 1e9, Admitted: 1100, Reference: 1100, Bound: 1100}
			}
			if sc == "outage" {
				res.Events = []Event{{AtNS: 4e8, Kind: "pause"}, {AtNS: 5e8, Kind: "kill"}, {AtNS: 7e8, Kind: "restart"}}
				res.OutageDecisions, res.OutageP99, res.UpP99 = 100, 900, 700
			}
			r.Scenarios = append(r.Scenarios, res)
		}
	}
	r.Find("keys", Hybrid).RedisCommands = 500            // 20x: not met
	r.Find("outage", RedisRate).MaxWindow.Admitted = 1430 // failing open
	r.ClosedLoop = []ClosedLoop{
		{Strategy: Global, Shape: "one key", DecisionsPerSec: 20000},
		{Strategy: Hybrid, Shape: "one key", DecisionsPerSec: 5e6},
	}
	r.Finish()
	r.CheckTargets()
	return r
}

func TestTargets(t *testing.T) {
	r := sample()
	want := map[string]string{
		"balanced": Met, "hotkey": Met, "on keys": NotMet, "accuracy": Met,
		"decisions per second": Met, "with Redis up": Met, "outage window": Met,
	}
	for frag, status := range want {
		found := false
		for _, tg := range r.Targets {
			if strings.Contains(tg.Name, frag) {
				found = true
				if tg.Status != status {
					t.Errorf("%q: %s (%s), want %s", tg.Name, tg.Status, tg.Got, status)
				}
			}
		}
		if !found {
			t.Errorf("no target about %q", frag)
		}
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
	if n := strings.Count(html, "<svg"); n != 5+2 {
		t.Errorf("%d charts, want 5 scatters and 2 time series", n)
	}
}
