package hybrid_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// A Middleware with several limits charges them all-or-none: a per-client
// limit of 1 and a per-route limit of 2. alice's second request is denied
// by her limit, and the route gets its token back, so bob is still
// admitted; carol is denied by the route, and her own limit gets its
// token back. Every answer carries both limits' members. In each mode,
// against a real Redis for Global and Hybrid.
func TestMiddlewareLimitsAllOrNone(t *testing.T) {
	srv := redistest.Start(t)
	for _, mode := range []hybrid.Mode{hybrid.Local, hybrid.Global, hybrid.Hybrid} {
		t.Run(mode.String(), func(t *testing.T) {
			slow := hybrid.PerHour(1) // nothing refills during the test
			l := cluster(t, srv, 1, nil,
				hybrid.Limit{Name: "client", Rate: slow, Burst: 1, Mode: mode, OnOutage: hybrid.FailClosed},
				hybrid.Limit{Name: "route", Rate: slow, Burst: 2, Mode: mode, OnOutage: hybrid.FailClosed})[0]
			calls := 0
			route := func(*http.Request) string { return "/orders" }
			h := hybrid.Middleware(l, "client", byHeader, hybrid.WithLimit("route", route))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls++
			}))
			for i, want := range []struct {
				key       string
				status    int
				rateLimit string
			}{
				{"alice", http.StatusOK, `"client";r=0;t=3600, "route";r=1;t=3600`},
				{"alice", http.StatusTooManyRequests, `"client";r=0;t=3600, "route";r=1;t=3600`},
				{"bob", http.StatusOK, `"client";r=0;t=3600, "route";r=0;t=7200`},
				{"carol", http.StatusTooManyRequests, `"client";r=1;t=0, "route";r=0;t=`},
			} {
				resp := serve(t, h, want.key)
				if resp.StatusCode != want.status {
					t.Errorf("request %d (%s): status %d, want %d", i, want.key, resp.StatusCode, want.status)
				}
				if got := resp.Header.Get("RateLimit"); !strings.HasPrefix(got, want.rateLimit) {
					t.Errorf("request %d (%s): RateLimit %q, want %q", i, want.key, got, want.rateLimit)
				}
				if got := resp.Header.Get("RateLimit-Policy"); !strings.Contains(got, `"client";`) || !strings.Contains(got, `"route";`) {
					t.Errorf("request %d (%s): RateLimit-Policy %q, want both limits", i, want.key, got)
				}
				if want.status != http.StatusOK && resp.Header.Get("Retry-After") == "" {
					t.Errorf("request %d (%s): denied without Retry-After", i, want.key)
				}
			}
			if calls != 2 {
				t.Errorf("handler called %d times, want 2", calls)
			}
			if d, err := l.Allow(context.Background(), "client", "carol"); err != nil || !d.Allowed {
				t.Errorf("carol's own limit after the route denied her: %+v, %v; want her token back", d, err)
			}
		})
	}
}

// WithLimit's limit is checked where the Middleware is built, as its own.
func TestWithLimitUnknownPanics(t *testing.T) {
	l := newLimiter(t, hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: 1, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "rout") {
			t.Errorf("recovered %v, want a panic naming the unknown limit", r)
		}
	}()
	hybrid.Middleware(l, "api", byHeader, hybrid.WithLimit("rout", byHeader))
}
