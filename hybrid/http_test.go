package hybrid_test

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
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
	// Mostly waits (lease lifetimes, faults): runs beside the others like it.
	t.Parallel()
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

	// The options: another Retry-After, or none; the error handler sees
	// ErrFailClosed.
	var seen error
	custom := hybrid.Middleware(l, "login", byHeader,
		hybrid.WithOutageRetryAfter(29500*time.Millisecond),
		hybrid.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			seen = err
			w.WriteHeader(http.StatusTooManyRequests)
		}))(http.NotFoundHandler())
	resp = serve(t, custom, "k")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "30" || !errors.Is(seen, hybrid.ErrFailClosed) {
		t.Errorf("custom: status %d, Retry-After %q, error %v; want 429, 30, ErrFailClosed",
			resp.StatusCode, resp.Header.Get("Retry-After"), seen)
	}
	none := hybrid.Middleware(l, "login", byHeader, hybrid.WithOutageRetryAfter(0))(http.NotFoundHandler())
	if resp := serve(t, none, "k"); resp.StatusCode != http.StatusServiceUnavailable || len(resp.Header.Values("Retry-After")) != 0 {
		t.Errorf("no Retry-After: status %d, Retry-After %q", resp.StatusCode, resp.Header.Values("Retry-After"))
	}
}

// TestMiddlewareStacked: two limits on one route each appear as a member of
// the RateLimit-Policy and RateLimit lists, outermost first, on one line
// that Header.Get reads whole; the limit that denies sets Retry-After.
func TestMiddlewareStacked(t *testing.T) {
	l := newLimiter(t, hybrid.Config{Limits: []hybrid.Limit{
		{Name: "route", Rate: 1, Burst: 3, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
		{Name: "client", Rate: 1, Burst: 2, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	everyone := func(*http.Request) string { return "all" }
	h := hybrid.Middleware(l, "route", everyone)(
		hybrid.Middleware(l, "client", byHeader)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		})))
	for i, want := range []struct {
		key        string
		status     int
		policy     string
		rateLimit  string
		retryAfter string
	}{
		{"alice", http.StatusNoContent, `"route";q=3;w=3, "client";q=2;w=2`, `"route";r=2;t=1, "client";r=1;t=1`, ""},
		{"alice", http.StatusNoContent, `"route";q=3;w=3, "client";q=2;w=2`, `"route";r=1;t=2, "client";r=0;t=2`, ""},
		// The inner limit denies: both members, the inner's Retry-After.
		{"alice", http.StatusTooManyRequests, `"route";q=3;w=3, "client";q=2;w=2`, `"route";r=0;t=3, "client";r=0;t=1`, "1"},
		// The outer limit denies: the inner one never decided.
		{"bob", http.StatusTooManyRequests, `"route";q=3;w=3`, `"route";r=0;t=1`, "1"},
	} {
		resp := serve(t, h, want.key)
		if resp.StatusCode != want.status {
			t.Errorf("request %d: status %d, want %d", i, resp.StatusCode, want.status)
		}
		for _, f := range []struct{ name, want string }{
			{"RateLimit-Policy", want.policy}, {"RateLimit", want.rateLimit}, {"Retry-After", want.retryAfter},
		} {
			got := resp.Header.Values(f.name)
			if want := []string{f.want}; f.want == "" && len(got) != 0 || f.want != "" && !slices.Equal(got, want) {
				t.Errorf("request %d: %s %q, want %q", i, f.name, got, f.want)
			}
		}
	}
}

// TestWriteHeaders: the fields of one decision merged into what h holds.
func TestWriteHeaders(t *testing.T) {
	q := hybrid.Quota{Rate: 10, Burst: 10}
	allowed := hybrid.Decision{Allowed: true, Remaining: 4, Source: hybrid.SourceLocal}
	denied := hybrid.Decision{RetryAfter: 1500 * time.Millisecond, Source: hybrid.SourceGlobal}
	for _, tc := range []struct {
		name  string
		limit string
		d     hybrid.Decision
		have  http.Header
		want  http.Header
	}{{
		name: "empty", limit: "api", d: allowed,
		want: http.Header{"Ratelimit-Policy": {`"api";q=10;w=1`}, "Ratelimit": {`"api";r=4;t=1`}},
	}, {
		name: "after another limit", limit: "api", d: allowed,
		have: http.Header{"Ratelimit-Policy": {`"ip";q=5;w=1`}, "Ratelimit": {`"ip";r=1;t=1`}},
		want: http.Header{"Ratelimit-Policy": {`"ip";q=5;w=1, "api";q=10;w=1`}, "Ratelimit": {`"ip";r=1;t=1, "api";r=4;t=1`}},
	}, {
		name: "several lines become one", limit: "api", d: allowed,
		have: http.Header{"Ratelimit-Policy": {`"a";q=1;w=1`, ` "b";q=2;w=1 ,, "c";q=3;w=1`}},
		want: http.Header{"Ratelimit-Policy": {`"a";q=1;w=1, "b";q=2;w=1, "c";q=3;w=1, "api";q=10;w=1`}, "Ratelimit": {`"api";r=4;t=1`}},
	}, {
		name: "the same limit is replaced", limit: "api", d: denied,
		have: http.Header{"Ratelimit-Policy": {`"api";q=10;w=1, "apix";q=1;w=1`}, "Ratelimit": {`"api";r=4;t=1`}},
		want: http.Header{"Ratelimit-Policy": {`"apix";q=1;w=1, "api";q=10;w=1`}, "Ratelimit": {`"api";r=0;t=2`}, "Retry-After": {"2"}},
	}, {
		name: "quoted commas and foreign members are kept", limit: "api", d: allowed,
		have: http.Header{"Ratelimit-Policy": {`"a,\"b";q=1;w=1, 10;w=60`}},
		want: http.Header{"Ratelimit-Policy": {`"a,\"b";q=1;w=1, 10;w=60, "api";q=10;w=1`}, "Ratelimit": {`"api";r=4;t=1`}},
	}, {
		name: "a longer Retry-After is kept", limit: "api", d: denied,
		have: http.Header{"Retry-After": {"7"}},
		want: http.Header{"Ratelimit-Policy": {`"api";q=10;w=1`}, "Ratelimit": {`"api";r=0;t=2`}, "Retry-After": {"7"}},
	}, {
		name: "a shorter Retry-After is raised", limit: "api", d: denied,
		have: http.Header{"Retry-After": {"1"}},
		want: http.Header{"Ratelimit-Policy": {`"api";q=10;w=1`}, "Ratelimit": {`"api";r=0;t=2`}, "Retry-After": {"2"}},
	}, {
		name: "never: no Retry-After", limit: "api", d: hybrid.Decision{RetryAfter: hybrid.Never, Source: hybrid.SourceLocal},
		want: http.Header{"Ratelimit-Policy": {`"api";q=10;w=1`}, "Ratelimit": {`"api";r=0;t=1`}},
	}, {
		name: "fail open: the whole quota", limit: "api", d: hybrid.Decision{Allowed: true, Source: hybrid.SourceFailOpen},
		want: http.Header{"Ratelimit-Policy": {`"api";q=10;w=1`}, "Ratelimit": {`"api";r=10;t=0`}},
	}, {
		name: "fail closed: no RateLimit member", limit: "api", d: hybrid.Decision{RetryAfter: 50 * time.Millisecond, Source: hybrid.SourceFailClosed},
		have: http.Header{"Ratelimit": {`"ip";r=1;t=1, "api";r=4;t=1`}},
		want: http.Header{"Ratelimit-Policy": {`"api";q=10;w=1`}, "Ratelimit": {`"ip";r=1;t=1`}},
	}, {
		name: "fail closed alone", limit: "api", d: hybrid.Decision{Source: hybrid.SourceFailClosed},
		have: http.Header{"Ratelimit": {`"api";r=4;t=1`}},
		want: http.Header{"Ratelimit-Policy": {`"api";q=10;w=1`}},
	}, {
		name: "names are Structured Field Strings", limit: `a"b\cé`, d: allowed,
		want: http.Header{"Ratelimit-Policy": {`"a\"b\\c%c3%a9";q=10;w=1`}, "Ratelimit": {`"a\"b\\c%c3%a9";r=4;t=1`}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.have.Clone()
			if h == nil {
				h = http.Header{}
			}
			hybrid.WriteHeaders(h, tc.limit, q, tc.d)
			if !maps.EqualFunc(h, tc.want, slices.Equal) {
				t.Errorf("got  %q\nwant %q", h, tc.want)
			}
		})
	}
}

// TestMiddlewareOptions: each option on its own, on a Local limit of burst
// 3 at 1 token/s, over a few requests at once.
func TestMiddlewareOptions(t *testing.T) {
	type step struct {
		key    string
		path   string
		status int
		free   bool // passed without a decision, so without headers
	}
	var denied []hybrid.Decision
	var errs []error
	for _, tc := range []struct {
		name   string
		limit  string
		opts   []hybrid.MiddlewareOption
		steps  []step
		denied []hybrid.Decision
		errs   []error
	}{{
		name: "defaults",
		steps: []step{
			{"a", "/", 204, false}, {"a", "/", 204, false}, {"a", "/", 204, false}, {"a", "/", 429, false},
			// Requests without a key share one bucket.
			{"", "/", 204, false}, {"", "/", 204, false}, {"", "/", 204, false}, {"", "/", 429, false},
		},
	}, {
		name: "cost",
		opts: []hybrid.MiddlewareOption{hybrid.WithCost(func(r *http.Request) int {
			n, _ := strconv.Atoi(r.URL.Query().Get("n"))
			return n
		})},
		steps: []step{
			{"a", "/?n=2", 204, false}, {"a", "/?n=2", 429, false}, {"a", "/?n=1", 204, false},
			{"b", "/?n=4", 500, false}, // above the burst: a mistake in the costs
			{"b", "/?n=0", 503, false}, // below 1: an error
		},
	}, {
		name: "skip",
		opts: []hybrid.MiddlewareOption{hybrid.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" })},
		steps: []step{
			{"a", "/", 204, false}, {"a", "/", 204, false}, {"a", "/", 204, false}, {"a", "/healthz", 204, true},
			{"a", "/", 429, false}, {"a", "/healthz", 204, true},
		},
	}, {
		name: "deny handler",
		opts: []hybrid.MiddlewareOption{hybrid.WithDenyHandler(func(w http.ResponseWriter, r *http.Request, d hybrid.Decision) {
			denied = append(denied, d)
			w.WriteHeader(http.StatusTeapot)
		})},
		steps: []step{{"a", "/", 204, false}, {"a", "/", 204, false}, {"a", "/", 204, false}, {"a", "/", 418, false}},
		// Denied right after the last of three tokens at 1/s: a second to
		// wait, give or take the time the test takes.
		denied: []hybrid.Decision{{RetryAfter: time.Second, Source: hybrid.SourceLocal}},
	}, {
		name: "error handler",
		opts: []hybrid.MiddlewareOption{hybrid.WithCost(func(*http.Request) int { return 0 }),
			hybrid.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
				errs = append(errs, err)
				w.WriteHeader(http.StatusBadGateway)
			})},
		steps: []step{{"a", "/", 502, false}},
		errs:  []error{hybrid.ErrInvalidN},
	}, {
		name:  "empty key skipped",
		opts:  []hybrid.MiddlewareOption{hybrid.WithEmptyKey(hybrid.EmptyKeySkip)},
		steps: []step{{"", "/", 204, true}, {"", "/", 204, true}, {"", "/", 204, true}, {"", "/", 204, true}, {"a", "/", 204, false}},
	}, {
		name:  "empty key rejected",
		opts:  []hybrid.MiddlewareOption{hybrid.WithEmptyKey(hybrid.EmptyKeyReject)},
		steps: []step{{"", "/", 400, false}, {"a", "/", 204, false}},
	}, {
		name: "empty key rejected, error handler",
		opts: []hybrid.MiddlewareOption{hybrid.WithEmptyKey(hybrid.EmptyKeyReject), hybrid.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			errs = append(errs, err)
			w.WriteHeader(http.StatusUnauthorized)
		})},
		steps: []step{{"", "/", 401, false}},
		errs:  []error{hybrid.ErrEmptyKey},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			denied, errs = nil, nil
			l := newLimiter(t, hybrid.Config{Limits: []hybrid.Limit{
				{Name: "api", Rate: 1, Burst: 3, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
			}})
			limit := cmp.Or(tc.limit, "api")
			h := hybrid.Middleware(l, limit, byHeader, tc.opts...)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusNoContent)
			}))
			for i, s := range tc.steps {
				req := httptest.NewRequest(http.MethodGet, s.path, nil)
				req.Header.Set("X-Key", s.key)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != s.status {
					t.Errorf("step %d (%q %s): status %d, want %d", i, s.key, s.path, rec.Code, s.status)
				}
				decided := !s.free && (s.status == 204 || s.status == 429 || s.status == 418)
				if got := rec.Header().Get("RateLimit-Policy") != ""; got != decided {
					t.Errorf("step %d (%q %s): RateLimit-Policy %q", i, s.key, s.path, rec.Header().Get("RateLimit-Policy"))
				}
			}
			if len(denied) != len(tc.denied) {
				t.Fatalf("deny handler saw %v, want %v", denied, tc.denied)
			}
			for i, d := range denied {
				d.RetryAfter = d.RetryAfter.Round(time.Second)
				if d != tc.denied[i] {
					t.Errorf("deny handler saw %+v, want %+v", d, tc.denied[i])
				}
			}
			if len(errs) != len(tc.errs) {
				t.Fatalf("error handler saw %v, want %v", errs, tc.errs)
			}
			for i, err := range errs {
				if !errors.Is(err, tc.errs[i]) {
					t.Errorf("error handler saw %v, want %v", err, tc.errs[i])
				}
			}
		})
	}
}

// TestMiddlewareUnknownLimit: a limit name the Limiter does not have is a
// mistake found where the middleware is built (a panic naming the limits it
// has), not a 503 on every request; a limit SetLimits removes later is
// answered 503, as a Limiter that cannot decide.
func TestMiddlewareUnknownLimit(t *testing.T) {
	l := newLimiter(t, hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: 10, Burst: 2, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
		{Name: "login", Rate: 1, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailClosed},
	}})
	func() {
		defer func() {
			msg, _ := recover().(string)
			for _, want := range []string{`"apii"`, `"api", "login"`} {
				if !strings.Contains(msg, want) {
					t.Errorf("panic %q does not say %s", msg, want)
				}
			}
		}()
		hybrid.Middleware(l, "apii", byHeader)
	}()
	h := hybrid.Middleware(l, "login", byHeader)(http.NotFoundHandler())
	if err := l.SetLimits(l.Limits()[:1]); err != nil {
		t.Fatal(err)
	}
	if resp := serve(t, h, "alice"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("removed limit: status %d, want 503", resp.StatusCode)
	}
}
