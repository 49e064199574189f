package hybrid_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

// TestShadowMode, in every mode: a limit in shadow mode admits what it
// denies, says so in Decision.Shadowed, counts the denials in the metrics,
// and enforces again once SetLimits turns shadow mode off. The rate is so
// low that no token comes back within the test.
func TestShadowMode(t *testing.T) {
	srv := redistest.Start(t)
	for _, mode := range []hybrid.Mode{hybrid.Local, hybrid.Global, hybrid.Hybrid} {
		t.Run(mode.String(), func(t *testing.T) {
			srv.FlushAll(t)
			reg := prometheus.NewPedanticRegistry()
			lim := hybrid.Limit{Name: "new-limit", Rate: hybrid.PerDay(1), Burst: 2, Mode: mode, OnOutage: hybrid.FailClosed, Shadow: true}
			l := newLimiter(t, hybrid.Config{Redis: fastClient(t, srv), Members: membership.NewStatic("me", 1),
				Registerer: reg, Limits: []hybrid.Limit{lim}})
			ctx := context.Background()
			for i, want := range []struct{ shadowed bool }{{false}, {false}, {true}, {true}} {
				d, err := l.Allow(ctx, "new-limit", "k")
				if err != nil || !d.Allowed || d.Shadowed != want.shadowed || d.RetryAfter != 0 || d.Source == 0 {
					t.Errorf("decision %d: %+v, %v; want allowed, shadowed %v, no wait", i, d, err, want.shadowed)
				}
			}
			// More than the burst: no error either.
			if d, err := l.AllowN(ctx, "new-limit", "k", 3); err != nil || !d.Allowed || !d.Shadowed {
				t.Errorf("AllowN(3) over burst 2: %+v, %v; want a shadowed admission and no error", d, err)
			}
			allowed, denied, exceeds := outcomes(t, reg, "new-limit")
			if allowed != 2 || denied != 2 || exceeds != 1 {
				t.Errorf("metrics count %v allowed, %v denied and %v above the burst, want the real outcomes 2, 2 and 1", allowed, denied, exceeds)
			}

			lim.Shadow = false
			if err := l.SetLimits([]hybrid.Limit{lim}); err != nil {
				t.Fatal(err)
			}
			if d, err := l.Allow(ctx, "new-limit", "k"); err != nil || d.Allowed || d.Shadowed {
				t.Errorf("out of shadow mode: %+v, %v; want a denial", d, err)
			}
		})
	}
}

// outcomes sums the decisions counted for limit by outcome.
func outcomes(t *testing.T, reg *prometheus.Registry, limit string) (allowed, denied, exceeds float64) {
	t.Helper()
	for _, m := range metricsNamed(t, reg, "hybridlimit_decisions_total") {
		var isLimit bool
		var outcome string
		for _, lp := range m.GetLabel() {
			switch lp.GetName() {
			case "limit":
				isLimit = lp.GetValue() == limit
			case "outcome":
				outcome = lp.GetValue()
			}
		}
		if !isLimit {
			continue
		}
		switch outcome {
		case "allowed":
			allowed += m.GetCounter().GetValue()
		case "denied":
			denied += m.GetCounter().GetValue()
		case "exceeds_burst":
			exceeds += m.GetCounter().GetValue()
		}
	}
	return allowed, denied, exceeds
}

// TestMiddlewareShadowWritesNoHeaders: behind a Middleware, a limit in
// shadow mode lets every request through and writes no RateLimit field or
// Retry-After, so clients do not slow down for a limit that is only
// watched; a limit stacked on it still writes its own.
func TestMiddlewareShadowWritesNoHeaders(t *testing.T) {
	l := newLimiter(t, hybrid.Config{Limits: []hybrid.Limit{
		{Name: "watched", Rate: hybrid.PerDay(1), Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailOpen, Shadow: true},
		{Name: "enforced", Rate: 1000, Burst: 1000, Mode: hybrid.Local, OnOutage: hybrid.FailOpen},
	}})
	key := func(*http.Request) string { return "k" }
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	h := hybrid.Middleware(l, "enforced", key)(hybrid.Middleware(l, "watched", key)(ok))
	for i := range 3 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		policy := rec.Header().Get("RateLimit-Policy")
		if rec.Code != http.StatusOK || rec.Header().Get("Retry-After") != "" ||
			strings.Contains(policy, "watched") || !strings.Contains(policy, "enforced") {
			t.Fatalf("request %d: %d, RateLimit-Policy %q, Retry-After %q; want 200 with only the enforced limit's policy",
				i, rec.Code, policy, rec.Header().Get("Retry-After"))
		}
	}
}
