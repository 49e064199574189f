package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
)

// The live table and the summary are plain text lines, with no terminal
// escape codes, so that they read the same in a terminal, a log and a test.

// header prints the two header lines of the live table.
func (d *demo) header() {
	var top, sub strings.Builder
	fmt.Fprintf(&top, "%6s %-4s %2s", "", "", "")
	fmt.Fprintf(&sub, "%6s %-4s %2s", "time", "inst", "N")
	for _, l := range d.opts.limits {
		fmt.Fprintf(&top, " | %-27s", fmt.Sprintf("%s (%s)", l.Name, l.OnOutage))
		fmt.Fprintf(&sub, " | %-8s %6s %5s %5s", "mode", "share", "ok/s", "429/s")
	}
	fmt.Fprintf(&top, " | %7s", "redis")
	fmt.Fprintf(&sub, " | %7s", "cmd/s")
	fmt.Fprintln(d.out, top.String())
	fmt.Fprintln(d.out, sub.String())
}

// rows prints one line per live instance and one for the cluster, with
// the rates between two snapshots.
func (d *demo) rows(prev, cur snapshot) {
	secs := cur.at.Sub(prev.at).Seconds()
	if secs <= 0 {
		return
	}
	at := cur.at.Sub(d.start).Seconds()
	nl := len(d.opts.limits)
	sumShare := make([]float64, nl)
	words := make([]string, nl)
	sumOK := make([]float64, nl)
	sumDenied := make([]float64, nl)
	var sumCmds float64
	for i, in := range d.insts {
		if !d.active[i] {
			continue
		}
		var b strings.Builder
		n := 0
		if len(cur.insts[i]) > 0 {
			n = cur.insts[i][0].st.Instances
		}
		fmt.Fprintf(&b, "%6.1f %-4s %2d", at, in.name, n)
		var cmds float64
		for l := range d.opts.limits {
			c, p := cur.insts[i][l], prev.insts[i][l]
			ok := float64(c.ok-p.ok) / secs
			denied := float64(c.denied-p.denied) / secs
			cmds += float64(c.st.RedisCommands-p.st.RedisCommands) / secs
			rate, word := share(c.st)
			s := word
			if word == "" {
				s = fmt.Sprintf("%.1f", rate)
				sumShare[l] += rate
			} else {
				words[l] = word
			}
			fmt.Fprintf(&b, " | %-8s %6s %5.0f %5.0f", mode(c.st), s, ok, denied)
			sumOK[l] += ok
			sumDenied[l] += denied
		}
		sumCmds += cmds
		fmt.Fprintf(&b, " | %7.1f", cmds)
		fmt.Fprintln(d.out, b.String())
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%6.1f %-4s %2s", at, "all", "")
	for l, lim := range d.opts.limits {
		s := fmt.Sprintf("%.1f", sumShare[l])
		if words[l] != "" && sumShare[l] == 0 {
			s = words[l]
		}
		fmt.Fprintf(&b, " | %-8s %6s %5.0f %5.0f", fmt.Sprintf("of %g", lim.Rate), s, sumOK[l], sumDenied[l])
	}
	fmt.Fprintf(&b, " | %7.1f", sumCmds)
	fmt.Fprintln(d.out, b.String())
}

// mode is "normal", or "degraded" while Redis is unreachable.
func mode(st hybrid.Status) string {
	if st.Degraded {
		return "degraded"
	}
	return "normal"
}

// share is the rate a limit holds on one instance: its leases, or its local
// quota rate/N; or a word when no rate applies ("open" or "closed" while a
// FailOpen or FailClosed limit is degraded, "redis" for a Global limit).
func share(st hybrid.Status) (float64, string) {
	switch {
	case st.LeasedRate > 0:
		return st.LeasedRate, ""
	case st.Mode == hybrid.Local:
		return float64(st.LocalShare.Limit), ""
	case st.Degraded && st.OnOutage == hybrid.FailOpen:
		return 0, "open"
	case st.Degraded && st.OnOutage == hybrid.FailClosed:
		return 0, "closed"
	case st.Mode == hybrid.Global && !st.Degraded:
		return 0, "redis"
	}
	return float64(st.LocalShare.Limit), ""
}

// summary prints, per phase and limit, the cluster's admitted rate against
// the limit and the Redis commands against one per request, then what the
// phases showed.
func (d *demo) summary(results []phaseResult, settle time.Duration) {
	w := d.out
	fmt.Fprintf(w, "\n== summary: the cluster's admitted rate against each limit, and the Redis commands it took\n")
	if len(results) == 0 {
		fmt.Fprintln(w, "no phase ran long enough to measure")
		return
	}
	fmt.Fprintf(w, "(each phase is measured after its first %.1fs, while leases settle; \"1 per request\" is what\n", settle.Seconds())
	fmt.Fprintln(w, "checking every request in Redis would have sent: one command per decision)")
	fmt.Fprintf(w, "%-14s  %5s  %2s  %-7s  %-11s  %6s  %-16s  %8s  %10s  %13s  %6s\n",
		"phase", "secs", "N", "limit", "on_outage", "rate/s", "admitted/s", "denied/s", "redis cmds", "1 per request", "ratio")
	var allCmds, allDecisions uint64
	for _, r := range results {
		name := r.kind.String()
		if r.partial {
			name += "*"
		}
		secs, n := fmt.Sprintf("%.1f", r.secs), fmt.Sprint(r.n)
		for l, lim := range d.opts.limits {
			lr := r.limits[l]
			decisions := lr.ok + lr.denied
			allCmds += lr.cmds
			allDecisions += decisions
			admitted := float64(lr.ok) / r.secs
			fmt.Fprintf(w, "%-14s  %5s  %2s  %-7s  %-11s  %6g  %7.1f (%4.0f%%)  %8.1f  %10d  %13d  %5.1f%%\n",
				name, secs, n, lim.Name, lim.OnOutage, lim.Rate,
				admitted, 100*admitted/lim.Rate, float64(lr.denied)/r.secs,
				lr.cmds, decisions, percent(lr.cmds, decisions))
			name, secs, n = "", "", ""
		}
	}
	if results[len(results)-1].partial {
		fmt.Fprintln(w, "* cut short by the interrupt")
	}
	for _, r := range results {
		if r.kind == redisDown {
			fmt.Fprintln(w, "while Redis is down, the commands counted are attempts that fail: they are retried every tick")
			break
		}
	}
	fmt.Fprintln(w)
	for _, r := range results {
		d.explain(r)
	}
	fmt.Fprintf(w, "in all: %d Redis commands for %d decisions (%.2f%%); checking each request in Redis would have sent %d\n",
		allCmds, allDecisions, percent(allCmds, allDecisions), allDecisions)
}

// explain says in words what phase r showed.
func (d *demo) explain(r phaseResult) {
	w := d.out
	switch r.kind {
	case skewed:
		first := -1
		for i, a := range r.active {
			if a {
				first = i
				break
			}
		}
		fmt.Fprintf(w, "with %.0f%% of the traffic on %s:\n", skew*100, d.insts[first].name)
		for l, lim := range d.opts.limits {
			// What a fixed split of rate/N per instance would have admitted
			// on the same arrivals.
			var static float64
			for i, a := range r.active {
				if a {
					t := r.perInst[i][l]
					static += min(float64(t.ok+t.denied)/r.secs, lim.Rate/float64(r.n))
				}
			}
			fmt.Fprintf(w, "  %-7s admitted %6.1f/s of its %g/s; a fixed rate/N split would have admitted at most %.1f/s\n",
				lim.Name, float64(r.limits[l].ok)/r.secs, lim.Rate, static)
		}
	case redisDown:
		fmt.Fprintln(w, "while Redis was down:")
		for l, lim := range d.opts.limits {
			lr := r.limits[l]
			admitted := float64(lr.ok) / r.secs
			frac := percent(lr.ok, lr.ok+lr.denied)
			var what string
			switch {
			case lim.Mode == hybrid.Local:
				what = "a Local limit never uses Redis"
			case lim.OnOutage == hybrid.FailLocal:
				what = fmt.Sprintf("each instance kept a local quota of rate/N = %.1f/s", lim.Rate/float64(r.n))
			case lim.OnOutage == hybrid.FailClosed:
				what = fmt.Sprintf("refused %.0f%% of requests", 100-frac)
			case lim.OnOutage == hybrid.FailOpen:
				what = fmt.Sprintf("let %.0f%% of requests through", frac)
			}
			fmt.Fprintf(w, "  %-7s %-11s admitted %6.1f/s against %g/s: %s\n", lim.Name, lim.OnOutage, admitted, lim.Rate, what)
		}
	case redisBack:
		fmt.Fprintln(w, "once Redis was back:")
		for l, lim := range d.opts.limits {
			fmt.Fprintf(w, "  %-7s admitted %6.1f/s against %g/s, on leases again\n", lim.Name, float64(r.limits[l].ok)/r.secs, lim.Rate)
		}
	case leave:
		fmt.Fprintf(w, "after one instance left (N = %d):\n", r.n)
		for l, lim := range d.opts.limits {
			fmt.Fprintf(w, "  %-7s admitted %6.1f/s against %g/s, on %d %s\n", lim.Name, float64(r.limits[l].ok)/r.secs, lim.Rate, r.n, plural(r.n, "instance"))
		}
	}
}

func percent(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// plural is word, with an s unless n is 1.
func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
