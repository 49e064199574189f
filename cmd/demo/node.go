package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// reloads says when and from where a node reloads its limits.
type reloads struct {
	// signals delivers a value for each reload asked for (SIGHUP); nil
	// never does.
	signals <-chan os.Signal
	// path is the limits file; empty when the node runs the built-in
	// limits, which it cannot reload.
	path string
}

// runNode runs one instance until ctx ends, printing its addresses and then
// a status line every second, and reloading its limits file on each of
// r.signals. It returns an error if the instance cannot start. A failure to
// leave cleanly (for example a goodbye nobody heard, the other nodes
// stopping at the same moment) is only reported on stderr: the others
// notice a node gone through failure detection anyway, and its leases
// expire.
func runNode(ctx context.Context, cfg instanceConfig, r reloads, stdout, stderr io.Writer) error {
	in, err := startInstance(cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "node %s: gossip %s, http http://%s, redis %s\n", in.name, in.gossip, in.httpAddr, cfg.Redis)
	fmt.Fprintf(stdout, "  join it:  go run ./cmd/demo node -redis %s -join %s\n", cfg.Redis, in.gossip)
	fmt.Fprintf(stdout, "  try:      curl -i 'http://%s/%s?key=you'   (also /metrics and /healthz)\n", in.httpAddr, cfg.Limits[0].Name)
	if r.path != "" {
		fmt.Fprintf(stdout, "  reload:   kill -HUP %d   (after editing %s)\n", os.Getpid(), r.path)
	}

	start := time.Now()
	prev, prevAt := in.sample(), start
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintf(stdout, "node %s: leaving the cluster\n", in.name)
			cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			if err := in.close(cctx); err != nil {
				fmt.Fprintf(stderr, "demo node: %s did not leave cleanly: %v\n", in.name, err)
			}
			return nil
		case now := <-t.C:
			cur := in.sample()
			fmt.Fprintln(stdout, statusLine(in, now.Sub(start), now.Sub(prevAt), prev, cur))
			prev, prevAt = cur, now
		case <-r.signals:
			reload(in, r.path, stderr)
		}
	}
}

// reload loads the limits file at path and puts it in force in in, saying
// on stderr what it did. A file with problems changes nothing: the limits
// in force stay, and every problem is printed with its line.
func reload(in *instance, path string, stderr io.Writer) {
	if path == "" {
		fmt.Fprintln(stderr, "demo node: SIGHUP: no -config file to reload; the built-in limits stay")
		return
	}
	limits, err := loadLimits(path)
	if err == nil {
		err = in.setLimits(limits)
	}
	if err != nil {
		fmt.Fprintf(stderr, "demo node: SIGHUP: limits not reloaded from %s, the limits in force stay:\n%v\n", path, err)
		return
	}
	names := make([]string, len(limits))
	for i, l := range limits {
		names[i] = l.Name
	}
	fmt.Fprintf(stderr, "demo node: SIGHUP: limits reloaded from %s: %s\n", path, strings.Join(names, ", "))
}

// statusLine is one line of a node's status: N, then per limit its mode,
// share and admitted and denied rates, then Redis commands per second.
func statusLine(in *instance, at, over time.Duration, prev, cur []limitSample) string {
	var b strings.Builder
	secs := over.Seconds()
	fmt.Fprintf(&b, "%6.1fs %s N=%d", at.Seconds(), in.name, in.lim.Instances())
	var cmds float64
	for _, c := range cur {
		lim := c.limit
		// The same limit a second ago; none if a reload added it since.
		var p limitSample
		for _, s := range prev {
			if s.limit.Name == lim.Name {
				p = s
			}
		}
		rate, word := share(c.st)
		if word == "" {
			word = fmt.Sprintf("%.1f", rate)
		}
		fmt.Fprintf(&b, " | %s %s share %s ok %.0f/s 429 %.0f/s", lim.Name, mode(c.st), word,
			float64(c.ok-p.ok)/secs, float64(c.denied-p.denied)/secs)
		cmds += float64(c.st.RedisCommands-p.st.RedisCommands) / secs
	}
	fmt.Fprintf(&b, " | redis %.1f cmd/s", cmds)
	return b.String()
}
