// Command demo shows a cluster of service instances holding one rate limit
// through a Redis outage, with no set-up:
//
//	go run ./cmd/demo
//
// starts an embedded Redis, three instances (each a memberlist node, a
// hybrid.Limiter and an HTTP server using hybrid.Middleware) and a load
// generator, then runs phases: balanced load, skewed load, Redis down,
// Redis back, one instance leaves. Every second it prints a table of each
// instance's mode, share and admitted and denied rates; at the end, a
// summary per phase.
//
//	go run ./cmd/demo node -redis ADDR [-join ADDR] [-gossip ADDR:PORT] [-http ADDR:PORT] [-config limits.yaml]
//
// runs one real instance per process, to spread over terminals or machines;
// it reloads its limits file on SIGHUP;
//
//	go run ./cmd/demo redis
//
// serves an embedded Redis for them. See README.md beside this file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/membership"
)

func main() {
	redis.SetLogger(quietRedis{})
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals...)
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C (or SIGTERM) kills the process at once
	}()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// stopSignals end the demo, and make a node leave its cluster cleanly: an
// interrupt (Ctrl-C), and SIGTERM, which is how process managers, Docker and
// Kubernetes stop a process.
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM}

// Exit codes of run.
const (
	exitOK          = 0
	exitError       = 1   // could not start or run
	exitUsage       = 2   // bad flags or limits file
	exitInterrupted = 130 // ctx ended (Ctrl-C) before the demo's end
)

// run runs the command line args (without the program name) until it is
// done or ctx ends, and returns the exit code. The demo returns exitOK after
// its summary and exitInterrupted when ctx ends first; node and redis run
// until ctx ends and then return exitOK.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	stderr = &lockedWriter{w: stderr} // the library logs from its own goroutines
	if len(args) > 0 {
		switch args[0] {
		case "node":
			return runNodeCmd(ctx, args[1:], stdout, stderr)
		case "redis":
			return runRedisCmd(ctx, args[1:], stdout, stderr)
		}
	}
	return runDemoCmd(ctx, args, stdout, stderr)
}

const demoUsage = `usage: demo [flags]                   a live cluster through a Redis outage
       demo node -redis ADDR [flags]  one instance per process (see demo node -h)
       demo redis [-addr ADDR:PORT]   an embedded Redis for nodes

flags:
`

func runDemoCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), demoUsage)
		fs.PrintDefaults()
	}
	opts := demoOptions{}
	fs.IntVar(&opts.instances, "instances", 3, "number of instances in the cluster (1 to 16)")
	fs.DurationVar(&opts.duration, "duration", 40*time.Second, "how long the phases run together, split evenly between them (at least 2s)")
	fs.StringVar(&opts.redisAddr, "redis", "", "`ADDR` (host:port) of a Redis to use instead of the embedded one; the outage phases are then skipped")
	config := fs.String("config", "", "limits `FILE` (YAML); empty means the built-in api, login and search limits, as in cmd/demo/limits.yaml")
	fs.Float64Var(&opts.load, "load", 2, "offered load, as a multiple of each limit's rate (0.1 to 10)")
	fs.BoolVar(&opts.table, "table", true, "print the live table every second (the summary is printed either way)")
	verbose := fs.Bool("v", false, "log the library's state changes (degraded, recovered, instance count) to stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	switch {
	case fs.NArg() > 0:
		return usageError(stderr, "demo: unexpected argument %q: the subcommands are node and redis", fs.Arg(0))
	case opts.instances < 1 || opts.instances > 16:
		return usageError(stderr, "demo: -instances %d: give 1 to 16", opts.instances)
	case opts.duration < 2*time.Second:
		return usageError(stderr, "demo: -duration %v: give at least 2s", opts.duration)
	case !(opts.load >= 0.1 && opts.load <= 10):
		return usageError(stderr, "demo: -load %g: give 0.1 to 10 (times each limit's rate)", opts.load)
	}
	limits, code := limitsFrom(*config, stderr)
	if code != exitOK {
		return code
	}
	opts.limits = limits
	if *verbose {
		opts.logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return runDemo(ctx, opts, stdout, stderr)
}

// limitsFrom loads the limits file at path, or returns the built-in limits
// when path is empty. On error it says what is wrong on stderr.
func limitsFrom(path string, stderr io.Writer) ([]hybrid.Limit, int) {
	if path == "" {
		return defaultLimits(), exitOK
	}
	limits, err := loadLimits(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, exitUsage
	}
	return limits, exitOK
}

func usageError(stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, format+"\n", args...)
	return exitUsage
}

const nodeUsage = `usage: demo node -redis ADDR [flags]

Runs one instance: a memberlist node, a limiter and an HTTP server that
serves each limit at /<name>?key=K (or header X-Key), /metrics and /healthz.
Start the first node without -join; start the others with -join set to the
gossip address the first one prints. Nodes given fixed -gossip ports may
start in any order: each keeps trying its -join addresses for -join-timeout.
Ctrl-C or SIGTERM makes a node leave the cluster cleanly. SIGHUP reloads
the -config file: a file with problems is reported, line by line, and the
limits in force stay.

flags:
`

func runNodeCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), nodeUsage)
		fs.PrintDefaults()
	}
	join := fs.String("join", "", "gossip `ADDR` (host:port) of a running node to join, or several separated by commas; empty starts a new cluster")
	gossip := fs.String("gossip", "127.0.0.1:0", "`ADDR:PORT` for memberlist gossip (TCP and UDP); port 0 picks a free one")
	joinTimeout := fs.Duration("join-timeout", membership.DefaultJoinTimeout, "how long to keep trying the -join addresses while none answers")
	httpAddr := fs.String("http", "127.0.0.1:0", "`ADDR:PORT` of the HTTP server; port 0 picks a free one")
	redisAddr := fs.String("redis", "", "`ADDR` (host:port) of the Redis every node shares; required (the redis subcommand serves an embedded one)")
	config := fs.String("config", "", "limits `FILE` (YAML); empty means the built-in api, login and search limits")
	name := fs.String("name", "", "this node's `NAME` in the cluster; empty means the host name and a random suffix")
	lan := fs.Bool("lan", false, "use memberlist's LAN timings (for nodes on several machines) instead of the fast local ones")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	switch {
	case fs.NArg() > 0:
		return usageError(stderr, "demo node: unexpected argument %q", fs.Arg(0))
	case *redisAddr == "":
		return usageError(stderr, "demo node: -redis is required: give the host:port of a Redis every node shares, "+
			"for example -redis 127.0.0.1:6379 (or run `go run ./cmd/demo redis` in another terminal and use the address it prints)")
	}
	limits, code := limitsFrom(*config, stderr)
	if code != exitOK {
		return code
	}
	cfg := instanceConfig{
		Name:        *name,
		Gossip:      *gossip,
		HTTP:        *httpAddr,
		Redis:       *redisAddr,
		Limits:      limits,
		Profile:     membership.Local,
		JoinTimeout: *joinTimeout,
		Logger:      slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	if *lan {
		cfg.Profile = membership.LAN
	}
	for s := range strings.SplitSeq(*join, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.Seeds = append(cfg.Seeds, s)
		}
	}
	// SIGHUP reloads the limits file, as daemons reload their configuration.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := runNode(ctx, cfg, reloads{signals: hup, path: *config}, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "demo node: %v\n", err)
		return exitError
	}
	return exitOK
}

func runRedisCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo redis", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "`ADDR:PORT` to listen on; port 0 picks a free one")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		return usageError(stderr, "demo redis: unexpected argument %q", fs.Arg(0))
	}
	if err := runRedis(ctx, *addr, stdout); err != nil {
		fmt.Fprintf(stderr, "demo redis: %v\n", err)
		return exitError
	}
	return exitOK
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// quietRedis discards go-redis's own log lines (a failed dial each renewal
// while Redis is down); the library logs the state changes that matter.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}
