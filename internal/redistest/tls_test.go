package redistest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// tlsClient returns a client that gives up quickly, closed in t.Cleanup.
func tlsClient(t *testing.T, addr string, cfg *tls.Config) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: cfg, MaxRetries: -1,
		DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestStartTLS(t *testing.T) {
	s, cfg := StartTLS(t)
	ctx := context.Background()
	c := tlsClient(t, s.Addr, cfg)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET over TLS: %v", err)
	}
	if v, err := s.Client(t).Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET with Server.Client: %q, %v; want \"v\"", v, err)
	}

	// The certificate names 127.0.0.1 as an IP address: a config without
	// ServerName, which crypto/tls fills in from Addr, verifies it too.
	noName := cfg.Clone()
	noName.ServerName = ""
	if err := tlsClient(t, s.Addr, noName).Ping(ctx).Err(); err != nil {
		t.Errorf("PING with ServerName from Addr: %v", err)
	}

	// TLS only: no plain port, the TLS port is Addr.
	_, port, _ := net.SplitHostPort(s.Addr)
	got, err := c.ConfigGet(ctx, "*port").Result()
	if err != nil {
		t.Fatalf("CONFIG GET *port: %v", err)
	}
	if got["port"] != "0" || got["tls-port"] != port {
		t.Errorf("port %q tls-port %q; want 0 and %s", got["port"], got["tls-port"], port)
	}

	// A client that does not speak TLS gets no answer on the TLS port.
	err = tlsClient(t, s.Addr, nil).Ping(ctx).Err()
	if err == nil {
		t.Error("plain PING on the TLS port succeeded")
	}
	t.Logf("plain client on the TLS port: %v", err)

	// A client that does not trust the CA refuses the server's certificate.
	err = tlsClient(t, s.Addr, &tls.Config{ServerName: "127.0.0.1"}).Ping(ctx).Err()
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Errorf("PING without the CA: %v; want x509.UnknownAuthorityError", err)
	}
	t.Logf("client without the CA: %v", err)

	// The helpers' admin client speaks TLS too.
	s.Pause(t, time.Millisecond)
	if n := s.CommandStats(t)["client|pause"]; n != 1 {
		t.Errorf("CommandStats client|pause = %d, want 1", n)
	}
	s.FlushAll(t)
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Errorf("after FlushAll: EXISTS = %d, %v; want 0", n, err)
	}

	// Kill and Restart: the probe waits for TLS on the same port.
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	s.Kill(t)
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING after Kill succeeded")
	}
	s.Restart(t)
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Errorf("after Restart: EXISTS = %d, %v; want 0 (empty dataset)", n, err)
	}
	s.FlushAll(t)
}

// TestStartTLSArgs: extra arguments reach the server, as for Start.
func TestStartTLSArgs(t *testing.T) {
	s, cfg := StartTLS(t, "--requirepass", "secret")
	ctx := context.Background()
	if err := tlsClient(t, s.Addr, cfg).Ping(ctx).Err(); err == nil {
		t.Error("PING without the password succeeded")
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, TLSConfig: cfg, Password: "secret"})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("PING with the password: %v", err)
	}
	s.FlushAll(t) // the admin client has the password and TLS
}

func TestTLSUnsupported(t *testing.T) {
	for _, tc := range []struct {
		out  string
		want bool
	}{
		// Redis up to 7.0 built without BUILD_TLS.
		{"\n*** FATAL CONFIG FILE ERROR (Redis 7.0.15) ***\nReading the configuration file, at line 2\n>>> 'tls-port \"6380\"'\nBad directive or wrong number of arguments\n", true},
		// Redis 7.2 and later without TLS built in or loaded.
		{"1:M 01 Jan 2026 00:00:00.000 # Failed finding TLS support.\n", true},
		// A TLS build refusing its configuration is a failure, not a skip.
		{"1:M 01 Jan 2026 00:00:00.000 # No tls-cert-file configured!\n# Failed to configure TLS. Check logs for more info.\n", false},
		{"\n*** FATAL CONFIG FILE ERROR (Redis 7.0.15) ***\n>>> 'maxmemory \"lots\"'\nargument must be a memory value\n", false},
		{"Could not create server TCP listening socket 127.0.0.1:6380: bind: Address already in use", false},
	} {
		if got := tlsUnsupported(errors.New(tc.out)); got != tc.want {
			t.Errorf("tlsUnsupported(%q) = %v, want %v", tc.out, got, tc.want)
		}
	}
}
