package report

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// sweepSample is a sweep of two scenarios at two points with hybrid,
// global and local: hybrid's accuracy on skewed is 0.96 at both, which
// misses 0.97 at 6 instances and meets 0.95 at 16; global fell behind on
// balanced at 16 instances.
func sweepSample() *Sweep {
	s := &Sweep{Run: Run{Representative: true}, Strategies: []string{Hybrid, Global, Local},
		Grid: Grid{Instances: []int{6, 16}, RateFactors: []float64{2.1}, BurstFactors: []float64{0.6}}}
	for _, n := range s.Grid.Instances {
		p := Point{Instances: n, RateFactor: 2.1, BurstFactor: 0.6, Name: "n=" + map[int]string{6: "6", 16: "16"}[n] + " rate×2.1 burst×0.6"}
		s.Points = append(s.Points, p)
		for _, sc := range []string{"balanced", "skewed"} {
			for _, st := range s.Strategies {
				res := Result{Scenario: sc, Strategy: st, Instances: n, Decisions: 10000, Allowed: 5000, ReferenceAllowed: 5000,
					Rate: 2100, Burst: 60, WarmupNS: 4e8, EndNS: 12e8, Point: &p,
					MaxWindow: &Window{WidthNS: 1e9, Admitted: 2000, Reference: 2100, Bound: 2160}}
				switch st {
				case Global:
					res.RedisCommands = 10000
				case Hybrid:
					res.RedisCommands = 10 * int64(n)
				}
				if sc == "skewed" && st == Hybrid {
					res.Allowed = 4800
				}
				if sc == "balanced" && st == Global && n == 16 {
					res.Allowed, res.Unprocessed = 4000, 1000
				}
				s.Results = append(s.Results, res)
			}
		}
	}
	s.Finish()
	return s
}

func TestSweep(t *testing.T) {
	s := sweepSample()
	if len(s.Extremes) != 2*3 {
		t.Fatalf("%d extremes, want one per scenario and strategy: %+v", len(s.Extremes), s.Extremes)
	}
	for _, e := range s.Extremes {
		if e.Scenario == "balanced" && e.Strategy == Global {
			if e.WorstAccuracy != 0.8 || e.WorstAccuracyAt != "n=16 rate×2.1 burst×0.6" || !e.WorstAccuracyBehind {
				t.Errorf("balanced / global: %+v", e)
			}
		}
		if e.Scenario == "skewed" && e.Strategy == Hybrid && (e.MostPer1000 != 16 || e.MostPer1000At != "n=16 rate×2.1 burst×0.6") {
			t.Errorf("skewed / hybrid: %+v", e)
		}
	}
	want := map[string]string{"accuracy": NotMet, "no more Redis commands": Met, "1 s window": Met}
	for _, tg := range s.Targets {
		for frag, status := range want {
			if strings.Contains(tg.Name, frag) && tg.Status != status {
				t.Errorf("%q: %s (%s), want %s", tg.Name, tg.Status, tg.Got, status)
			}
		}
	}
	acc := s.Targets[0]
	if !strings.Contains(acc.Got, "skewed (n=6 rate×2.1 burst×0.6) 0.960 ✗") || strings.Contains(acc.Got, "n=16 rate×2.1 burst×0.6) 0.960 ✗") {
		t.Errorf("accuracy target got %q: 0.96 misses at 6 instances only", acc.Got)
	}
	if !strings.Contains(acc.Want, "≥ 0.95 at 16 instances") {
		t.Errorf("accuracy target wants %q", acc.Want)
	}

	var md bytes.Buffer
	if err := s.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Sweep: 2 scenarios at 2 grid points (every combination of 6 and 16 instances, rate ×2.1 and burst ×0.6), with hybrid, global and local",
		"| scenario | hybrid | global | local |",
		"| balanced | 1.000 (n=6 rate×2.1 burst×0.6) | 0.800 † (n=16 rate×2.1 burst×0.6) | 1.000 (n=6 rate×2.1 burst×0.6) |",
		"| skewed | 16 (n=16 rate×2.1 burst×0.6) | 1 000 (n=6 rate×2.1 burst×0.6) | 0 |",
		"| balanced | n=16 rate×2.1 burst×0.6 | 2 100 | 60 | 1.000 / 16 | 0.800 † / 1 000 | 1.000 / 0 |",
		"- balanced (n=16 rate×2.1 burst×0.6) / global: ",
		"- **not met** — hybrid accuracy",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}

	var js bytes.Buffer
	if err := s.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Results []struct {
			Scenario string `json:"scenario"`
			Point    *Point `json:"grid_point"`
		} `json:"results"`
		Extremes []Extremes `json:"extremes"`
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Results) != 12 || back.Results[0].Point == nil || back.Results[0].Point.Instances != 6 || len(back.Extremes) != 6 {
		t.Errorf("JSON: %s", js.String())
	}
}
