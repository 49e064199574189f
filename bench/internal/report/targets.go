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

// The thresholds of the issue that drives placement version 3 (one burst
// semantics), its "Done when" list.
const (
	// accuracyFloor is invariant 2 of the design: when demand exceeds the
	// limit, at least 97% of what one exact token bucket admits on the
	// same arrivals.
	accuracyFloor = 0.97
	// manyAccuracyFloor is invariant 2 from manyInstances instances up,
	// where a lease's share of a burst is smallest.
	manyAccuracyFloor = 0.95
	manyInstances     = 16
	// oneKeyFactor is how many times fewer commands than global hybrid
	// sends on one busy key of steady demand (balanced, hotkey): its
	// leases are renewed once per lease period, however many decisions
	// they cover.
	oneKeyFactor = 500
	// movingFactor is the same for one key whose demand is uneven or moves
	// between the instances (skewed, shift, pulse, churn): leases follow
	// it, at the cost of more renewals and of exact decisions in between.
	movingFactor = 30
	// keysShare is the most of global's commands hybrid may send on the
	// Zipf keys: a key's first decisions on an instance are exact, one
	// script each, and thin keys stay exact, but it must still save half.
	keysShare = 0.5
)

// Scenario names the targets refer to.
const (
	scBalanced = "balanced"
	scSkewed   = "skewed"
	scHotkey   = "hotkey"
	scKeys     = "keys"
	scOutage   = "outage"
	scChurn    = "churn"
	scPulse    = "pulse"
	scShift    = "shift"
)

// CheckTargets computes the targets of the placement-v3 issue from r's
// results, every scenario at its defaults. A target about named scenarios
// is not met when one of them misses it, and not measured when none does
// but one of them did not run.
func (r *Report) CheckTargets() {
	rs := results(r.Scenarios)
	r.Targets = []Target{
		rs.accuracyTarget("on every scenario but outage"),
		rs.notAboveGlobal("on any scenario"),
		rs.factorTarget([]string{scBalanced, scHotkey}, oneKeyFactor),
		rs.factorTarget([]string{scSkewed, scShift, scPulse, scChurn}, movingFactor),
		rs.keysTarget(),
		rs.windowTarget("of a one-key scenario"),
	}
	if len(r.Saturated) > 0 {
		r.Targets = append(r.Targets, r.saturatedTarget())
	}
}

// results are the results a target is checked on: a report's, or a
// sweep's over every point of its grid.
type results []Result

// find returns the result of scenario with strategy at the same grid point
// as like (none, outside the sweep), or nil.
func (rs results) find(like *Result, scenario, strategy string) *Result {
	for i := range rs {
		r := &rs[i]
		if r.Scenario == scenario && r.Strategy == strategy && r.Point.Label() == like.Point.Label() {
			return r
		}
	}
	return nil
}

// name names res in a target's figures: its scenario, and its grid point
// in the sweep.
func name(res *Result) string {
	if res.Point == nil {
		return res.Scenario
	}
	return res.Scenario + " (" + res.Point.Label() + ")"
}

// listAll is the most figures a target lists one by one; past it, a
// target lists those that miss and the closest of the others.
const listAll = 12

// floor is the accuracy invariant 2 asks of hybrid on res's instances.
func floor(res *Result) float64 {
	if res.Instances >= manyInstances {
		return manyAccuracyFloor
	}
	return accuracyFloor
}

// accuracyTarget checks hybrid's accuracy on every result but outage's
// (Redis away: each instance follows the outage policy), against the floor
// of its instance count. A result whose driver fell behind its schedule
// counts as measured, marked †.
func (rs results) accuracyTarget(where string) Target {
	t := Target{Name: "hybrid accuracy (allowed / reference) ≥ 0.97 " + where, Want: "≥ 0.97"}
	var all, missed []string
	lowest, low := math.Inf(1), ""
	many := false
	for i := range rs {
		res := &rs[i]
		if res.Strategy != Hybrid || res.Scenario == scOutage {
			continue
		}
		f := floor(res)
		many = many || f != accuracyFloor
		fig := fmt.Sprintf("%s %.3f%s", name(res), res.Accuracy, dagger(res))
		if res.Accuracy < f {
			fig += " ✗"
			missed = append(missed, fig)
		}
		all = append(all, fig)
		if m := res.Accuracy - f; m < lowest {
			lowest, low = m, fig
		}
	}
	if many {
		t.Name += fmt.Sprintf(" (≥ %g at %d instances or more)", manyAccuracyFloor, manyInstances)
		t.Want += fmt.Sprintf(", ≥ %g at %d instances or more", manyAccuracyFloor, manyInstances)
	}
	switch {
	case len(all) == 0:
		t.Status = NotMeasured
		return t
	case len(all) <= listAll:
		t.Got = strings.Join(all, ", ")
	case len(missed) > 0:
		t.Got = fmt.Sprintf("%d of %d under: %s", len(missed), len(all), strings.Join(missed, ", "))
	default:
		t.Got = fmt.Sprintf("closest of %d: %s", len(all), low)
	}
	t.Status = status(len(missed) == 0)
	return t
}

// notAboveGlobal checks that hybrid sends no more Redis commands per
// decision than global on any scenario (and grid point) both ran. Per
// decision, because a strategy that falls behind its schedule decides, and
// sends, less.
func (rs results) notAboveGlobal(where string) Target {
	t := Target{
		Name: "hybrid sends no more Redis commands per decision than global " + where,
		Want: "≤ global's everywhere",
	}
	var over []string
	worst, at, any := -1.0, "", false
	for i := range rs {
		h := &rs[i]
		if h.Strategy != Hybrid {
			continue
		}
		g := rs.find(h, h.Scenario, Global)
		if g == nil || h.Decisions == 0 || g.Decisions == 0 {
			continue
		}
		any = true
		x := ratio(h.CommandsPerDecision, g.CommandsPerDecision)
		if h.CommandsPerDecision == 0 {
			x = 0
		}
		if x > worst {
			worst, at = x, name(h)
		}
		if h.CommandsPerDecision > g.CommandsPerDecision {
			// The counts as well as the ratios: near one command per
			// decision, three digits do not show the difference.
			over = append(over, fmt.Sprintf("%s (%s commands over %s decisions, global %s over %s)",
				name(h), human(h.RedisCommands), human(h.Decisions), human(g.RedisCommands), human(g.Decisions)))
		}
	}
	switch {
	case !any:
		t.Status = NotMeasured
	case len(over) > 0:
		t.Status = NotMet
		t.Got = "more on " + strings.Join(over, ", ")
	default:
		t.Status = Met
		t.Got = fmt.Sprintf("most on %s: %s of global's", at, sig(worst))
	}
	return t
}

// factorTarget checks that hybrid sends at least factor times fewer Redis
// commands per decision than global on each of scenarios.
func (rs results) factorTarget(scenarios []string, factor float64) Target {
	t := Target{
		Name: fmt.Sprintf("hybrid uses ≥ %gx fewer Redis commands per decision than global on %s", factor, and(scenarios)),
		Want: fmt.Sprintf("≥ %gx on each", factor),
	}
	var got []string
	var c check
	for _, sc := range scenarios {
		g, h := rs.find(&Result{}, sc, Global), rs.find(&Result{}, sc, Hybrid)
		if g == nil || h == nil || g.Decisions == 0 || h.Decisions == 0 {
			got = append(got, sc+" not run")
			c.missing = true
			continue
		}
		x := ratio(g.CommandsPerDecision, h.CommandsPerDecision)
		c.add(x >= factor)
		got = append(got, fmt.Sprintf("%s %sx (global %s, hybrid %s per 1000 decisions)%s",
			sc, sig(x), sig(1000*g.CommandsPerDecision), sig(1000*h.CommandsPerDecision), cross(x >= factor)))
	}
	t.Got, t.Status = strings.Join(got, "; "), c.status()
	return t
}

// keysTarget checks that hybrid sends at most keysShare of global's
// commands per decision on keys.
func (rs results) keysTarget() Target {
	t := Target{
		Name: "hybrid sends at most half of global's Redis commands per decision on keys",
		Want: fmt.Sprintf("≤ %g of global's", keysShare),
	}
	g, h := rs.find(&Result{}, scKeys, Global), rs.find(&Result{}, scKeys, Hybrid)
	if g == nil || h == nil || g.Decisions == 0 || h.Decisions == 0 {
		t.Status = NotMeasured
		return t
	}
	x := ratio(h.CommandsPerDecision, g.CommandsPerDecision)
	t.Status = status(x <= keysShare)
	t.Got = fmt.Sprintf("%s of global's at accuracy %.3f (global %s, hybrid %s commands per 1000 decisions)",
		sig(x), h.Accuracy, sig(1000*g.CommandsPerDecision), sig(1000*h.CommandsPerDecision))
	return t
}

// windowTarget checks that hybrid admitted no more in any 1 s window of a
// one-key result than rate·1 s + burst plus the membership allowance of
// invariant 1.
func (rs results) windowTarget(where string) Target {
	t := Target{
		Name: "hybrid admits no more than rate·1 s + burst in any 1 s window " + where +
			", plus one lease's worth per instance per membership change (invariant 1)",
		Want: "≤ rate·1 s + burst + allowance",
	}
	var over []string
	worst, at, any := math.Inf(-1), "", false
	for i := range rs {
		res := &rs[i]
		w := res.MaxWindow
		if res.Strategy != Hybrid || w == nil {
			continue
		}
		any = true
		limit := w.Bound + w.Allowance
		if d := float64(w.Admitted) - limit; d > worst {
			worst, at = d, name(res)
		}
		if w.OverAllowance() {
			over = append(over, fmt.Sprintf("%s %s > %s", name(res), human(w.Admitted), count(limit)))
		}
	}
	switch {
	case !any:
		t.Status = NotMeasured
	case len(over) > 0:
		t.Status = NotMet
		t.Got = strings.Join(over, ", ")
	default:
		t.Status = Met
		t.Got = fmt.Sprintf("closest %s: %s under", at, count(-worst))
	}
	return t
}

// and joins names as a sentence does: "a, b and c".
func and(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// dagger marks a result whose driver fell behind its schedule.
func dagger(res *Result) string {
	if res.Behind() {
		return " †"
	}
	return ""
}

// membershipAllowance is what invariant 1 allows a key's cluster above
// rate·width + burst in one window for res's membership changes (every
// leave and join of the run): one lease's worth per instance per change,
// a lease's worth being a fair share, rate/N·width + burst/N with N the
// scenario's instance count (the fair shares of N instances sum to the
// rate and the burst).
// It counts every change of the run, not only those near the window: a
// simple upper bound, documented in the report.
func membershipAllowance(res *Result) float64 {
	if res.MaxWindow == nil || res.Instances == 0 {
		return 0
	}
	changes := 0
	for _, e := range res.Events {
		if e.Kind == "leave" || e.Kind == "join" {
			changes++
		}
	}
	n := float64(res.Instances)
	share := res.Rate/n*float64(res.MaxWindow.WidthNS)/1e9 + float64(res.Burst)/n
	return float64(changes) * n * share
}

// check accumulates the verdicts of a target over named scenarios.
type check struct {
	measured, failed, missing bool
}

func (c *check) add(ok bool) {
	c.measured = true
	c.failed = c.failed || !ok
}

// status is NotMet if any scenario missed, else NotMeasured if one did not
// run, else Met.
func (c check) status() string {
	switch {
	case c.failed:
		return NotMet
	case c.missing || !c.measured:
		return NotMeasured
	}
	return Met
}

// cross marks a figure that misses its target.
func cross(ok bool) string {
	if ok {
		return ""
	}
	return " ✗"
}

// sanity keeps NaN out of JSON: encoding/json cannot write it, nor ±Inf.
func sanity(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return -1
	}
	return f
}
