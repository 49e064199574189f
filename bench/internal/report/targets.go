package report

import (
	"fmt"
	"math"
	"strings"
)

// Target is one of the targets, checked on the figures of one run.
type Target struct {
	Name string `json:"name"`
	// Status is "met", "not met" or "not measured".
	Status string `json:"status"`
	// Got says what was measured, Want what the target is.
	Got  string `json:"got"`
	Want string `json:"want"`
}

// Statuses of a Target.
const (
	Met         = "met"
	NotMet      = "not met"
	NotMeasured = "not measured"
)

func status(ok bool) string {
	if ok {
		return Met
	}
	return NotMet
}

// CheckTargets computes the targets from r's results and closed-loop runs.
func (r *Report) CheckTargets() {
	r.Targets = r.Targets[:0]
	r.Targets = append(r.Targets, r.commandTargets()...)
	r.Targets = append(r.Targets, r.accuracyTarget())
	r.Targets = append(r.Targets, r.throughputTargets()...)
	r.Targets = append(r.Targets, r.latencyUpTarget(), r.latencyDownTarget())
}

// commandTargets checks how many times fewer Redis commands per decision
// hybrid sends than global on the scenarios the targets name.
func (r *Report) commandTargets() []Target {
	var out []Target
	for _, c := range []struct {
		scenario string
		factor   float64
	}{{"balanced", 1000}, {"hotkey", 1000}, {"keys", 50}} {
		t := Target{
			Name: fmt.Sprintf("hybrid uses ≥%gx fewer Redis commands per decision than global on %s", c.factor, c.scenario),
			Want: fmt.Sprintf("≥ %gx", c.factor),
		}
		g, h := r.Find(c.scenario, Global), r.Find(c.scenario, Hybrid)
		if g == nil || h == nil || g.Decisions == 0 || h.Decisions == 0 {
			t.Status = NotMeasured
		} else {
			x := ratio(g.CommandsPerDecision, h.CommandsPerDecision)
			t.Status = status(x >= c.factor)
			t.Got = fmt.Sprintf("%sx (global %s, hybrid %s commands per 1000 decisions)",
				sig(x), sig(1000*g.CommandsPerDecision), sig(1000*h.CommandsPerDecision))
		}
		out = append(out, t)
	}
	return out
}

// accuracyTarget checks hybrid's accuracy on every scenario but outage.
func (r *Report) accuracyTarget() Target {
	acc := Target{Name: "hybrid accuracy (allowed / reference) within [0.95, 1.05] on every scenario but outage", Want: "0.95 – 1.05"}
	var got []string
	ok, any := true, false
	for _, res := range r.Scenarios {
		if res.Strategy != Hybrid || res.Scenario == "outage" {
			continue
		}
		any = true
		in := res.Accuracy >= 0.95 && res.Accuracy <= 1.05
		ok = ok && in
		mark := ""
		if !in {
			mark = " ✗"
		}
		got = append(got, fmt.Sprintf("%s %.3f%s", res.Scenario, res.Accuracy, mark))
	}
	acc.Got = strings.Join(got, ", ")
	acc.Status = status(ok)
	if !any {
		acc.Status = NotMeasured
	}
	return acc
}

// throughputTargets checks hybrid's closed-loop decisions per second
// against global's, on every shape that ran.
func (r *Report) throughputTargets() []Target {
	shapes := map[string]bool{}
	for _, c := range r.ClosedLoop {
		shapes[c.Shape] = true
	}
	var out []Target
	for _, shape := range []string{"one key", "keys"} {
		if !shapes[shape] {
			continue
		}
		t := Target{Name: fmt.Sprintf("hybrid decisions per second ≥50x global's (closed loop, %s)", shape), Want: "≥ 50x"}
		g, h := r.closed(Global, shape), r.closed(Hybrid, shape)
		if g == nil || h == nil || g.DecisionsPerSec == 0 {
			t.Status = NotMeasured
		} else {
			x := h.DecisionsPerSec / g.DecisionsPerSec
			t.Status = status(x >= 50)
			t.Got = fmt.Sprintf("%sx (hybrid %s/s, global %s/s)", sig(x), rate(h.DecisionsPerSec), rate(g.DecisionsPerSec))
		}
		out = append(out, t)
	}
	return out
}

// latencyUpTarget checks hybrid's worst p99 latency while Redis is up,
// which on the outage scenario excludes the outage window.
func (r *Report) latencyUpTarget() Target {
	up := Target{Name: "hybrid p99 decision latency < 1 µs with Redis up", Want: "< 1 µs"}
	var worst int64 = -1
	var where string
	for _, res := range r.Scenarios {
		if res.Strategy != Hybrid {
			continue
		}
		p := res.P99
		if res.Scenario == "outage" {
			p = res.UpP99
		}
		if p > worst {
			worst, where = p, res.Scenario
		}
	}
	if worst < 0 {
		up.Status = NotMeasured
	} else {
		up.Status = status(worst < 1000)
		up.Got = fmt.Sprintf("worst %s (%s)", ns(worst), where)
	}
	return up
}

// latencyDownTarget checks hybrid's p99 latency in the outage window.
func (r *Report) latencyDownTarget() Target {
	down := Target{Name: "hybrid p99 decision latency < 1 µs during the outage window", Want: "< 1 µs"}
	if h := r.Find("outage", Hybrid); h == nil || h.OutageDecisions == 0 {
		down.Status = NotMeasured
	} else {
		down.Status = status(h.OutageP99 < 1000)
		down.Got = fmt.Sprintf("%s over %s decisions", ns(h.OutageP99), human(h.OutageDecisions))
	}
	return down
}

func (r *Report) closed(strategy, shape string) *ClosedLoop {
	for i := range r.ClosedLoop {
		if r.ClosedLoop[i].Strategy == strategy && r.ClosedLoop[i].Shape == shape {
			return &r.ClosedLoop[i]
		}
	}
	return nil
}

// sanity keeps NaN out of JSON: encoding/json cannot write it, nor ±Inf.
func sanity(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return -1
	}
	return f
}
