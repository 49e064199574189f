package hybrid_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/membership"
)

func serve(t *testing.T, h http.Handler, key string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("X-Key", key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func byHeader(r *http.Request) string { return r.Header.Get("X-Key") }

func TestMiddleware(t *testing.T) {
	l := newLimiter(t, hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: 0.5, Burst: 2, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	calls := 0
	h := hybrid.Middleware(l, "api", byHeader)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.WriteHeader(http.StatusNoContent)
	}))
	for i, want := range []struct {
		status     int
		rateLimit  string
		retryAfter string
	}{
		{http.StatusNoContent, `"api";r=1;t=2`, ""},
		{http.StatusNoContent, `"api";r=0;t=4`, ""},
		{http.StatusTooManyRequests, `"api";r=0;t=2`, "2"},
	} {
		resp := serve(t, h, "alice")
		if resp.StatusCode != want.status {
			t.Fatalf("request %d: status %d, want %d", i, resp.StatusCode, want.status)
		}
		// Rate 0.5/s, burst 2: a quota of 2 per 4 s window.
		if got := resp.Header.Get("RateLimit-Policy"); got != `"api";q=2;w=4` {
			t.Errorf("request %d: RateLimit-Policy %q", i, got)
		}
		if got := resp.Header.Get("RateLimit"); got != want.rateLimit {
			t.Errorf("request %d: RateLimit %q, want %q", i, got, want.rateLimit)
		}
		if got := resp.Header.Get("Retry-After"); got != want.retryAfter {
			t.Errorf("request %d: Retry-After %q, want %q", i, got, want.retryAfter)
		}
	}
	if calls != 2 {
		t.Errorf("next handler called %d times, want 2", calls)
	}
	if resp := serve(t, h, "bob"); resp.StatusCode != http.StatusNoContent {
		t.Errorf("another key was limited: %d", resp.StatusCode)
	}
	unknown := hybrid.Middleware(l, "nope", byHeader)(http.NotFoundHandler())
	if resp := serve(t, unknown, "alice"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("unknown limit: status %d, want 503", resp.StatusCode)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if resp := serve(t, h, "carol"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("after Close: status %d, want 503", resp.StatusCode)
	}
}

// TestMiddlewareAdvertisesDegradedQuota: while Redis is down, a FailLocal
// limit advertises this instance's local quota, rate/N.
func TestMiddlewareAdvertisesDegradedQuota(t *testing.T) {
	srv := redistest.Start(t)
	l := newLimiter(t, hybrid.Config{Redis: srv.Client(t), Members: membership.NewStatic("a", 4), Limits: []hybrid.Limit{
		{Name: "api", Rate: 100, Burst: 40, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal},
	}})
	h := hybrid.Middleware(l, "api", byHeader)(http.NotFoundHandler())
	if got := serve(t, h, "k").Header.Get("RateLimit-Policy"); got != `"api";q=100;w=1` {
		t.Fatalf("normal policy %q", got)
	}
	srv.Kill(t)
	eventually(t, 5*time.Second, "the limit degrades", func() bool {
		serve(t, h, "k")
		q, _ := l.Quota("api")
		return q.Degraded
	})
	// rate/N = 25/s, burst/N = 10: 25 per 1 s window.
	if got := serve(t, h, "k").Header.Get("RateLimit-Policy"); got != `"api";q=25;w=1` {
		t.Errorf("degraded policy %q, want the local quota", got)
	}
}

// TestMiddlewareFailClosedIsAnOutage: a request the FailClosed policy
// rejects while Redis is down is answered 503 with a Retry-After of
// seconds, not 429 with Retry-After: 1, so that clients do not retry
// every second against an outage they take for a rate limit.
func TestMiddlewareFailClosedIsAnOutage(t *testing.T) {
	srv := redistest.Start(t)
	l := newLimiter(t, hybrid.Config{Redis: fastClient(t, srv), Limits: []hybrid.Limit{
		{Name: "login", Rate: 100, Burst: 10, Mode: hybrid.Global, OnOutage: hybrid.FailClosed},
	}})
	h := hybrid.Middleware(l, "login", byHeader)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	if resp := serve(t, h, "k"); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("Redis up: status %d, want 204", resp.StatusCode)
	}
	srv.Kill(t)
	eventually(t, 5*time.Second, "the limit degrades", func() bool {
		serve(t, h, "k")
		st, err := l.Status("login")
		return err == nil && st.Degraded
	})
	resp := serve(t, h, "k")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("fail-closed: status %d, want 503", resp.StatusCode)
	}
	if got, want := resp.Header.Get("Retry-After"), "5"; got != want {
		t.Errorf("fail-closed: Retry-After %q, want %q", got, want)
	}
	if got := resp.Header.Get("RateLimit-Policy"); got != `"login";q=100;w=1` {
		t.Errorf("fail-closed: RateLimit-Policy %q, want the policy", got)
	}
	if got := resp.Header.Values("RateLimit"); len(got) != 0 {
		t.Errorf("fail-closed: RateLimit %q, want none: nothing is known of the quota", got)
	}
}
