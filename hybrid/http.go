package hybrid

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// Quota is the policy a limit advertises to clients.
type Quota struct {
	// Rate and Burst are the limit as a client experiences it: the global
	// limit normally; this instance's local share (rate/N) while the limit
	// is degraded under FailLocal.
	Rate  float64
	Burst int
	// Degraded reports whether Redis is unreachable and the limit follows
	// its OnOutage policy.
	Degraded bool
}

// Quota returns the policy the named limit advertises now. It is cheap
// enough to call on every request.
func (l *Limiter) Quota(limit string) (Quota, error) {
	ls := l.limits[limit]
	if ls == nil {
		return Quota{}, fmt.Errorf("%w %q", ErrUnknownLimit, limit)
	}
	q := Quota{Rate: ls.Rate, Burst: ls.Burst, Degraded: ls.degraded.Load()}
	if q.Degraded && ls.OnOutage == FailLocal {
		s := ls.loc.Default()
		q.Rate, q.Burst = float64(s.Limit), s.Burst
	}
	return q, nil
}

// Middleware returns net/http middleware that admits each request against
// limit, keyed by key(r) (for example the client's API key or address).
//
// Every response carries the IETF RateLimit-Policy and RateLimit header
// fields (draft-ietf-httpapi-ratelimit-headers): the policy names the limit,
// its quota q and window w in seconds; RateLimit gives the remaining tokens
// r and the seconds t until the bucket is full again. While the limit is
// degraded under FailLocal the policy advertises the reduced local quota. A
// denied request gets 429 Too Many Requests with Retry-After in whole
// seconds. If the limiter cannot decide (it is closed, or limit is unknown)
// the request gets 503 Service Unavailable and next is not called.
//
// A request that the FailClosed policy rejects while Redis is unreachable
// is an outage, not a rate limit: it gets 503 Service Unavailable with
// Retry-After: 5 (DefaultOutageRetryAfter), and no RateLimit field, since
// nothing is known of the quota until Redis answers again. A 429 with
// Retry-After: 1 would have clients retry every second against the outage.
func Middleware(l *Limiter, limit string, key func(*http.Request) string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, err := l.Allow(r.Context(), limit, key(r))
			if err != nil && !errors.Is(err, ErrExceedsBurst) {
				http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
				return
			}
			q, err := l.Quota(limit)
			if err != nil {
				http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
				return
			}
			setHeaders(w.Header(), limit, q, d)
			if !d.Allowed && d.Source == SourceFailClosed {
				w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(DefaultOutageRetryAfter, 1), 10))
				http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
				return
			}
			if !d.Allowed {
				w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(d.RetryAfter, 1), 10))
				http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// DefaultOutageRetryAfter is the Retry-After a Middleware gives a request
// that the FailClosed policy rejects while Redis is unreachable: long enough
// that clients do not hammer an outage, short enough that they come back
// soon after it ends.
const DefaultOutageRetryAfter = 5 * time.Second

// setHeaders writes the RateLimit-Policy and RateLimit fields of one
// decision. A token bucket of rate r and burst b is advertised as a quota of
// max(b, r·w) units per window w = max(1, b/r) seconds.
func setHeaders(h http.Header, limit string, q Quota, d Decision) {
	window := int64(1)
	if q.Rate > 0 {
		window = max(1, int64(math.Round(float64(q.Burst)/q.Rate)))
	}
	quota := max(int64(q.Burst), int64(math.Ceil(q.Rate*float64(window))))
	name := strconv.Quote(limit)
	h.Set("RateLimit-Policy", fmt.Sprintf("%s;q=%d;w=%d", name, quota, window))
	remaining := max(0, min(d.Remaining, quota))
	if d.Source == SourceFailOpen {
		remaining = quota
	}
	reset := int64(0)
	switch {
	case !d.Allowed:
		reset = ceilSeconds(d.RetryAfter, window)
	case q.Rate > 0 && remaining < int64(q.Burst):
		reset = ceilSeconds(time.Duration(float64(int64(q.Burst)-remaining)/q.Rate*float64(time.Second)), window)
	}
	if d.Source == SourceFailClosed {
		return
	}
	h.Set("RateLimit", fmt.Sprintf("%s;r=%d;t=%d", name, remaining, reset))
}

// longestWait is the longest wait the headers state; a longer one is as
// good as Never to a client.
const longestWait = 24 * time.Hour

// ceilSeconds rounds d up to whole seconds, at least 1, and Never (or any
// duration past longestWait) to fallback.
func ceilSeconds(d time.Duration, fallback int64) int64 {
	if d <= 0 {
		return 1
	}
	if d == Never || d > longestWait {
		return fallback
	}
	return max(1, int64(math.Ceil(d.Seconds())))
}
