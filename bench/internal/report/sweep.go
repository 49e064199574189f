package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Point is a point of the sweep's grid (workload.Variant): every scenario
// on Instances instances, its keys' rate and burst multiplied by
// RateFactor and BurstFactor.
type Point struct {
	Instances   int     `json:"instances"`
	RateFactor  float64 `json:"rate_factor"`
	BurstFactor float64 `json:"burst_factor"`
	// Name is how the reports name the point: "n=16 rate×0.37 burst×0.6".
	Name string `json:"name"`
}

// Label returns p's Name, or "" for nil: a result outside the sweep.
func (p *Point) Label() string {
	if p == nil {
		return ""
	}
	return p.Name
}

// Grid is the axes of the sweep: it runs every combination of them.
type Grid struct {
	Instances    []int     `json:"instances"`
	RateFactors  []float64 `json:"rate_factors"`
	BurstFactors []float64 `json:"burst_factors"`
}

// Sweep is everything one sweep of the bench program (-sweep) measured:
// every scenario at every point of a grid of instance counts, rates and
// bursts, with a few strategies. It has no closed loops and no latency
// baselines: it is about accuracy and Redis commands.
type Sweep struct {
	Run
	Grid Grid `json:"grid"`
	// Points are the grid's points, in the order they ran.
	Points []Point `json:"points"`
	// Strategies are the strategies compared, in the order of the tables.
	Strategies []string `json:"strategies"`
	// Results are the runs, each with its Point.
	Results []Result `json:"results"`
	// Extremes are, for every scenario and strategy, the worst accuracy
	// and the most Redis commands per decision over the grid, with the
	// points where they were measured.
	Extremes []Extremes `json:"extremes"`
	Targets  []Target   `json:"targets"`
	Notes    []string   `json:"notes,omitempty"`
}

// Extremes are the worst figures of one scenario and strategy over the
// sweep's grid.
type Extremes struct {
	Scenario string `json:"scenario"`
	Strategy string `json:"strategy"`
	// Points is the number of grid points measured.
	Points int `json:"points"`
	// WorstAccuracy is the lowest accuracy at any point, at WorstAccuracyAt
	// (a Point's Name); WorstAccuracyBehind says that the run there fell
	// behind its schedule.
	WorstAccuracy       float64 `json:"worst_accuracy"`
	WorstAccuracyAt     string  `json:"worst_accuracy_at"`
	WorstAccuracyBehind bool    `json:"worst_accuracy_behind,omitempty"`
	// MostPer1000 is the most Redis commands per 1000 decisions at any
	// point, at MostPer1000At; empty when no point sent any.
	MostPer1000       float64 `json:"most_redis_commands_per_1000"`
	MostPer1000At     string  `json:"most_redis_commands_at,omitempty"`
	MostPer1000Behind bool    `json:"most_redis_commands_behind,omitempty"`
}

// Finish fills the derived fields of every result, the extremes and the
// targets.
func (s *Sweep) Finish() {
	for i := range s.Results {
		s.Results[i].finish(s.Representative)
	}
	s.Extremes = s.Extremes[:0]
	scenarios, _ := s.axes()
	for _, sc := range scenarios {
		for _, st := range s.Strategies {
			if e, ok := s.extremes(sc, st); ok {
				s.Extremes = append(s.Extremes, e)
			}
		}
	}
	s.CheckTargets()
}

// axes returns the scenarios and the points of the results, each once, in
// the order of the results.
func (s *Sweep) axes() (scenarios, points []string) {
	for _, res := range s.Results {
		if !slices.Contains(scenarios, res.Scenario) {
			scenarios = append(scenarios, res.Scenario)
		}
		if p := res.Point.Label(); !slices.Contains(points, p) {
			points = append(points, p)
		}
	}
	return scenarios, points
}

// extremes returns the worst figures of scenario with strategy over the
// grid; ok is false if it decided nothing at any point.
func (s *Sweep) extremes(scenario, strategy string) (e Extremes, ok bool) {
	e = Extremes{Scenario: scenario, Strategy: strategy, WorstAccuracy: math.Inf(1)}
	for i := range s.Results {
		res := &s.Results[i]
		if res.Scenario != scenario || res.Strategy != strategy || res.Decisions == 0 {
			continue
		}
		e.Points++
		if res.Accuracy < e.WorstAccuracy {
			e.WorstAccuracy, e.WorstAccuracyAt, e.WorstAccuracyBehind = res.Accuracy, res.Point.Label(), res.Behind()
		}
		if per := 1000 * res.CommandsPerDecision; per > e.MostPer1000 {
			e.MostPer1000, e.MostPer1000At, e.MostPer1000Behind = per, res.Point.Label(), res.Behind()
		}
	}
	return e, e.Points > 0
}

// CheckTargets computes the targets of the placement-v3 issue that hold at
// every point of the grid: accuracy, no more commands than global, and the
// bound of every 1 s window. The factors by which hybrid saves commands
// are targets of the scenarios' defaults (Report.CheckTargets).
func (s *Sweep) CheckTargets() {
	rs := results(s.Results)
	s.Targets = []Target{
		rs.accuracyTarget("at every grid point of every scenario but outage"),
		rs.notAboveGlobal("at any grid point of any scenario"),
		rs.windowTarget("at any grid point of a one-key scenario"),
	}
}

// WriteJSON writes s as indented JSON.
func (s *Sweep) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// find returns the result of scenario with strategy at point, or nil.
func (s *Sweep) find(scenario, point, strategy string) *Result {
	for i := range s.Results {
		r := &s.Results[i]
		if r.Scenario == scenario && r.Strategy == strategy && r.Point.Label() == point {
			return r
		}
	}
	return nil
}

// any returns a result of scenario at point, whatever its strategy, or nil.
func (s *Sweep) any(scenario, point string) *Result {
	for i := range s.Results {
		if r := &s.Results[i]; r.Scenario == scenario && r.Point.Label() == point {
			return r
		}
	}
	return nil
}

// WriteMarkdown writes the tables of the worst figures over the grid, the
// table of every point, the notes on the runs that fell behind their
// schedule, and the target checks.
func (s *Sweep) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	if !s.Representative {
		b.WriteString("**Not representative: every figure below was measured on an embedded in-process Redis (miniredis), " +
			"with Redis commands counted by the clients.**\n\n")
	}
	scenarios, points := s.axes()
	fmt.Fprintf(&b, "Sweep: %d scenarios at %d grid points (every combination of %s instances, rate %s and burst %s), "+
		"with %s; %s measured per run; wall time %s.\n\n",
		len(scenarios), len(points), and(ints(s.Grid.Instances)), and(factors(s.Grid.RateFactors)), and(factors(s.Grid.BurstFactors)),
		and(s.Strategies), s.measured(), time.Duration(s.WallSeconds*float64(time.Second)).Round(time.Second))

	head := "| scenario | " + strings.Join(s.Strategies, " | ") + " |\n|---|" + strings.Repeat("--:|", len(s.Strategies)) + "\n"
	b.WriteString("Worst accuracy (allowed / reference) of each strategy over the grid, and where:\n\n" + head)
	for _, sc := range scenarios {
		row := []string{sc}
		for _, st := range s.Strategies {
			row = append(row, s.cell(sc, st, func(e Extremes) string {
				return fmt.Sprintf("%.3f%s (%s)", e.WorstAccuracy, mark(e.WorstAccuracyBehind), e.WorstAccuracyAt)
			}))
		}
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	b.WriteString("\nMost Redis commands per 1000 decisions of each strategy over the grid, and where:\n\n" + head)
	for _, sc := range scenarios {
		row := []string{sc}
		for _, st := range s.Strategies {
			row = append(row, s.cell(sc, st, func(e Extremes) string {
				if e.MostPer1000At == "" {
					return "0"
				}
				return fmt.Sprintf("%s%s (%s)", sig(e.MostPer1000), mark(e.MostPer1000Behind), e.MostPer1000At)
			}))
		}
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	b.WriteString("\n")
	s.writePoints(&b, scenarios, points)
	b.WriteString("Targets:\n\n")
	for _, t := range s.Targets {
		got := t.Got
		if got == "" {
			got = "—"
		}
		fmt.Fprintf(&b, "- **%s** — %s: %s (want %s)\n", t.Status, t.Name, got, t.Want)
	}
	if len(s.Notes) > 0 {
		b.WriteString("\n")
		for _, n := range s.Notes {
			b.WriteString("- " + n + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// cell formats the extremes of scenario with strategy, or a dash.
func (s *Sweep) cell(scenario, strategy string, format func(Extremes) string) string {
	for _, e := range s.Extremes {
		if e.Scenario == scenario && e.Strategy == strategy {
			return format(e)
		}
	}
	return "—"
}

// writePoints writes the table of every point, then the notes on the runs
// that fell behind their schedule, which it marks with a dagger.
func (s *Sweep) writePoints(b *strings.Builder, scenarios, points []string) {
	b.WriteString("Every point, accuracy / Redis commands per 1000 decisions:\n\n")
	b.WriteString("| scenario | point | rate | burst | " + strings.Join(s.Strategies, " | ") + " |\n|---|---|--:|--:|" +
		strings.Repeat("--:|", len(s.Strategies)) + "\n")
	var behind []string
	for _, sc := range scenarios {
		for _, p := range points {
			var row []string
			for _, st := range s.Strategies {
				res := s.find(sc, p, st)
				if res == nil {
					row = append(row, "—")
					continue
				}
				per := "—"
				if res.Decisions > 0 {
					per = sig(1000 * res.CommandsPerDecision)
				}
				row = append(row, fmt.Sprintf("%.3f%s / %s", res.Accuracy, dagger(res), per))
				if res.Behind() {
					behind = append(behind, fmt.Sprintf("%s / %s: %s of %s arrivals decided more than %s late, %s never decided; lag p99 %s",
						name(res), res.Strategy, human(res.Late), human(res.Arrivals), ns(res.LateAfterNS), human(res.Unprocessed), ns(res.LagP99)))
				}
			}
			if first := s.any(sc, p); first != nil {
				row = append([]string{sc, p, count(first.Rate), human(int64(first.Burst))}, row...)
				b.WriteString("| " + strings.Join(row, " | ") + " |\n")
			}
		}
	}
	b.WriteString("\n")
	if len(behind) > 0 {
		b.WriteString("† fell behind its open-loop schedule (one driver goroutine per instance decides arrivals in order), " +
			"so some arrivals were decided late or not at all, and count as not admitted:\n\n")
		for _, n := range behind {
			b.WriteString("- " + n + "\n")
		}
		b.WriteString("\n")
	}
}

// measured says how long each run of s was measured, from its first
// result that has no outage (the outage's runs are longer).
func (s *Sweep) measured() string {
	for _, res := range s.Results {
		if res.OutageDecisions == 0 && res.Scenario != scOutage {
			return fmt.Sprintf("%s (after a warm-up of %s)", ns(res.EndNS-res.WarmupNS), ns(res.WarmupNS))
		}
	}
	return "—"
}

// mark is a dagger if behind.
func mark(behind bool) string {
	if behind {
		return " †"
	}
	return ""
}

func ints(xs []int) []string {
	var out []string
	for _, x := range xs {
		out = append(out, fmt.Sprint(x))
	}
	return out
}

func factors(xs []float64) []string {
	var out []string
	for _, x := range xs {
		out = append(out, fmt.Sprintf("×%g", x))
	}
	return out
}
