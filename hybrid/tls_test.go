package hybrid_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redisproc"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// TestRedisTLS runs a Hybrid limit against a redis-server that accepts TLS
// only. TLS is the go-redis client's business (Options.TLSConfig): a client
// that trusts the server's CA gets leases; one whose certificate check fails
// gets none, and New refuses it if go-redis reports the failure within
// RedisTimeout; a client that does not speak TLS cannot tell the server from
// a dead one, so its limiter follows the outage policy.
func TestRedisTLS(t *testing.T) {
	srv, tlsConfig := redistest.StartTLS(t)
	limits := []hybrid.Limit{{Name: "h", Rate: 100, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed}}
	client := func(t *testing.T, cfg *tls.Config, tune func(*redis.Options)) *redis.Client {
		opt := &redis.Options{Addr: srv.Addr, TLSConfig: cfg, MaxRetries: -1,
			DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond}
		if tune != nil {
			tune(opt)
		}
		rdb := redis.NewClient(opt)
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}
	// promptDial makes go-redis report a failed dial at once instead of
	// after 5 attempts 100ms apart, which outlasts RedisTimeout.
	promptDial := func(o *redis.Options) { o.DialerRetries, o.DialerRetryTimeout = 1, time.Millisecond }
	ctx := context.Background()

	t.Run("trusted", func(t *testing.T) {
		l := newLimiter(t, hybrid.Config{Redis: client(t, tlsConfig, nil), Limits: limits})
		// warmKey makes the key worth a lease: its first decisions are
		// exact, and the next tick asks for one.
		eventually(t, 5*time.Second, "a lease over TLS", func() bool {
			d := warmKey(t, l, "h", "k", 10)
			st, _ := l.Status("h")
			return d.Source == hybrid.SourceLease && st.LeasedRate > 0 && !st.Degraded
		})
	})

	for _, tc := range []struct {
		name    string
		cfg     *tls.Config
		wraps   func(error) bool
		wrapped string
	}{
		{"unknown CA", &tls.Config{RootCAs: x509.NewCertPool(), ServerName: "127.0.0.1"},
			func(err error) bool { var e x509.UnknownAuthorityError; return errors.As(err, &e) }, "x509.UnknownAuthorityError"},
		{"wrong server name", &tls.Config{RootCAs: tlsConfig.RootCAs, ServerName: "redis.example"},
			func(err error) bool { var e x509.HostnameError; return errors.As(err, &e) }, "x509.HostnameError"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := hybrid.New(hybrid.Config{Redis: client(t, tc.cfg, promptDial), Limits: limits})
			if err == nil {
				_ = l.Close(context.Background())
				t.Fatal("New accepted a client that cannot verify the server's certificate")
			}
			var verr *tls.CertificateVerificationError
			if !errors.Is(err, hybrid.ErrConfig) || !errors.As(err, &verr) || !strings.Contains(err.Error(), "TLSConfig") {
				t.Errorf("error %q: want ErrConfig wrapping a tls.CertificateVerificationError, saying to check the TLSConfig", err)
			}
			if !tc.wraps(err) {
				t.Errorf("error %q does not wrap %s", err, tc.wrapped)
			}
			t.Logf("New: %v", err)
		})
	}

	// With go-redis's default dial retries the certificate error comes after
	// RedisTimeout: New sees only its deadline, takes Redis for unreachable
	// and starts; the limit never gets a lease and follows OnOutage. Only
	// go-redis's own log names the certificate.
	t.Run("unknown CA, default dial retries", func(t *testing.T) {
		var logs redisproc.Output
		// A pool larger than the failed dials of the test, so that go-redis
		// does not start its background redial loop, which notices Close
		// only up to a second later.
		rdb := client(t, &tls.Config{RootCAs: x509.NewCertPool(), ServerName: "127.0.0.1"}, func(o *redis.Options) { o.PoolSize = 1000 })
		l := newLimiter(t, hybrid.Config{Redis: rdb, Limits: limits, UncontendedTTL: time.Second,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if out := logs.Tail(1 << 20); !strings.Contains(out, "not reachable at start") || !strings.Contains(out, "deadline exceeded") {
			t.Errorf("New logged %q; want Redis not reachable at start, deadline exceeded", out)
		}
		eventually(t, 5*time.Second, "the limit degrades to FailClosed", func() bool {
			d, err := l.Allow(ctx, "h", "k")
			st, _ := l.Status("h")
			return err == nil && d.Source == hybrid.SourceFailClosed && !d.Allowed && st.Degraded && st.LeasedRate == 0
		})
	})

	// A plain client on the TLS port: the server drops the connection when
	// the first bytes are not a TLS handshake, and go-redis reports EOF, as
	// for a server that went away. New logs Redis as unreachable and starts;
	// the limit never gets a lease and follows OnOutage.
	t.Run("plain client", func(t *testing.T) {
		var logs redisproc.Output
		// Limits degrade after UncontendedTTL/2 without an answer.
		l := newLimiter(t, hybrid.Config{Redis: client(t, nil, nil), Limits: limits, UncontendedTTL: time.Second,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if out := logs.Tail(1 << 20); !strings.Contains(out, "not reachable at start") || !strings.Contains(out, "EOF") {
			t.Errorf("New logged %q; want Redis not reachable at start, with EOF", out)
		}
		eventually(t, 5*time.Second, "the limit degrades to FailClosed", func() bool {
			d, err := l.Allow(ctx, "h", "k")
			st, _ := l.Status("h")
			return err == nil && d.Source == hybrid.SourceFailClosed && !d.Allowed && st.Degraded && st.LeasedRate == 0
		})
	})
}
