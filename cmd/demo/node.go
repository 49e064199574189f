package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// runNode runs one instance until ctx ends, printing its addresses and then
// a status line every second. It returns an error if the instance cannot
// start. A failure to leave cleanly (for example a goodbye nobody heard,
// the other nodes stopping at the same moment) is only reported on stderr:
// the others notice a node gone through failure detection anyway, and its
// leases expire.
func runNode(ctx context.Context, cfg instanceConfig, stdout, stderr io.Writer) error {
	in, err := startInstance(cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "node %s: gossip %s, http http://%s, redis %s\n", in.name, in.gossip, in.httpAddr, cfg.Redis)
	fmt.Fprintf(stdout, "  join it:  go run ./cmd/demo node -redis %s -join %s\n", cfg.Redis, in.gossip)
	fmt.Fprintf(stdout, "  try:      curl -i 'http://%s/%s?key=you'   (also /metrics and /healthz)\n", in.httpAddr, cfg.Limits[0].Name)

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
		}
	}
}

// statusLine is one line of a node's status: N, then per limit its mode,
// share and admitted and denied rates, then Redis commands per second.
func statusLine(in *instance, at, over time.Duration, prev, cur []limitSample) string {
	var b strings.Builder
	secs := over.Seconds()
	fmt.Fprintf(&b, "%6.1fs %s N=%d", at.Seconds(), in.name, in.lim.Instances())
	var cmds float64
	for l, lim := range in.limits {
		c, p := cur[l], prev[l]
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
