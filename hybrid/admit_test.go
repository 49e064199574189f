package hybrid_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/hybridlimit/hybridlimit/hybrid"
)

// Admit answers a hand-written handler's request the way Middleware does:
// the same status, RateLimit headers and Retry-After, and whether to go on.
func TestAdmitAnswersAsTheMiddleware(t *testing.T) {
	l := newLimiter(t, hybrid.Config{Limits: []hybrid.Limit{
		{Name: "login", Rate: 0.5, Burst: 2, Mode: hybrid.Local, OnOutage: hybrid.FailClosed},
	}})
	mw := hybrid.Middleware(l, "login", byHeader)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	byHand := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hybrid.Admit(w, r, l, "login", r.Header.Get("X-Key")) {
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	for i := range 3 {
		a, b := serve(t, mw, "alice"), serve(t, byHand, "bob")
		for _, h := range []string{"RateLimit", "RateLimit-Policy", "Retry-After"} {
			if a.Header.Get(h) != b.Header.Get(h) {
				t.Errorf("request %d: %s %q by the middleware, %q by hand", i, h, a.Header.Get(h), b.Header.Get(h))
			}
		}
		if a.StatusCode != b.StatusCode {
			t.Errorf("request %d: %d by the middleware, %d by hand", i, a.StatusCode, b.StatusCode)
		}
		if want := []int{204, 204, 429}[i]; b.StatusCode != want {
			t.Errorf("request %d by hand: %d, want %d", i, b.StatusCode, want)
		}
	}
	// A limit it does not have: 503, no panic.
	rec := httptest.NewRecorder()
	if hybrid.Admit(rec, httptest.NewRequest(http.MethodPost, "/login", nil), l, "nope", "k") || rec.Code != http.StatusServiceUnavailable {
		t.Errorf("unknown limit: %d", rec.Code)
	}
}

// StatusHandler serves every limit's Status as JSON, in order.
func TestStatusHandler(t *testing.T) {
	l := newLimiter(t, hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: 10, Burst: 2, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
		{Name: "login", Rate: 1, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailClosed},
	}})
	rec := httptest.NewRecorder()
	hybrid.StatusHandler(l).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/limits", nil))
	var got []hybrid.Status
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("body %q, Content-Type %q: %v", rec.Body, rec.Header().Get("Content-Type"), err)
	}
	if len(got) != 2 || got[0].Name != "api" || got[1].Name != "login" || got[1].OnOutage != hybrid.FailClosed {
		t.Errorf("statuses %+v", got)
	}
}
