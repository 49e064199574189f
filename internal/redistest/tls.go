package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// certValidity is how long the generated certificates are valid: longer
// than any test run, short enough that a leaked key is worthless soon.
const certValidity = 24 * time.Hour

// StartTLS is Start for a redis-server that accepts TLS only: it listens on
// no plain port (--port 0) and for TLS on Addr (--tls-port), with a server
// certificate for 127.0.0.1, ::1 and localhost signed by a CA generated for
// this test (ECDSA P-256, valid for a day, written into t.TempDir()). Clients
// need no certificate of their own (--tls-auth-clients no). args follow as
// for Start.
//
// The returned tls.Config trusts that CA and nothing else; a go-redis client
// with it as Options.TLSConfig talks to the server. The Server's own helpers
// (Client, Kill, Restart, Pause, FlushAll, ...) use it too.
//
// StartTLS skips the test, saying so, when redis-server on PATH was built
// without TLS support; it fails the test for any other error, as Start does.
func StartTLS(t testing.TB, args ...string) (*Server, *tls.Config) {
	t.Helper()
	dir := t.TempDir()
	pool, err := writeCerts(dir)
	if err != nil {
		t.Fatalf("redistest: generate TLS certificates: %v", err)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	tlsArgs := []string{
		"--tls-cert-file", filepath.Join(dir, "server.crt"),
		"--tls-key-file", filepath.Join(dir, "server.key"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.crt"),
		"--tls-auth-clients", "no",
	}
	s, err := start(t, cfg.Clone(), append(tlsArgs, args...))
	if err != nil {
		if tlsUnsupported(err) {
			t.Skipf("redistest: skipping: redis-server on PATH was built without TLS support (build it with BUILD_TLS=yes): %v", err)
		}
		t.Fatalf("redistest: with TLS: %v", err)
	}
	return s, cfg
}

// tlsUnsupported reports whether a failed start's error (which carries the
// server's output) says redis-server has no TLS: up to Redis 7.0 the tls-*
// directives do not exist in a build without it, and from 7.2 on the server
// exits with "Failed finding TLS support." when TLS is neither built in nor
// loaded as a module.
func tlsUnsupported(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "Failed finding TLS support") ||
		strings.Contains(msg, "Bad directive") && strings.Contains(msg, ">>> 'tls-")
}

// writeCerts writes ca.crt, server.crt and server.key into dir and returns a
// pool holding the CA.
func writeCerts(dir string) (*x509.CertPool, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name, typ string
		der       []byte
	}{
		{"ca.crt", "CERTIFICATE", caDER},
		{"server.crt", "CERTIFICATE", der},
		{"server.key", "PRIVATE KEY", keyDER},
	} {
		data := pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der})
		if err := os.WriteFile(filepath.Join(dir, f.name), data, 0o600); err != nil {
			return nil, err
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool, nil
}

// serial returns a random 128-bit certificate serial number.
func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		panic(err) // crypto/rand.Reader does not fail
	}
	return n
}
