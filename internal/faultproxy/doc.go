// Package faultproxy puts a Toxiproxy TCP proxy between a test's clients
// and a real server, to inject network faults: added latency, a blackhole,
// connection resets and a bandwidth limit.
//
// The proxy runs in the test process (Toxiproxy's own Go packages, no
// toxiproxy-server binary and no HTTP API), listens on a free port of
// 127.0.0.1 and is stopped in t.Cleanup, with every connection it carried
// closed. Only tests import this package, so Toxiproxy stays out of the
// library's import graph.
package faultproxy
