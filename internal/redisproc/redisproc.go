// Package redisproc runs redis-server child processes, for the bench program
// to measure against and, through internal/redistest, for tests: each on a
// free port of 127.0.0.1, optionally over TLS, and able to be paused, killed
// and restarted on the same port to stage an outage. Its own count of the
// commands the server executed (INFO commandstats) survives those restarts.
//
// Every method returns an error rather than failing a test: internal/redistest
// wraps a Server for tests and turns those errors into test failures.
package redisproc

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotFound is returned by Start when there is no redis-server on PATH.
var ErrNotFound = errors.New("redisproc: redis-server not found on PATH")

const (
	// startTimeout bounds how long Start and Restart wait for PING.
	startTimeout = 15 * time.Second
	// startAttempts is how many free ports Start tries, in case another
	// process takes the port between probing and binding it.
	startAttempts = 5
)

// Harness is the set of commands the Server itself sends (as Redis names
// them in INFO commandstats), left out of Commands so that only the
// traffic of the clients under test is counted. PING is not in it: the
// library under test sends PINGs too, so the Server subtracts its own.
var Harness = map[string]bool{
	"info":             true,
	"flushall":         true,
	"client|pause":     true,
	"client|unpause":   true,
	"config|resetstat": true,
}

// Server is a redis-server child process. Its methods are safe for
// concurrent use.
type Server struct {
	// Addr is "127.0.0.1:PORT"; it does not change across Kill and Restart.
	Addr string

	bin, dir string
	args     []string    // extra redis-server arguments, from Options.Args
	tls      *tls.Config // from Options.TLS
	password string      // the --requirepass of args, if any

	mu      sync.Mutex // guards the fields below
	proc    *process
	admin   *redis.Client
	pings   int64            // PINGs of the harness since the current process started
	hellos  int64            // connections of the harness (one HELLO each) since then
	carried map[string]int64 // calls counted by processes that have since been killed
	paused  map[string]int64 // the calls counted just before the current pause, if any
}

// Options are the optional settings of Start.
type Options struct {
	// Args follow the arguments every Server gets (port, no persistence, no
	// protected mode, working directory), for example "--maxmemory", "1mb".
	// If they hold --requirepass, the Server's own clients authenticate
	// with that password.
	Args []string
	// TLS, if not nil, makes redis-server accept TLS only: it listens on no
	// plain port (--port 0) and for TLS on Addr (--tls-port). Args must then
	// name the certificate and key files. The Server's own clients (the PING
	// that waits for the server, the one that sends its commands) dial with
	// this configuration.
	TLS *tls.Config
}

// process is one run of redis-server: its output captured, killed with its
// parent. Safe for concurrent use.
type process struct {
	cmd  *exec.Cmd
	out  *Output
	done chan struct{}
	err  error // valid after done is closed
}

// spawn starts bin with argv.
func spawn(bin string, argv ...string) (*process, error) {
	p := &process{cmd: exec.Command(bin, argv...), out: &Output{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	setDeathSignal(p.cmd)
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// kill sends SIGKILL and waits for the process to exit. A nil process is
// fine.
func (p *process) kill() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Output collects what a child process writes; exec writes to it from its
// own goroutines while others read it. Safe for concurrent use.
type Output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Output) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// Tail returns the last n bytes written, marked with "..." if cut.
func (b *Output) Tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf.String()
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}

// Start starts the redis-server found on PATH on a free port of 127.0.0.1,
// with persistence off, its working directory in dir and the settings of
// opt, and waits until it answers PING. It returns an error wrapping
// ErrNotFound if there is no redis-server on PATH; any other error carries
// the tail of the server's output. Close stops it.
func Start(ctx context.Context, dir string, opt Options) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%w (%v)", ErrNotFound, err)
	}
	s := &Server{bin: bin, dir: dir, args: opt.Args, tls: opt.TLS, carried: make(map[string]int64)}
	for i := len(opt.Args) - 2; i >= 0; i-- { // the last --requirepass wins, as in redis-server
		if opt.Args[i] == "--requirepass" {
			s.password = opt.Args[i+1]
			break
		}
	}
	for range startAttempts {
		port, perr := FreePort()
		if perr != nil {
			return nil, fmt.Errorf("redisproc: pick a free port: %w", perr)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if err = s.launch(ctx); !portTaken(err) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("redisproc: start redis-server: %w", err)
	}
	s.admin = redis.NewClient(s.clientOptions())
	return s, nil
}

// portTaken reports whether err is a launch that failed because another
// process holds the port, so that trying again may succeed.
func portTaken(err error) bool {
	return err != nil && strings.Contains(err.Error(), "in use")
}

// clientOptions are those of the Server's own clients.
func (s *Server) clientOptions() *redis.Options {
	return &redis.Options{Addr: s.Addr, TLSConfig: s.tls, Password: s.password,
		DisableIdentity: true, Protocol: 2, OnConnect: s.connected}
}

// FreePort asks the kernel for a free TCP port on 127.0.0.1 and releases it.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// launch runs redis-server on s.Addr and waits until it answers PING. On
// failure the process is gone and the error carries its output.
func (s *Server) launch(ctx context.Context) error {
	_, port, _ := net.SplitHostPort(s.Addr)
	plain, extra := port, s.args
	if s.tls != nil {
		plain, extra = "0", append([]string{"--tls-port", port}, s.args...)
	}
	p, err := spawn(s.bin, append([]string{
		"--port", plain, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--protected-mode", "no",
		"--dir", s.dir,
	}, extra...)...)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.hellos = 0
	s.mu.Unlock()
	pings, err := s.waitReady(ctx, p)
	if err != nil {
		p.kill()
		return fmt.Errorf("%w\nredis-server output:\n%s", err, p.out.Tail(4096))
	}
	s.mu.Lock()
	s.proc, s.pings = p, pings
	s.mu.Unlock()
	return nil
}

// waitReady polls PING on s.Addr until it succeeds, p exits or
// startTimeout passes. It returns how many PINGs the server answered.
func (s *Server) waitReady(ctx context.Context, p *process) (int64, error) {
	o := s.clientOptions()
	o.MaxRetries, o.DialTimeout, o.ReadTimeout = -1, time.Second, time.Second
	c := redis.NewClient(o)
	defer c.Close()
	deadline := time.Now().Add(startTimeout)
	var err error
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return 0, fmt.Errorf("redis-server on %s exited: %v", s.Addr, p.err)
		case <-ctx.Done():
			return 0, ctx.Err()
		default:
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err = c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return 1, nil
		}
		select { // poll interval while the server starts
		case <-p.done:
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
	return 0, fmt.Errorf("redis-server on %s did not answer PING within %v: %v", s.Addr, startTimeout, err)
}

// connected counts a connection of the harness: go-redis opens each with
// a HELLO, which the server counts.
func (s *Server) connected(context.Context, *redis.Conn) error {
	s.mu.Lock()
	s.hellos++
	s.mu.Unlock()
	return nil
}

// Close kills the server and waits for it to exit.
func (s *Server) Close() {
	s.mu.Lock()
	p, admin := s.proc, s.admin
	s.proc, s.admin = nil, nil
	s.mu.Unlock()
	if admin != nil {
		_ = admin.Close()
	}
	p.kill()
}

// Pause makes the server hold every client's commands for d (CLIENT PAUSE
// ALL), as a stalled Redis would. Commands the server executed before the
// pause are counted first, so that Commands stays right if the server is
// killed while paused.
func (s *Server) Pause(ctx context.Context, d time.Duration) error {
	n, err := s.executed(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.paused = n
	s.mu.Unlock()
	ms := (d + time.Millisecond - 1) / time.Millisecond
	_, err = s.Do(ctx, "client", "pause", int64(ms), "all")
	return err
}

// Kill kills the server with SIGKILL and waits for it to exit, as a crash
// would. Commands it executed are carried over into Commands: those counted
// before a Pause if it is paused (commands held by the pause never run),
// otherwise those it reports now. Kill on a server that is not running does
// nothing.
func (s *Server) Kill(ctx context.Context) {
	s.mu.Lock()
	n, running := s.paused, s.proc != nil
	s.mu.Unlock()
	if !running {
		return
	}
	if n == nil {
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		n, _ = s.executed(cctx) // a server that cannot answer has nothing to carry
		cancel()
	}
	s.mu.Lock()
	p := s.proc
	s.proc, s.paused = nil, nil
	for name, c := range n {
		s.carried[name] += c
	}
	s.mu.Unlock()
	p.kill()
}

// Restart starts the server again on the same address, with an empty
// dataset and script cache, and waits until it answers PING. A running
// server is killed first.
func (s *Server) Restart(ctx context.Context) error {
	s.Kill(ctx)
	// The port was just released by our own process; binding it again can
	// race only with an unrelated process, so retry a few times.
	var err error
	for range startAttempts {
		if err = s.launch(ctx); !portTaken(err) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("redisproc: restart redis-server on %s: %w", s.Addr, err)
	}
	return nil
}

// FlushAll deletes every key (FLUSHALL).
func (s *Server) FlushAll(ctx context.Context) error {
	_, err := s.Do(ctx, "flushall")
	return err
}

// Commands returns the calls of every command the server has executed for
// clients other than the Server itself, since Start and across restarts,
// as the server counts them (INFO commandstats, which counts the commands
// scripts run too). Subtract two calls' results to count the commands in
// between.
func (s *Server) Commands(ctx context.Context) (map[string]int64, error) {
	n, err := s.executed(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, c := range s.carried {
		n[name] += c
	}
	return n, nil
}

// CommandStats returns the calls of every command the current process has
// executed, the Server's own included (INFO commandstats, keyed by the
// lower-case name Redis gives, such as "evalsha" or "client|pause"). Unlike
// Commands it starts from zero at every Restart.
func (s *Server) CommandStats(ctx context.Context) (map[string]int64, error) {
	v, err := s.Do(ctx, "info", "commandstats")
	if err != nil {
		return nil, err
	}
	info, ok := v.(string)
	if !ok {
		return nil, fmt.Errorf("redisproc: INFO commandstats: unexpected reply %T", v)
	}
	stats, err := ParseCommandStats(info)
	if err != nil {
		return nil, fmt.Errorf("redisproc: INFO commandstats: %w", err)
	}
	return stats, nil
}

// executed is the count of the current process, without the harness's.
func (s *Server) executed(ctx context.Context) (map[string]int64, error) {
	stats, err := s.CommandStats(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	own := map[string]int64{"ping": s.pings, "hello": s.hellos}
	s.mu.Unlock()
	stats = Without(stats, Harness)
	for name, n := range own {
		if stats[name] -= n; stats[name] <= 0 {
			delete(stats, name)
		}
	}
	return stats, nil
}

// Split adds up the calls in stats (by command name, as INFO commandstats
// names them) into those clients sent — scripts (EVALSHA, EVAL, FCALL),
// SCRIPT, connection and administrative commands — and the commands that
// scripts ran (TIME, HGET, SET and the like): Redis counts both. Neither
// the strategies the bench measures nor their clients send data commands
// themselves, so the names tell the two apart.
func Split(stats map[string]int64) (sent, scripted int64) {
	for name, c := range stats {
		if SentByClient(name) {
			sent += c
		} else {
			scripted += c
		}
	}
	return sent, scripted
}

// SentByClient reports whether the command of this INFO commandstats name
// is one a client sends rather than one a script runs: see Split.
func SentByClient(name string) bool {
	switch name {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro",
		"ping", "hello", "auth", "select", "echo", "quit", "reset", "readonly", "readwrite",
		"multi", "exec", "discard", "watch", "unwatch", "info":
		return true
	}
	for _, p := range []string{"script|", "function|", "client|", "command|", "config|", "cluster|"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// Without returns stats without the commands in skip.
func Without(stats map[string]int64, skip map[string]bool) map[string]int64 {
	out := make(map[string]int64, len(stats))
	for name, c := range stats {
		if !skip[name] {
			out[name] = c
		}
	}
	return out
}

// ParseCommandStats parses the reply of INFO commandstats, lines such as
// "cmdstat_evalsha:calls=3,usec=40,usec_per_call=13.33,rejected_calls=0,failed_calls=0",
// into the number of calls per command.
func ParseCommandStats(info string) (map[string]int64, error) {
	stats := make(map[string]int64)
	for line := range strings.SplitSeq(info, "\n") {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		for kv := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			if k != "calls" {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("line %q: %w", line, err)
			}
			stats[name] = n
		}
	}
	return stats, nil
}

// Version returns the server's version (INFO server redis_version).
func (s *Server) Version(ctx context.Context) string {
	v, _ := s.Do(ctx, "info", "server")
	info, _ := v.(string)
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return ""
}

// Do sends one command on the Server's own connection and returns the
// reply, nil for a nil reply. Commands sent with Do are counted by Commands
// unless Harness names them.
func (s *Server) Do(ctx context.Context, args ...any) (any, error) {
	s.mu.Lock()
	admin := s.admin
	s.mu.Unlock()
	if admin == nil {
		return nil, errors.New("redisproc: server closed")
	}
	v, err := admin.Do(ctx, args...).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("redisproc: %v on %s: %w", args, s.Addr, err)
	}
	return v, nil
}
