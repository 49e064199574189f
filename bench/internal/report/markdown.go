package report

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// WriteMarkdown writes the results table, the notes on strategies that fell
// behind their schedule, and the target checks.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	r.writeResults(&b)
	r.writeOutage(&b)
	r.writeMaxWindows(&b)
	r.writeLeastServed(&b)
	r.writeKeyBands(&b)
	r.writeBaselines(&b)
	r.writeSaturated(&b)
	fmt.Fprintf(&b, "Hybrid timing: tick %s, contended TTL %s, uncontended TTL %s, Redis timeout %s, idle after %s.\n\n",
		r.Hybrid.Tick, r.Hybrid.ContendedTTL, r.Hybrid.UncontendedTTL, r.Hybrid.RedisTimeout, r.Hybrid.IdleAfter)
	r.writeTargets(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeResults writes the results table, then the notes on the rows that
// fell behind their schedule, which the table marks with a dagger.
func (r *Report) writeResults(b *strings.Builder) {
	if !r.Representative {
		b.WriteString("**Not representative: every figure below was measured on an embedded in-process Redis (miniredis), " +
			"with Redis commands counted by the clients.**\n\n")
	}
	if len(r.Scenarios) == 0 {
		return // only the saturated rows ran
	}
	note := ""
	if !r.Representative {
		note = " | note"
	}
	fmt.Fprintf(b, "| scenario | strategy | decisions | allowed / reference | Redis commands | per 1000 decisions | decisions/s (closed loop) | p50 | p99%s |\n", note)
	sep := "|---|---|--:|--:|--:|--:|--:|--:|--:|"
	if !r.Representative {
		sep += "---|"
	}
	b.WriteString(sep + "\n")
	var behind []string
	for _, res := range r.Scenarios {
		row, late := resultRow(res)
		if late != "" {
			behind = append(behind, late)
		}
		if !r.Representative {
			row += " not representative |"
		}
		b.WriteString(row + "\n")
	}
	b.WriteString("\n")
	if len(behind) > 0 {
		b.WriteString("† fell behind its open-loop schedule (one driver goroutine per instance decides arrivals in order; " +
			"decisions took longer than the gaps between arrivals), so some arrivals were decided late or not at all:\n\n")
		for _, s := range behind {
			b.WriteString("- " + s + "\n")
		}
		b.WriteString("\n")
	}
}

// resultRow returns res's row of the results table and, if res fell
// behind its schedule, the note that says by how much.
func resultRow(res Result) (row, behind string) {
	dec := human(res.Decisions)
	if res.Behind() {
		dec += " †"
		behind = fmt.Sprintf("%s / %s: %s of %s arrivals decided more than %s late, %s never decided "+
			"(dropped when over %s late, or still owed at the end); lag p99 %s, max %s",
			res.Scenario, res.Strategy, human(res.Late), human(res.Arrivals), ns(res.LateAfterNS), human(res.Unprocessed),
			ns(res.ShedAfterNS), ns(res.LagP99), ns(res.LagMax))
	}
	cmds := human(res.RedisCommands)
	if res.RedisCountedBy == "client" {
		cmds += " (client-counted)"
	}
	per1000 := "—"
	if res.Decisions > 0 {
		per1000 = sig(1000 * res.CommandsPerDecision)
	}
	row = fmt.Sprintf("| %s | %s | %s | %.3f (%s / %s) | %s | %s | %s | %s | %s |",
		res.Scenario, res.Strategy, dec, res.Accuracy, human(res.Allowed), human(res.ReferenceAllowed),
		cmds, per1000, rate(res.DecisionsPerSec), ns(res.P50), ns(res.P99))
	return row, behind
}

// writeOutage writes the outage window's table, if hybrid ran the outage
// scenario.
func (r *Report) writeOutage(b *strings.Builder) {
	if r.Find("outage", Hybrid) == nil {
		return
	}
	b.WriteString("Outage window (Redis paused, then killed, until it is back):\n\n")
	b.WriteString("| strategy | decisions | allowed / reference | p50 | p99 |\n|---|--:|--:|--:|--:|\n")
	for _, res := range r.Scenarios {
		if res.Scenario != "outage" {
			continue
		}
		fmt.Fprintf(b, "| %s | %s | %.3f (%s / %s) | %s | %s |\n", res.Strategy, human(res.OutageDecisions),
			ratio(float64(res.OutageAllowed), float64(res.OutageReference)), human(res.OutageAllowed), human(res.OutageReference),
			ns(res.OutageP50), ns(res.OutageP99))
	}
	b.WriteString("\n")
}

// writeMaxWindows writes, for every one-key scenario, the most each
// strategy admitted in any 1 s window against the limit's bound over one.
func (r *Report) writeMaxWindows(b *strings.Builder) {
	head, rows := r.maxWindows()
	if len(rows) == 0 {
		return
	}
	b.WriteString("Most admitted in any 1 s window of the run (one-key scenarios), by the time each decision started, " +
		"against the most the limit allows in one, rate·1 s + burst; ✗ marks more than that. " +
		"Invariant 1 allows one lease's worth (a fair share, rate/N·1 s + burst/N) more per instance per membership change: " +
		"the targets add it on churn, whose instance leaves and rejoins.\n\n")
	b.WriteString("| " + strings.Join(head, " | ") + " |\n|---|" + strings.Repeat("--:|", len(head)-1) + "\n")
	for _, row := range rows {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	b.WriteString("\n")
}

// maxWindows returns the head and the rows of the table of the most
// admitted in any 1 s window: a row per one-key scenario, a column per
// strategy, in the order of the results.
func (r *Report) maxWindows() (head []string, rows [][]string) {
	scenarios, strategies := r.axes(func(res *Result) bool { return res.MaxWindow != nil })
	if len(scenarios) == 0 {
		return nil, nil
	}
	head = append([]string{"scenario", "rate·1 s + burst", "exact reference"}, strategies...)
	for _, sc := range scenarios {
		var row []string
		for _, res := range r.Scenarios {
			if res.Scenario == sc && res.MaxWindow != nil {
				row = []string{sc, count(res.MaxWindow.Bound), human(res.MaxWindow.Reference)}
				break
			}
		}
		for _, st := range strategies {
			res := r.Find(sc, st)
			if res == nil || res.MaxWindow == nil {
				row = append(row, "—")
				continue
			}
			w := res.MaxWindow
			cell := human(w.Admitted)
			if w.Over() {
				cell += " ✗"
			}
			row = append(row, cell)
		}
		rows = append(rows, row)
	}
	return head, rows
}

// axes returns the scenarios and the strategies of the results that has
// holds of, each once, in the order of the results: the rows and columns
// of a table with a cell per scenario and strategy.
func (r *Report) axes(has func(*Result) bool) (scenarios, strategies []string) {
	for i := range r.Scenarios {
		res := &r.Scenarios[i]
		if !has(res) {
			continue
		}
		if !slices.Contains(scenarios, res.Scenario) {
			scenarios = append(scenarios, res.Scenario)
		}
		if !slices.Contains(strategies, res.Strategy) {
			strategies = append(strategies, res.Strategy)
		}
	}
	return scenarios, strategies
}

// writeLeastServed writes, for every one-key scenario, each strategy's
// least-served instance: its admissions against its fair share of what
// the exact reference admits (Result.LeastServed).
func (r *Report) writeLeastServed(b *strings.Builder) {
	scenarios, strategies := r.axes(func(res *Result) bool {
		_, _, ok := res.LeastServed()
		return ok
	})
	if len(scenarios) == 0 {
		return
	}
	b.WriteString("Least-served instance of each one-key scenario, in the measured window: what it admitted against its fair " +
		"share of what the exact reference admits (every 100 ms, the reference's admissions split max-min fair over the " +
		"instances' arrivals; instances numbered from 0). A total near 1.000 can hide an instance that got nothing. " +
		"An exact bucket, as `global` runs it, serves requests in the order they come, not max-min fair: a light " +
		"instance beside a heavy one gets less than its fair share there too.\n\n")
	b.WriteString("| scenario | " + strings.Join(strategies, " | ") + " |\n|---|" + strings.Repeat("--:|", len(strategies)) + "\n")
	for _, sc := range scenarios {
		row := []string{sc}
		for _, st := range strategies {
			res := r.Find(sc, st)
			slot, part, ok := 0, 0.0, false
			if res != nil {
				slot, part, ok = res.LeastServed()
			}
			if !ok {
				row = append(row, "—")
				continue
			}
			s := res.Slots[slot]
			row = append(row, fmt.Sprintf("%.3f (%d: %s / %s)", part, slot, human(s.Allowed), count(s.Fair)))
		}
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	b.WriteString("\n")
}

// writeKeyBands writes a table of accuracy by key popularity for every
// scenario with key bands, the baselines' rows included.
func (r *Report) writeKeyBands(b *strings.Builder) {
	done := map[string]bool{}
	for _, first := range r.Scenarios {
		if len(first.KeyBands) == 0 || done[first.Scenario] {
			continue
		}
		done[first.Scenario] = true
		fmt.Fprintf(b, "Accuracy by key popularity on %s (%s keys had arrivals in the measured window):\n\n",
			first.Scenario, human(int64(first.DistinctKeys)))
		b.WriteString("| strategy | popularity ranks | arrivals | allowed / reference |\n|---|---|--:|--:|\n")
		for _, res := range append(append([]Result(nil), r.Scenarios...), r.Baselines...) {
			if res.Scenario != first.Scenario {
				continue
			}
			for _, kb := range res.KeyBands {
				fmt.Fprintf(b, "| %s | %d–%d | %s | %.3f (%s / %s) |\n", res.Strategy, kb.First, kb.Last, human(kb.Arrivals),
					kb.Accuracy, human(kb.Allowed), human(kb.ReferenceAllowed))
			}
		}
		b.WriteString("\n")
	}
}

// writeBaselines writes the latency baselines' table, if any ran.
func (r *Report) writeBaselines(b *strings.Builder) {
	if len(r.Baselines) == 0 {
		return
	}
	b.WriteString("Latency baseline: no library, a map of bare `x/time/rate` limiters under a mutex per instance (rate/N each), " +
		"driven exactly like the strategies above:\n\n")
	b.WriteString("| scenario | decisions | allowed / reference | p50 | p99 |\n|---|--:|--:|--:|--:|\n")
	for _, res := range r.Baselines {
		fmt.Fprintf(b, "| %s | %s | %.3f (%s / %s) | %s | %s |\n", res.Scenario, human(res.Decisions),
			res.Accuracy, human(res.Allowed), human(res.ReferenceAllowed), ns(res.P50), ns(res.P99))
	}
	b.WriteString("\n")
}

// writeTargets writes the target checks, then the notes.
func (r *Report) writeTargets(b *strings.Builder) {
	b.WriteString("Targets:\n\n")
	for _, t := range r.Targets {
		got := t.Got
		if got == "" {
			got = "—"
		}
		fmt.Fprintf(b, "- **%s** — %s: %s (want %s)\n", t.Status, t.Name, got, t.Want)
	}
	if len(r.Notes) > 0 {
		b.WriteString("\n")
		for _, n := range r.Notes {
			b.WriteString("- " + n + "\n")
		}
	}
}
