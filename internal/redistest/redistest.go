package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/internal/redisproc"
)

// startTimeout bounds how long Start and Restart wait for the server to
// answer PING.
const startTimeout = 15 * time.Second

// startAttempts is how many free ports Start tries before giving up, in case
// another process takes the port between probing and binding it.
const startAttempts = 5

// Server is a redis-server child process listening on 127.0.0.1 on a free
// port. Its methods are safe for concurrent use.
type Server struct {
	// Addr is the host:port the server listens on, "127.0.0.1:PORT". It does
	// not change across Kill and Restart.
	Addr string

	bin  string
	dir  string
	args []string
	// tls, set only by StartTLS, makes the server listen for TLS alone
	// (--port 0 --tls-port PORT); every client the helper makes (the PING
	// probe, the admin client, Client) then dials with it.
	tls *tls.Config

	mu    sync.Mutex // guards the fields below
	proc  *redisproc.Process
	admin *redis.Client
}

// Start starts a redis-server found on PATH, listening on a free port of
// 127.0.0.1 with persistence off (--save "" and --appendonly no) and
// --protected-mode no, followed by args (for example "--maxmemory", "1mb").
// It waits until the server answers PING and registers a t.Cleanup that
// kills the server and waits for it to exit. Start fails the test, with the
// tail of the server's output, if the server cannot be started; it fails
// (never skips) with an installation hint when redis-server is not on PATH.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	s := newServer(t, nil, args)
	if err := s.start(t); err != nil {
		t.Fatalf("redistest: start redis-server: %v", err)
	}
	return s
}

// newServer looks up redis-server, failing the test if it is not on PATH,
// and registers the cleanup of a Server not yet started.
func newServer(t testing.TB, tlsConfig *tls.Config, args []string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redistest: redis-server not found on PATH (%v); install the Debian package redis-server (apt-get install redis-server)", err)
	}
	s := &Server{bin: bin, dir: t.TempDir(), args: args, tls: tlsConfig}
	t.Cleanup(s.stop)
	return s
}

// start launches the server on a free port, trying a few, and creates the
// admin client. It returns the last launch error.
func (s *Server) start(t testing.TB) error {
	t.Helper()
	var lastErr error
	for range startAttempts {
		port, err := redisproc.FreePort()
		if err != nil {
			t.Fatalf("redistest: pick a free port: %v", err)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if lastErr = s.launch(); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		return lastErr
	}
	s.mu.Lock()
	s.admin = redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true, Protocol: 2,
		Password: argAfter(s.args, "--requirepass"), TLSConfig: s.tls})
	s.mu.Unlock()
	return nil
}

// argAfter returns the argument that follows flag in args, or "".
func argAfter(args []string, flag string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			return args[i+1]
		}
	}
	return ""
}

// launch runs redis-server on s.Addr and waits until it answers PING. On
// failure the process is gone and the error carries its output.
func (s *Server) launch() error {
	_, port, _ := net.SplitHostPort(s.Addr)
	plain, extra := port, s.args
	if s.tls != nil {
		plain, extra = "0", append([]string{"--tls-port", port}, s.args...)
	}
	p, err := redisproc.Launch(s.bin, redisproc.Args(plain, s.dir, extra...)...)
	if err != nil {
		return err
	}
	if err := waitReady(s.Addr, s.tls, p); err != nil {
		p.Kill()
		return fmt.Errorf("%w\nredis-server output:\n%s", err, p.Output().Tail(4096))
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	return nil
}

// waitReady polls PING on addr, over TLS if tlsConfig is not nil, until it
// succeeds, the process exits, or startTimeout passes.
func waitReady(addr string, tlsConfig *tls.Config, p *redisproc.Process) error {
	c := redis.NewClient(&redis.Options{
		Addr:            addr,
		TLSConfig:       tlsConfig,
		DisableIdentity: true,
		Protocol:        2,
		MaxRetries:      -1,
		DialTimeout:     time.Second,
		ReadTimeout:     time.Second,
	})
	defer c.Close()
	deadline := time.Now().Add(startTimeout)
	var err error
	for time.Now().Before(deadline) {
		select {
		case <-p.Done():
			return fmt.Errorf("redis-server on %s exited: %v", addr, p.Err())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = c.Ping(ctx).Err()
		cancel()
		if err == nil || strings.HasPrefix(err.Error(), "NOAUTH") {
			return nil // it answers; that it wants a password is the test's business
		}
		// Poll interval while the server starts, not synchronisation.
		select {
		case <-p.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
	return fmt.Errorf("redis-server on %s did not answer PING within %v: %v", addr, startTimeout, err)
}

// stop kills the server and closes the admin client; it runs in t.Cleanup.
func (s *Server) stop() {
	s.mu.Lock()
	p, admin := s.proc, s.admin
	s.proc, s.admin = nil, nil
	s.mu.Unlock()
	if admin != nil {
		_ = admin.Close()
	}
	p.Kill()
}

// Client returns a new client to the server, closed in t.Cleanup. For a
// server started with StartTLS the client dials with its TLS configuration.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, TLSConfig: s.tls})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Kill kills the server with SIGKILL and waits for it to exit, as a crash
// would. Addr is kept so that Restart brings the server back on the same
// port. Kill on a server that is not running does nothing.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	p.Kill()
}

// Restart starts the server again on the same Addr, with an empty dataset and
// script cache, and waits until it answers PING. A running server is killed
// first. Restart fails the test if the server cannot be started.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill(t)
	// The port was just released by our own process; binding it again can
	// race only with an unrelated process, so retry a few times.
	var err error
	for range startAttempts {
		if err = s.launch(); err == nil {
			return
		}
		if !strings.Contains(err.Error(), "in use") {
			break
		}
	}
	t.Fatalf("redistest: restart redis-server on %s: %v", s.Addr, err)
}

// Pause suspends all clients of the server for d (CLIENT PAUSE <ms> ALL), so
// that commands sent in that time are answered only after d: a slow Redis.
// d is rounded up to whole milliseconds.
func (s *Server) Pause(t testing.TB, d time.Duration) {
	t.Helper()
	ms := (d + time.Millisecond - 1) / time.Millisecond
	s.do(t, "client", "pause", int64(ms), "all")
}

// FlushAll deletes every key of the server (FLUSHALL).
func (s *Server) FlushAll(t testing.TB) {
	t.Helper()
	s.do(t, "flushall")
}

// ScriptFlush empties the server's script cache (SCRIPT FLUSH), so that the
// next EVALSHA of any script fails with NOSCRIPT.
func (s *Server) ScriptFlush(t testing.TB) {
	t.Helper()
	s.do(t, "script", "flush")
}

// CommandStats returns the number of calls per command since the server
// started (INFO commandstats), keyed by the lower-case command name as Redis
// reports it, for example "evalsha", "hgetall" or "client|pause". The helper's
// own commands are included under their own names.
func (s *Server) CommandStats(t testing.TB) map[string]int64 {
	t.Helper()
	v := s.do(t, "info", "commandstats")
	info, ok := v.(string)
	if !ok {
		t.Fatalf("redistest: INFO commandstats: unexpected reply %T", v)
	}
	stats, err := redisproc.ParseCommandStats(info)
	if err != nil {
		t.Fatalf("redistest: INFO commandstats: %v", err)
	}
	return stats
}

// do runs one admin command with a deadline and fails the test on error.
func (s *Server) do(t testing.TB, args ...any) any {
	t.Helper()
	s.mu.Lock()
	admin := s.admin
	s.mu.Unlock()
	if admin == nil {
		t.Fatalf("redistest: %v: server stopped", args)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := admin.Do(ctx, args...).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatalf("redistest: %v on %s: %v", args, s.Addr, err)
	}
	return v
}
