package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/internal/redisproc"
)

// cmdTimeout bounds each command the helpers send to the server.
const cmdTimeout = 10 * time.Second

// Server is a redis-server child process listening on 127.0.0.1 on a free
// port: a redisproc.Server whose methods fail the test instead of returning
// an error. Its methods are safe for concurrent use.
type Server struct {
	// Addr is the host:port the server listens on, "127.0.0.1:PORT". It does
	// not change across Kill and Restart.
	Addr string

	proc *redisproc.Server
	// tls, set only by StartTLS, is the configuration Client dials with.
	tls *tls.Config
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
	s, err := start(t, nil, args)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return s
}

// start starts a Server in a directory of its own, stopped in t.Cleanup. It
// fails the test if redis-server is not on PATH and returns any other error.
func start(t testing.TB, tlsConfig *tls.Config, args []string) (*Server, error) {
	t.Helper()
	p, err := redisproc.Start(context.Background(), t.TempDir(), redisproc.Options{Args: args, TLS: tlsConfig})
	if errors.Is(err, redisproc.ErrNotFound) {
		t.Fatalf("redistest: %v; install the Debian package redis-server (apt-get install redis-server)", err)
	}
	if err != nil {
		return nil, err
	}
	t.Cleanup(p.Close)
	return &Server{Addr: p.Addr, proc: p, tls: tlsConfig}, nil
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
	s.proc.Kill(context.Background())
}

// Restart starts the server again on the same Addr, with an empty dataset and
// script cache, and waits until it answers PING. A running server is killed
// first. Restart fails the test if the server cannot be started.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.proc.Restart(context.Background()); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// Pause suspends all clients of the server for d (CLIENT PAUSE <ms> ALL), so
// that commands sent in that time are answered only after d: a slow Redis.
// d is rounded up to whole milliseconds.
func (s *Server) Pause(t testing.TB, d time.Duration) {
	t.Helper()
	must(t, func(ctx context.Context) error { return s.proc.Pause(ctx, d) })
}

// FlushAll deletes every key of the server (FLUSHALL).
func (s *Server) FlushAll(t testing.TB) {
	t.Helper()
	must(t, s.proc.FlushAll)
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
	var stats map[string]int64
	must(t, func(ctx context.Context) (err error) {
		stats, err = s.proc.CommandStats(ctx)
		return err
	})
	return stats
}

// do sends one command on the server's own connection and fails the test on
// error.
func (s *Server) do(t testing.TB, args ...any) {
	t.Helper()
	must(t, func(ctx context.Context) error {
		_, err := s.proc.Do(ctx, args...)
		return err
	})
}

// must calls f with a deadline of cmdTimeout and fails the test if it
// returns an error.
func must(t testing.TB, f func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	if err := f(ctx); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}
