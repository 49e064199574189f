// Package report holds the bench program's results and writes them as a
// markdown table with the target checks, as JSON, and as one self-contained
// HTML page with inline SVG charts.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"time"
)

// Result is one scenario run with one strategy.
type Result struct {
	Scenario  string `json:"scenario"`
	Strategy  string `json:"strategy"`
	Instances int    `json:"instances"`
	// Decisions, Allowed and ReferenceAllowed count the measured window
	// (after the warm-up). ReferenceAllowed is what one exact token bucket
	// per key admits on the merged arrivals.
	Decisions        int64 `json:"decisions"`
	Allowed          int64 `json:"allowed"`
	ReferenceAllowed int64 `json:"reference_allowed"`
	// RedisCommands is the number of commands the clients sent in the
	// measured window (scripts, connection commands), counted by
	// RedisCountedBy: "server" (the INFO commandstats delta, without the
	// commands that scripts ran, which Redis counts too: those are
	// RedisScriptCalls, and RedisCalls has every command by name) or
	// "client" (a go-redis hook, embedded Redis only).
	// RedisCommandsClient is always the hook's count: a cross-check.
	RedisCommands       int64            `json:"redis_commands"`
	RedisCountedBy      string           `json:"redis_commands_counted_by"`
	RedisScriptCalls    int64            `json:"redis_script_calls"`
	RedisCalls          map[string]int64 `json:"redis_calls_by_command,omitempty"`
	RedisCommandsClient int64            `json:"redis_commands_client"`
	// DecisionsPerSec is from the closed-loop run of the scenario's shape.
	DecisionsPerSec float64 `json:"decisions_per_sec"`
	ClosedLoopShape string  `json:"closed_loop_shape"`
	// Latencies of every decision in the measured window, in nanoseconds,
	// including two clock reads.
	P50  int64 `json:"p50_ns"`
	P99  int64 `json:"p99_ns"`
	P999 int64 `json:"p999_ns"`
	Max  int64 `json:"max_ns"`

	// Accuracy is Allowed / ReferenceAllowed.
	Accuracy float64 `json:"accuracy"`
	// CommandsPerDecision is RedisCommands / Decisions.
	CommandsPerDecision float64 `json:"redis_commands_per_decision"`
	// Arrivals is the number of arrivals scheduled in the measured window;
	// Unprocessed those the strategy never decided because it fell behind
	// its schedule: dropped when more than ShedAfterNS late, or still owed
	// when the run ended. They count as not allowed.
	Arrivals    int64 `json:"arrivals"`
	Unprocessed int64 `json:"unprocessed"`
	ShedAfterNS int64 `json:"shed_after_ns"`
	// Lag is how late decisions started after they were due: its 99th
	// percentile and maximum, and Late, the decisions that started more
	// than LateAfterNS late.
	LagP99      int64 `json:"lag_p99_ns"`
	LagMax      int64 `json:"lag_max_ns"`
	Late        int64 `json:"late"`
	LateAfterNS int64 `json:"late_after_ns"`
	// Errors counts decisions that returned an error (redis_rate: admitted,
	// failing open).
	Errors int64 `json:"errors"`

	// Outage scenario only: decisions from the pause to the restart, and
	// the latency of those decisions and of the others.
	OutageDecisions int64 `json:"outage_decisions,omitempty"`
	OutageAllowed   int64 `json:"outage_allowed,omitempty"`
	OutageReference int64 `json:"outage_reference_allowed,omitempty"`
	OutageP50       int64 `json:"outage_p50_ns,omitempty"`
	OutageP99       int64 `json:"outage_p99_ns,omitempty"`
	UpP99           int64 `json:"up_p99_ns,omitempty"`

	// KeyBands splits the measured window by key popularity (scenarios
	// with many keys): where accuracy is won or lost.
	KeyBands []KeyBand `json:"key_bands,omitempty"`
	// Slots splits the measured window by instance (the schedule each
	// arrival is in), one-key scenarios only: whether the limit is shared
	// as an exact bucket would share it, not only its total.
	Slots []SlotShare `json:"slots,omitempty"`
	// DistinctKeys is the number of keys with arrivals in the measured
	// window.
	DistinctKeys int `json:"distinct_keys"`
	// MaxWindow is the most admitted in any 1 s window (one-key
	// scenarios only; nil otherwise).
	MaxWindow *Window `json:"max_admitted_1s,omitempty"`
	// Point is the point of the sweep's grid the result was measured at;
	// nil outside the sweep, where every scenario has its defaults.
	Point *Point `json:"grid_point,omitempty"`

	// The scenario.
	Rate     float64 `json:"rate_per_key"`
	Burst    int     `json:"burst_per_key"`
	Keys     int     `json:"keys"`
	Demand   float64 `json:"demand_per_sec"`
	WarmupNS int64   `json:"warmup_ns"`
	EndNS    int64   `json:"end_ns"`
	Events   []Event `json:"events,omitempty"`

	// BucketNS wide time series from the start of the run: admissions by
	// the time their decision started, the reference's admissions and the
	// arrivals, by the time they were due.
	BucketNS  int64 `json:"bucket_ns"`
	Series    []int `json:"admitted_series"`
	RefSeries []int `json:"reference_series"`
	Demanded  []int `json:"arrivals_series"`

	// Representative is false when measured on the embedded Redis.
	Representative bool `json:"representative"`
}

// KeyBand is the measured window of the keys of popularity ranks First to
// Last (1 is the most popular: by Zipf rank where keys have one, else by
// arrivals in the measured window).
type KeyBand struct {
	First            int     `json:"first_rank"`
	Last             int     `json:"last_rank"`
	Arrivals         int64   `json:"arrivals"`
	Allowed          int64   `json:"allowed"`
	ReferenceAllowed int64   `json:"reference_allowed"`
	Accuracy         float64 `json:"accuracy"`
}

// SlotShare is the measured window of one instance's arrivals: what the
// strategy admitted of them, and Fair, the instance's fair share of what
// the exact reference admits (workload.Reference.SlotFair: in every
// bucket of the series, the reference's admissions split max-min fair
// over the instances' arrivals).
type SlotShare struct {
	Arrivals int64   `json:"arrivals"`
	Allowed  int64   `json:"allowed"`
	Fair     float64 `json:"fair_share"`
}

// LeastServed returns the instance whose admissions are the smallest part
// of its fair share, and that part; ok is false if no instance is owed
// anything.
func (r *Result) LeastServed() (slot int, part float64, ok bool) {
	for i, s := range r.Slots {
		if s.Fair < 1 {
			continue
		}
		if p := float64(s.Allowed) / s.Fair; !ok || p < part {
			slot, part, ok = i, p, true
		}
	}
	return slot, part, ok
}

// Window is the most a strategy admitted of one key in any window of
// WidthNS, over the whole run (warm-up included), by the time each decision
// started; with the same of the exact reference and the most a limit of the
// scenario's rate and burst may admit in one window.
type Window struct {
	WidthNS int64 `json:"width_ns"`
	// Admitted is the most admissions in one window, FromNS the start of
	// the first such window, from the start of the run.
	Admitted int64 `json:"admitted"`
	FromNS   int64 `json:"from_ns"`
	// Reference is the most the exact reference admits in one window.
	Reference int64 `json:"reference_admitted"`
	// Bound is rate·width + burst.
	Bound float64 `json:"bound"`
	// Allowance is what invariant 1 of the design allows above Bound for
	// the run's membership changes, one lease's worth per instance per
	// change; Finish computes it (see membershipAllowance). Zero when the
	// membership never changes.
	Allowance float64 `json:"membership_allowance"`
}

// Over reports whether w admitted more than its bound, rate·width + burst,
// with no allowance.
func (w Window) Over() bool { return float64(w.Admitted) > w.Bound }

// OverAllowance reports whether w admitted more than its bound plus the
// membership allowance of invariant 1: more than the library promises.
func (w Window) OverAllowance() bool { return float64(w.Admitted) > w.Bound+w.Allowance }

// Event is a scheduled event of the run, for the charts.
type Event struct {
	AtNS int64  `json:"at_ns"`
	Kind string `json:"kind"`
	Slot int    `json:"slot,omitempty"`
}

// ClosedLoop is one closed-loop run: every instance's workers decide back
// to back for Seconds.
type ClosedLoop struct {
	Strategy        string  `json:"strategy"`
	Shape           string  `json:"shape"`
	Instances       int     `json:"instances"`
	Workers         int     `json:"workers_per_instance"`
	Decisions       int64   `json:"decisions"`
	Seconds         float64 `json:"seconds"`
	DecisionsPerSec float64 `json:"decisions_per_sec"`
	Errors          int64   `json:"errors"`
}

// Run is what a run of the bench program ran on and with, as its reports
// (Report, Sweep) give it.
type Run struct {
	Redis          string    `json:"redis"`
	RedisKind      string    `json:"redis_kind"`
	Representative bool      `json:"representative"`
	Quick          bool      `json:"quick"`
	Scale          float64   `json:"scale"`
	Arrivals       string    `json:"arrivals"`
	Seed           uint64    `json:"seed"`
	GoVersion      string    `json:"go_version"`
	Platform       string    `json:"platform"`
	CPUs           int       `json:"cpus"`
	Started        time.Time `json:"started"`
	WallSeconds    float64   `json:"wall_seconds"`
	// ClockNS is the median cost of the two clock reads around every
	// timed decision, included in its latency.
	ClockNS int64 `json:"clock_overhead_ns"`
	// Hybrid is the timing of the hybrid strategy's Limiters.
	Hybrid HybridConfig `json:"hybrid_config"`
}

// Report is everything one run of the bench program measured.
type Report struct {
	Run
	Scenarios []Result `json:"scenarios"`
	// Baselines are runs of a bare x/time/rate limiter per key under the
	// same driver: what the machine and the driver cost a decision.
	Baselines  []Result     `json:"latency_baselines,omitempty"`
	ClosedLoop []ClosedLoop `json:"closed_loop"`
	// Saturated are the closed-loop accuracy runs (saturating callers).
	Saturated []Saturated `json:"saturated,omitempty"`
	Targets   []Target    `json:"targets"`
	Notes     []string    `json:"notes,omitempty"`
}

// HybridConfig is the timing of hybrid.Config the run used.
type HybridConfig struct {
	Tick           string `json:"tick"`
	ContendedTTL   string `json:"contended_ttl"`
	UncontendedTTL string `json:"uncontended_ttl"`
	RedisTimeout   string `json:"redis_timeout"`
	IdleAfter      string `json:"idle_after"`
}

// WriteJSON writes r as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Find returns the result of scenario with strategy, or nil.
func (r *Report) Find(scenario, strategy string) *Result {
	for i := range r.Scenarios {
		if r.Scenarios[i].Scenario == scenario && r.Scenarios[i].Strategy == strategy {
			return &r.Scenarios[i]
		}
	}
	return nil
}

// Strategy names.
const (
	Local  = "local"
	Global = "global"
	// Hybrid is a limit in Hybrid mode (placement version 3: a key's
	// first decisions on an instance are exact, busy keys are leased).
	Hybrid    = "hybrid"
	RedisRate = "redis_rate"
)

// Finish fills the derived fields of every result: accuracy, commands per
// decision, and the membership allowance of every 1 s window.
func (r *Report) Finish() {
	for i := range r.Baselines {
		res := &r.Baselines[i]
		res.Accuracy = sanity(ratio(float64(res.Allowed), float64(res.ReferenceAllowed)))
		res.Representative = r.Representative
	}
	for i := range r.Scenarios {
		r.Scenarios[i].finish(r.Representative)
	}
	r.finishSaturated()
}

// finish fills res's derived fields: accuracy, commands per decision and
// the membership allowance of its 1 s window.
func (res *Result) finish(representative bool) {
	res.Accuracy = sanity(ratio(float64(res.Allowed), float64(res.ReferenceAllowed)))
	res.CommandsPerDecision = sanity(ratio(float64(res.RedisCommands), float64(res.Decisions)))
	res.Representative = representative
	if res.MaxWindow != nil {
		res.MaxWindow.Allowance = membershipAllowance(res)
	}
}

// Behind reports whether res fell behind its open-loop schedule: some
// arrivals never decided, or more than one in a hundred decided late.
// Reports mark such a result with a dagger.
func (res *Result) Behind() bool { return res.Unprocessed > 0 || res.Late > res.Decisions/100 }

func ratio(a, b float64) float64 {
	if b == 0 {
		if a == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return a / b
}

// human formats a count with thin groups of three digits.
func human(n int64) string {
	s := fmt.Sprint(n)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ' ')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// count formats a number of tokens: a whole one as human does, else with
// one decimal.
func count(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return human(int64(f))
	}
	return fmt.Sprintf("%.1f", f)
}

// rate formats decisions per second.
func rate(f float64) string {
	switch {
	case f >= 1e6:
		return fmt.Sprintf("%.2fM", f/1e6)
	case f >= 1e4:
		return fmt.Sprintf("%.0fk", f/1e3)
	case f >= 1e3:
		return fmt.Sprintf("%.1fk", f/1e3)
	}
	return fmt.Sprintf("%.0f", f)
}

// ns formats a latency.
func ns(n int64) string {
	d := float64(n)
	switch {
	case n < 1000:
		return fmt.Sprintf("%d ns", n)
	case n < 1_000_000:
		return fmt.Sprintf("%.3g µs", d/1e3)
	case n < 1_000_000_000:
		return fmt.Sprintf("%.3g ms", d/1e6)
	}
	return fmt.Sprintf("%.3g s", d/1e9)
}

// sig formats a non-negative ratio with three significant digits.
func sig(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "∞"
	case f == 0:
		return "0"
	case f >= 99.95:
		return human(int64(math.Round(f)))
	}
	return fmt.Sprintf("%.3g", f)
}
