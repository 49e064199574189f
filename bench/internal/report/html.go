package report

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
)

// colors of the strategies in the charts; the reference is drawn in black.
var colors = map[string]string{
	Local:     "#7f7f7f",
	Global:    "#d62728",
	Hybrid:    "#1f77b4",
	RedisRate: "#ff7f0e",
}

func color(strategy string) string {
	if c, ok := colors[strategy]; ok {
		return c
	}
	return "#2ca02c"
}

var page = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>hybridlimit bench</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; padding: 0 1em; }
h1, h2 { font-weight: 600; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { padding: .25em .6em; border-bottom: 1px solid #ddd; text-align: right; }
th:nth-child(-n+2), td:nth-child(-n+2) { text-align: left; }
.warn { background: #fff3cd; border: 1px solid #e0c36b; padding: .6em 1em; }
.met { color: #1a7f37; font-weight: 600; }
.notmet { color: #b42318; font-weight: 600; }
.grid { display: flex; flex-wrap: wrap; gap: 12px; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
svg .title { font-size: 13px; font-weight: 600; }
.legend span { display: inline-block; margin-right: 1.2em; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: .3em; vertical-align: -1px; }
</style>
</head>
<body>
<h1>hybridlimit bench</h1>
{{if not .R.Representative}}<p class="warn"><b>Not representative:</b> measured on an embedded in-process Redis (miniredis); Redis commands are counted by the clients.</p>{{end}}
<p>Redis: {{.R.Redis}} · {{.R.Platform}}, {{.R.CPUs}} CPUs, {{.R.GoVersion}} · {{if .R.Quick}}quick run{{else}}full run{{end}}, scale {{.R.Scale}}, {{.R.Arrivals}} arrivals · wall time {{printf "%.1f" .R.WallSeconds}} s · started {{.R.Started.Format "2006-01-02 15:04:05 MST"}}.
Absolute numbers vary by machine; the ratios are the point.</p>
<div class="legend">{{range .Legend}}<span><i style="background:{{.Color}}"></i>{{.Name}}</span>{{end}}<span><i style="background:#000"></i>exact reference</span></div>

<h2>Redis commands per decision against accuracy</h2>
<p>One panel per scenario, one point per strategy. Accuracy is what the strategy admitted over what one exact token bucket per key admits on the same arrivals (1 is perfect; the band is 0.97–1.03, the target being 0.97 or more). Commands are per decision, on a log scale; <code>local</code> sends none and sits on the “0” line.</p>
<div class="grid">{{range .Scatter}}{{.}}{{end}}</div>

<h2>Admitted rate over time</h2>
<p>Admissions per second in {{.BucketMS}} ms buckets, by the time each decision started; the exact reference is dashed. Pulse and shift are one key whose demand moves between the instances.</p>
<div class="grid">{{range .Series}}{{.}}{{end}}</div>

<h2>Results</h2>
<table>
<tr><th>scenario</th><th>strategy</th><th>decisions</th><th>allowed / reference</th><th>Redis commands</th><th>per 1000 decisions</th><th>decisions/s (closed loop)</th><th>p50</th><th>p99</th></tr>
{{range .Rows}}<tr><td>{{.Scenario}}</td><td>{{.Strategy}}</td><td>{{.Decisions}}</td><td>{{.Accuracy}}</td><td>{{.Commands}}</td><td>{{.Per1000}}</td><td>{{.DPS}}</td><td>{{.P50}}</td><td>{{.P99}}</td></tr>
{{end}}</table>
{{if .Windows}}
<h2>Most admitted in any 1 s window</h2>
<p>One-key scenarios, over the whole run, by the time each decision started, against the most the limit allows in one window, rate·1 s + burst; ✗ marks more than that. Invariant 1 allows one lease's worth (a fair share, rate/N·1 s + burst/N) more per instance per membership change: the targets add it on churn, whose instance leaves and rejoins.</p>
<table>
<tr>{{range .WindowHead}}<th>{{.}}</th>{{end}}</tr>
{{range .Windows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
{{end}}
<h2>Targets</h2>
<ul>{{range .R.Targets}}<li><span class="{{if eq .Status "met"}}met{{else}}notmet{{end}}">{{.Status}}</span> — {{.Name}}: {{.Got}} (want {{.Want}})</li>
{{end}}</ul>
{{if .R.Notes}}<h2>Notes</h2><ul>{{range .R.Notes}}<li>{{.}}</li>{{end}}</ul>{{end}}
</body>
</html>
`))

type row struct {
	Scenario, Strategy, Decisions, Accuracy, Commands, Per1000, DPS, P50, P99 string
}

type legend struct{ Name, Color string }

// WriteHTML writes one self-contained page: the charts are inline SVG and
// the page loads nothing from anywhere.
func (r *Report) WriteHTML(w io.Writer) error {
	data := struct {
		R          *Report
		Legend     []legend
		Scatter    []template.HTML
		Series     []template.HTML
		Rows       []row
		WindowHead []string
		Windows    [][]string
		BucketMS   float64
	}{R: r}
	data.WindowHead, data.Windows = r.maxWindows()
	var scenarios, strategies []string
	seen := map[string]bool{}
	for _, res := range r.Scenarios {
		if !seen["s:"+res.Scenario] {
			seen["s:"+res.Scenario] = true
			scenarios = append(scenarios, res.Scenario)
		}
		if !seen["t:"+res.Strategy] {
			seen["t:"+res.Strategy] = true
			strategies = append(strategies, res.Strategy)
			data.Legend = append(data.Legend, legend{res.Strategy, color(res.Strategy)})
		}
		data.BucketMS = float64(res.BucketNS) / 1e6
		data.Rows = append(data.Rows, row{
			Scenario: res.Scenario, Strategy: res.Strategy, Decisions: human(res.Decisions),
			Accuracy: fmt.Sprintf("%.3f (%s / %s)", res.Accuracy, human(res.Allowed), human(res.ReferenceAllowed)),
			Commands: human(res.RedisCommands) + map[bool]string{true: " (client-counted)"}[res.RedisCountedBy == "client"],
			Per1000:  sig(1000 * res.CommandsPerDecision), DPS: rate(res.DecisionsPerSec), P50: ns(res.P50), P99: ns(res.P99),
		})
	}
	for _, sc := range scenarios {
		var rs []*Result
		for _, st := range strategies {
			if res := r.Find(sc, st); res != nil {
				rs = append(rs, res)
			}
		}
		data.Scatter = append(data.Scatter, scatter(sc, rs, r.Representative))
	}
	for _, sc := range []string{"outage", "churn", "pulse", "shift"} {
		var rs []*Result
		for _, st := range strategies {
			if res := r.Find(sc, st); res != nil {
				rs = append(rs, res)
			}
		}
		if len(rs) > 0 {
			data.Series = append(data.Series, timeSeries(sc, rs, r.Representative))
		}
	}
	return page.Execute(w, data)
}

// esc escapes text for SVG inside HTML.
func esc(s string) string { return template.HTMLEscapeString(s) }

func title(s string, representative bool) string {
	if !representative {
		s += " (not representative)"
	}
	return s
}

// frame is a chart's size and its plot's margins, in pixels.
type frame struct{ w, h, left, right, top, bottom int }

// open starts the chart's SVG element.
func (f frame) open(b *strings.Builder) {
	fmt.Fprintf(b, `<svg width="%d" height="%d" viewBox="0 0 %d %d" role="img">`, f.w, f.h, f.w, f.h)
}

// axes draws the plot's left and bottom edges.
func (f frame) axes(b *strings.Builder) {
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999"/>`, f.left, f.top, f.left, f.h-f.bottom)
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999"/>`, f.left, f.h-f.bottom, f.w-f.right, f.h-f.bottom)
}

// scatter draws one scenario's strategies: Redis commands per decision (log
// x, with a lane for 0) against accuracy (y).
func scatter(scenario string, rs []*Result, representative bool) template.HTML {
	p := newScatterPlot(rs)
	var b strings.Builder
	p.open(&b)
	fmt.Fprintf(&b, `<text class="title" x="%d" y="16">%s</text>`, p.left, esc(title(scenario, representative)))
	p.grid(&b)
	var placed []box
	for _, r := range rs {
		placed = p.point(&b, r, placed)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // #nosec: every text is escaped where it is written
}

// zeroLane is how far right of a scatter's left edge x = 0 is drawn, in
// pixels: 0 has no place on a log scale.
const zeroLane = 16

// scatterPlot is the scale of a scatter: x from 10^lo to 10^hi on a log
// scale, after the lane for 0; y from 0 to yMax.
type scatterPlot struct {
	frame
	lo, hi, yMax float64
	x0, pw, ph   float64 // the log scale's left edge, its width and the height
}

// newScatterPlot returns a scale on which every point of rs fits.
func newScatterPlot(rs []*Result) scatterPlot {
	p := scatterPlot{frame: frame{w: 340, h: 260, left: 48, right: 14, top: 28, bottom: 40}, lo: -4.0, hi: 1.0, yMax: 1.2}
	for _, r := range rs {
		if c := r.CommandsPerDecision; c > 0 {
			p.lo = math.Min(p.lo, math.Floor(math.Log10(c)))
			p.hi = math.Max(p.hi, math.Ceil(math.Log10(c)))
		}
		p.yMax = math.Max(p.yMax, math.Ceil(r.Accuracy*10+0.5)/10)
	}
	p.x0 = float64(p.left + zeroLane + 30)
	p.pw = float64(p.w-p.right) - p.x0
	p.ph = float64(p.h - p.top - p.bottom)
	return p
}

func (p scatterPlot) px(c float64) float64 {
	if c <= 0 {
		return float64(p.left + zeroLane)
	}
	return p.x0 + (math.Log10(c)-p.lo)/(p.hi-p.lo)*p.pw
}

func (p scatterPlot) py(a float64) float64 { return float64(p.top) + (1-a/p.yMax)*p.ph }

// grid draws the accuracy band, the axes, the grid lines and their labels.
func (p scatterPlot) grid(b *strings.Builder) {
	left, right, top, bottom, w, h := p.left, p.right, p.top, p.bottom, p.w, p.h
	fmt.Fprintf(b, `<rect x="%d" y="%.1f" width="%d" height="%.1f" fill="#e8f3e8"/>`, left, p.py(2-accuracyFloor), w-right-left, p.py(accuracyFloor)-p.py(2-accuracyFloor))
	fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#9c9" stroke-dasharray="4 3"/>`, left, p.py(1), w-right, p.py(1))
	p.axes(b)
	for a := 0.0; a <= p.yMax+1e-9; a += 0.2 {
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%.1f</text>`, left-4, p.py(a)+4, a)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`, left+1, p.py(a), w-right, p.py(a))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">0</text>`, left+zeroLane, h-bottom+14)
	for e := p.lo; e <= p.hi; e++ {
		x := p.px(math.Pow(10, e))
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">1e%d</text>`, x, h-bottom+14, int(e))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`, x, top, x, h-bottom)
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">Redis commands per decision</text>`, p.x0+p.pw/2, h-6)
	fmt.Fprintf(b, `<text transform="translate(12 %.1f) rotate(-90)" text-anchor="middle">accuracy</text>`, float64(top)+p.ph/2)
}

// box is the room a label takes.
type box struct{ x0, x1, y float64 }

// point draws r's point and its label, clear of the labels placed
// already; it returns placed with the new label's box.
func (p scatterPlot) point(b *strings.Builder, r *Result, placed []box) []box {
	x, y := p.px(r.CommandsPerDecision), p.py(math.Max(0, math.Min(r.Accuracy, p.yMax)))
	fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="5" fill="%s" fill-opacity=".85"><title>%s: %.3g commands per decision, accuracy %.3f</title></circle>`,
		x, y, color(r.Strategy), esc(r.Strategy), r.CommandsPerDecision, r.Accuracy)
	c, anchor := placeLabel(placed, x, y, 6.5*float64(len(r.Strategy)), float64(p.w))
	tx := c.x0
	if anchor == "end" {
		tx = c.x1
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="%s" fill="%s">%s</text>`, tx, c.y, anchor, color(r.Strategy), esc(r.Strategy))
	return append(placed, c)
}

// placeLabel finds room for a label lw wide by the point (x, y), within a
// chart w wide: right of the point, else left, else lower down, so that
// points in one place stay readable. It returns the box and the text
// anchor; with no room anywhere, the last box tried.
func placeLabel(placed []box, x, y, lw, w float64) (box, string) {
	free := func(c box) bool {
		for _, p := range placed {
			if c.x0 < p.x1 && p.x0 < c.x1 && math.Abs(c.y-p.y) < 12 {
				return false
			}
		}
		return c.x0 >= 0 && c.x1 <= w
	}
	var c box
	anchor := "start"
search:
	for dy := 0.0; dy < 120; dy += 12 {
		for _, right := range []bool{true, false} {
			if right {
				c = box{x + 8, x + 8 + lw, y + 4 + dy}
			} else {
				c = box{x - 8 - lw, x - 8, y + 4 + dy}
			}
			if free(c) {
				if !right {
					anchor = "end"
				}
				break search
			}
		}
	}
	return c, anchor
}

// timeSeries draws the admitted rate over time of every strategy on one
// scenario, with the reference dashed and its events marked.
func timeSeries(scenario string, rs []*Result, representative bool) template.HTML {
	p := newSeriesPlot(rs)
	var b strings.Builder
	p.open(&b)
	fmt.Fprintf(&b, `<text class="title" x="%d" y="18">%s</text>`, p.left, esc(title(scenario+": admitted per second", representative)))
	p.events(&b, rs[0])
	p.grid(&b)
	for _, r := range rs {
		p.line(&b, r.Series, color(r.Strategy), "none", 1.8, r.Strategy)
	}
	p.line(&b, rs[0].RefSeries, "#000", "5 4", 1.4, "exact reference")
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // #nosec: every text is escaped where it is written
}

// seriesPlot is the scale of a time series: seconds from 0 to end on x,
// admissions per second from 0 to yMax on y.
type seriesPlot struct {
	frame
	n           int     // buckets drawn: those of the reference
	bucket, end float64 // in seconds
	yMax        float64
	pw, ph      float64 // the plot's width and height
}

// newSeriesPlot returns a scale on which every series of rs, and the
// reference, fits.
func newSeriesPlot(rs []*Result) seriesPlot {
	r0 := rs[0]
	p := seriesPlot{frame: frame{w: 1060, h: 320, left: 56, right: 16, top: 30, bottom: 40},
		n: len(r0.RefSeries), bucket: float64(r0.BucketNS) / 1e9, end: float64(r0.EndNS) / 1e9}
	for _, r := range rs {
		for _, v := range r.Series {
			p.yMax = math.Max(p.yMax, float64(v)/p.bucket)
		}
	}
	for _, v := range r0.RefSeries {
		p.yMax = math.Max(p.yMax, float64(v)/p.bucket)
	}
	p.yMax = niceCeil(p.yMax * 1.05)
	p.pw, p.ph = float64(p.w-p.left-p.right), float64(p.h-p.top-p.bottom)
	return p
}

func (p seriesPlot) px(t float64) float64 { return float64(p.left) + t/p.end*p.pw }
func (p seriesPlot) py(v float64) float64 { return float64(p.top) + (1-v/p.yMax)*p.ph }

// events marks r0's events: a line for each instance's leave or join, a
// band for each phase of the outage, and the warm-up.
func (p seriesPlot) events(b *strings.Builder, r0 *Result) {
	var pause, kill, restart = -1.0, -1.0, -1.0
	for _, e := range r0.Events {
		t := float64(e.AtNS) / 1e9
		switch e.Kind {
		case "pause":
			pause = t
		case "kill":
			kill = t
		case "restart":
			restart = t
		default:
			fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#555" stroke-dasharray="2 3"/>`, p.px(t), p.top, p.px(t), p.h-p.bottom)
			fmt.Fprintf(b, `<text x="%.1f" y="%d">%s slot %d</text>`, p.px(t)+3, p.top+12, esc(e.Kind), e.Slot)
		}
	}
	if pause >= 0 {
		stop := kill
		if stop < 0 {
			stop = restart
		}
		p.band(b, pause, stop, "#fdebd0", "Redis paused")
	}
	if kill >= 0 {
		p.band(b, kill, restart, "#f9d6d5", "Redis killed")
	}
	warm := float64(r0.WarmupNS) / 1e9
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%.1f" height="%.1f" fill="#f4f4f4"/>`, p.left, p.top, p.px(warm)-float64(p.left), p.ph)
	fmt.Fprintf(b, `<text x="%d" y="%d">warm-up</text>`, p.left+3, p.h-p.bottom-6)
}

// band shades the plot from from to to, unless an event of it is missing.
func (p seriesPlot) band(b *strings.Builder, from, to float64, fill, label string) {
	if from < 0 || to < from {
		return
	}
	fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="%.1f" fill="%s"/>`, p.px(from), p.top, p.px(to)-p.px(from), p.ph, fill)
	fmt.Fprintf(b, `<text x="%.1f" y="%d">%s</text>`, p.px(from)+3, p.top+12, esc(label))
}

// grid draws the axes, the grid lines and their labels.
func (p seriesPlot) grid(b *strings.Builder) {
	p.axes(b)
	yStep := niceCeil(p.yMax / 5)
	for v := 0.0; v <= p.yMax+1e-9; v += yStep {
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`, p.left-4, p.py(v)+4, rate(v))
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`, p.left+1, p.py(v), p.w-p.right, p.py(v))
	}
	step := niceCeil(p.end / 10)
	for t := 0.0; t <= p.end+1e-9; t += step {
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%.3g s</text>`, p.px(t), p.h-p.bottom+14, t)
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">time since start</text>`, float64(p.left)+p.pw/2, p.h-6)
}

// line draws series as a polyline, a point in the middle of each bucket.
func (p seriesPlot) line(b *strings.Builder, series []int, stroke, dash string, width float64, name string) {
	var pts strings.Builder
	for i := 0; i < p.n && i < len(series); i++ {
		t := math.Min((float64(i)+0.5)*p.bucket, p.end)
		fmt.Fprintf(&pts, "%.1f,%.1f ", p.px(t), p.py(float64(series[i])/p.bucket))
	}
	fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="%.1f" stroke-dasharray="%s" points="%s"><title>%s</title></polyline>`,
		stroke, width, dash, strings.TrimSpace(pts.String()), esc(name))
}

// niceCeil rounds v up to a round number: 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8
// times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
