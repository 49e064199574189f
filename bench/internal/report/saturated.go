package report

import (
	"fmt"
	"slices"
	"strings"
)

// Saturated is one closed-loop accuracy run: every instance's workers
// decide back to back on one key, with no pacing, from the instances' start
// for Seconds. The exact reference is what one token bucket admits over the
// run when asked for more than it holds at every instant, burst + rate ×
// Seconds.
type Saturated struct {
	Strategy        string  `json:"strategy"`
	Instances       int     `json:"instances"`
	Workers         int     `json:"workers_per_instance"`
	Rate            float64 `json:"rate"`
	Burst           int     `json:"burst"`
	Seconds         float64 `json:"seconds"`
	Decisions       int64   `json:"decisions"`
	Allowed         int64   `json:"allowed"`
	Reference       float64 `json:"reference_allowed"`
	Accuracy        float64 `json:"accuracy"`
	DecisionsPerSec float64 `json:"decisions_per_sec"`
	Errors          int64   `json:"errors"`
	RedisCommands   int64   `json:"redis_commands"`
}

// BlindSplit is the strategy the saturated rows hold hybrid's decisions per
// second against: x/time/rate limiters at rate/N and burst/N per instance,
// no library (the latency baseline's).
const BlindSplit = "bare x/time/rate"

// Targets of the saturated rows: hybrid's accuracy at every concurrency,
// and its decisions per second within saturatedSlowdown of the blind
// split's at the same concurrency.
const (
	saturatedFloor    = 0.97
	saturatedSlowdown = 1.5
)

// finishSaturated fills the derived fields of r's saturated rows.
func (r *Report) finishSaturated() {
	for i := range r.Saturated {
		s := &r.Saturated[i]
		s.Accuracy = sanity(ratio(float64(s.Allowed), s.Reference))
		s.DecisionsPerSec = sanity(ratio(float64(s.Decisions), s.Seconds))
	}
}

// writeSaturated writes the saturated rows' table, if any ran.
func (r *Report) writeSaturated(b *strings.Builder) {
	if len(r.Saturated) == 0 {
		return
	}
	s0 := r.Saturated[0]
	fmt.Fprintf(b, "Saturating callers (closed loop): %d instances, each with W goroutines calling Allow back to back on one key "+
		"(limit %s/s, burst %d) for %.3g s from the instances' start; the reference is burst + rate × elapsed:\n\n",
		s0.Instances, count(s0.Rate), s0.Burst, s0.Seconds)
	b.WriteString("| strategy | W | decisions | allowed / reference | decisions/s | Redis commands |\n|---|--:|--:|--:|--:|--:|\n")
	for _, s := range r.Saturated {
		fmt.Fprintf(b, "| %s | %d | %s | %.3f (%s / %s) | %s | %s |\n", s.Strategy, s.Workers, human(s.Decisions),
			s.Accuracy, human(s.Allowed), count(float64(int64(s.Reference))), rate(s.DecisionsPerSec), human(s.RedisCommands))
	}
	b.WriteString("\n")
}

// saturatedTarget checks hybrid's saturated rows: accuracy at least
// saturatedFloor, and decisions per second at least the blind split's at
// the same concurrency divided by saturatedSlowdown.
func (r *Report) saturatedTarget() Target {
	t := Target{Name: "hybrid accuracy ≥ 0.97 with callers saturating the CPU, at decisions/s within 1.5x of the blind split's",
		Want: fmt.Sprintf("≥ %.2f, ≥ blind/%.1f", saturatedFloor, saturatedSlowdown)}
	var c check
	var got []string
	for _, s := range r.Saturated {
		if s.Strategy != Hybrid {
			continue
		}
		i := slices.IndexFunc(r.Saturated, func(o Saturated) bool { return o.Strategy == BlindSplit && o.Workers == s.Workers })
		if i < 0 {
			c.missing = true
			continue
		}
		blind := r.Saturated[i].DecisionsPerSec
		accOK, speedOK := s.Accuracy >= saturatedFloor, s.DecisionsPerSec*saturatedSlowdown >= blind
		c.add(accOK && speedOK)
		got = append(got, fmt.Sprintf("W=%d %.3f%s at %s/s (blind %s/s)%s", s.Workers, s.Accuracy, cross(accOK),
			rate(s.DecisionsPerSec), rate(blind), cross(speedOK)))
	}
	t.Status, t.Got = c.status(), strings.Join(got, "; ")
	return t
}
