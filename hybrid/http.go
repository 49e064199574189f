package hybrid

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"math"
	"net/http"
	"strconv"
	"strings"
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
	// Shadow reports whether the limit is in shadow mode (Limit.Shadow): it
	// admits every request, so it advertises nothing to clients.
	Shadow bool
}

// Quota returns the policy the named limit advertises now. It is cheap
// enough to call on every request.
func (l *Limiter) Quota(limit string) (Quota, error) {
	ls := l.lookup(limit)
	if ls == nil {
		return Quota{}, l.unknown(limit)
	}
	return ls.quota(), nil
}

// quota is the policy ls advertises now.
func (ls *limitEntry) quota() Quota {
	q := Quota{Rate: ls.Rate, Burst: ls.Burst, Degraded: ls.degraded.Load(), Shadow: ls.Shadow}
	if q.Degraded && ls.OnOutage == FailLocal {
		s := ls.loc.Default()
		q.Rate, q.Burst = float64(s.Limit), s.Burst
	}
	return q
}

var (
	// ErrFailClosed is what a Middleware hands its error handler for a
	// request that the FailClosed policy rejected because Redis is
	// unreachable: an outage, which the default error handler answers 503
	// Service Unavailable, not a rate limit.
	ErrFailClosed = errors.New("hybrid: rejected by the FailClosed policy while Redis is unreachable")
	// ErrEmptyKey is what a Middleware with EmptyKeyReject hands its error
	// handler for a request whose key is empty.
	ErrEmptyKey = errors.New("hybrid: request has no rate-limit key")
)

// DefaultOutageRetryAfter is the Retry-After a Middleware gives a request
// that the FailClosed policy rejects while Redis is unreachable: long enough
// that clients do not hammer an outage, short enough that they come back
// soon after it ends. WithOutageRetryAfter changes it.
const DefaultOutageRetryAfter = 5 * time.Second

// EmptyKey says what a Middleware does with a request whose key function
// returns the empty string (an API key header the client left out, say).
type EmptyKey int

const (
	// EmptyKeyShared, the default, limits every request without a key in
	// one bucket that all of them share (the key ""). Leaving the key out
	// never escapes the limit, and never fails a request the limit would
	// admit: unidentified clients only compete with each other. Pair the
	// key with a fallback (KeyFirst with ClientIP) to give them a bucket
	// each.
	EmptyKeyShared EmptyKey = iota
	// EmptyKeySkip lets requests without a key through unlimited and
	// without RateLimit headers. Use it only when the key cannot be left
	// out by a client: an identity checked by an earlier handler, for
	// example, where an empty key means an internal call.
	EmptyKeySkip
	// EmptyKeyReject hands requests without a key to the error handler
	// with ErrEmptyKey; the default error handler answers 400 Bad Request.
	EmptyKeyReject
)

// String returns the choice's name.
func (e EmptyKey) String() string {
	switch e {
	case EmptyKeyShared:
		return "shared"
	case EmptyKeySkip:
		return "skip"
	case EmptyKeyReject:
		return "reject"
	}
	return fmt.Sprintf("EmptyKey(%d)", int(e))
}

// MiddlewareOption configures a Middleware. The options are WithLimit,
// WithCost, WithSkip, WithDenyHandler, WithErrorHandler,
// WithOutageRetryAfter and WithEmptyKey.
type MiddlewareOption func(*middleware)

// WithLimit limits each request under one more limit, keyed by key(r): a
// per-route limit beside a per-client one, say. A Middleware's limits (its
// own first, then WithLimit's in the order given) are charged all-or-none:
// each decides the request, and when any denies it (or fails closed, or
// cannot decide), those that admitted it get their tokens back (see
// Reservation.Cancel), so that a request turned away counts against none.
// The answer carries every limit's RateLimit members; a denial's
// Retry-After is the longest of the denials', and the deny handler gets
// that denial. The empty-key rule, the cost and the skip apply to every
// limit. Middleware panics if l has no limit of that name or key is nil.
func WithLimit(limit string, key func(*http.Request) string) MiddlewareOption {
	return func(m *middleware) { m.checks = append(m.checks, check{limit: limit, key: key}) }
}

// WithCost makes each request take cost(r) tokens instead of 1 (the size of
// an upload, the number of items of a batch). A cost above the limit's
// burst (in Local mode, above this instance's share of it) can never be
// admitted: it is a mistake in the costs, not a rate limit, handed to the
// error handler as ErrExceedsBurst, which by default answers 500 Internal
// Server Error with no Retry-After (a handler may answer 413 for a batch
// the client sized); the Limiter logs it once per limit and counts it
// under the outcome exceeds_burst. A cost below 1 is an error
// (ErrInvalidN) handed to the error handler: use WithSkip to let a
// request through free. Nil means 1.
func WithCost(cost func(*http.Request) int) MiddlewareOption {
	return func(m *middleware) { m.cost = cost }
}

// WithSkip lets the requests for which skip returns true through without a
// decision and without RateLimit headers: health checks, metrics scrapes.
// skip runs before the key function. Nil means no request is skipped.
func WithSkip(skip func(*http.Request) bool) MiddlewareOption {
	return func(m *middleware) { m.skip = skip }
}

// WithDenyHandler makes h answer the requests that the limit denies. When h
// is called, the RateLimit fields and Retry-After are already set on w's
// header (see WriteHeaders); h writes the status and the body, and may
// change the headers. d is the denial. The default answers 429 Too Many
// Requests with a short text body. Rejections by the FailClosed policy go
// to the error handler, not to h. Nil means the default.
func WithDenyHandler(h func(w http.ResponseWriter, r *http.Request, d Decision)) MiddlewareOption {
	return func(m *middleware) { m.deny = h }
}

// WithErrorHandler makes h answer the requests the limiter could not
// decide: err is ErrClosed after Close, ErrUnknownLimit, ErrInvalidN for a
// cost below 1, the request context's error during a Global decision,
// ErrFailClosed for a rejection by the FailClosed policy during an outage
// (Retry-After and the RateLimit-Policy field are then already set), or
// ErrEmptyKey under EmptyKeyReject; test with errors.Is. The default
// answers 400 Bad Request for ErrEmptyKey and 503 Service Unavailable for
// everything else, with a short text body that never carries err (which
// may name the limit). Nil means the default.
func WithErrorHandler(h func(w http.ResponseWriter, r *http.Request, err error)) MiddlewareOption {
	return func(m *middleware) { m.fail = h }
}

// WithOutageRetryAfter sets the Retry-After of requests that the
// FailClosed policy rejects while Redis is unreachable, rounded up to whole
// seconds. Zero or less means no Retry-After. The default is
// DefaultOutageRetryAfter.
func WithOutageRetryAfter(d time.Duration) MiddlewareOption {
	return func(m *middleware) { m.outageRetryAfter = d }
}

// WithEmptyKey says what happens to requests whose key is empty. The
// default is EmptyKeyShared.
func WithEmptyKey(e EmptyKey) MiddlewareOption {
	return func(m *middleware) { m.emptyKey = e }
}

// check is one limit of a Middleware and the key it limits a request by.
type check struct {
	limit string
	key   func(*http.Request) string
}

// middleware is one Middleware's configuration, fixed once built.
type middleware struct {
	l                *Limiter
	checks           []check // the Middleware's limit, then WithLimit's
	cost             func(*http.Request) int
	skip             func(*http.Request) bool
	deny             func(http.ResponseWriter, *http.Request, Decision)
	fail             func(http.ResponseWriter, *http.Request, error)
	outageRetryAfter time.Duration
	emptyKey         EmptyKey
}

// Middleware returns net/http middleware that admits each request against
// limit, keyed by key(r): a client's API key, its address behind trusted
// proxies (ClientIP), a route (KeyRoute), or several of them (KeyFirst,
// KeyJoin). It panics if l or key is nil, or if l has no limit of that
// name, in the way regexp.MustCompile does: a misspelled limit is a
// mistake in the program or its configuration, found where the handler is
// built, not a 503 on every request. A limit that a later SetLimits
// removes is answered as below, as a Limiter that cannot decide.
//
// Every decided request gets the IETF RateLimit-Policy and RateLimit
// header fields (draft-ietf-httpapi-ratelimit-headers), written by
// WriteHeaders: the policy names the limit, its quota q and window w in
// seconds; RateLimit gives the remaining tokens r and the seconds t until
// the bucket is full again. While the limit is degraded under FailLocal the
// policy advertises the reduced local quota. Both fields are lists: when
// several Middlewares limit one route, every limit that decided appears as
// one member of each field, outermost first. Chained Middlewares decide in
// turn, outermost first, so a request that an inner limit denies has taken
// its tokens from the outer ones: give one Middleware several limits
// (WithLimit) to charge them all-or-none.
//
// An admitted request goes to next. A denied request gets 429 Too Many
// Requests (WithDenyHandler changes the answer) with Retry-After in whole
// seconds, and next is not called.
//
// A request that the FailClosed policy rejects while Redis is unreachable
// is an outage, not a rate limit: it gets 503 Service Unavailable with
// Retry-After: 5 (WithOutageRetryAfter; WithErrorHandler with
// ErrFailClosed changes the answer), and no RateLimit member, since nothing
// is known of the quota until Redis answers again. A 429 with Retry-After:
// 1 would have clients retry every second against the outage.
//
// If the limiter cannot decide (it is closed, the limit was removed, the
// cost is below 1) the request gets 503 Service Unavailable; a cost above
// the burst gets 500 (see WithCost). WithErrorHandler changes the answers;
// next is not called.
//
// A limit in shadow mode (Limit.Shadow) admits every request and writes no
// header: clients must not slow down for a limit that is only watched.
//
// A request whose key is empty is limited with every other such request
// in one shared bucket, unless WithEmptyKey says otherwise. WithCost sets
// the tokens a request takes; WithSkip exempts requests such as health
// checks.
func Middleware(l *Limiter, limit string, key func(*http.Request) string, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	if l == nil {
		panic("hybrid: Middleware needs a Limiter and a key function")
	}
	m := newMiddleware(l, limit, key, opts)
	for _, c := range m.checks {
		if c.key == nil {
			panic("hybrid: Middleware needs a Limiter and a key function")
		}
		if _, err := l.Quota(c.limit); err != nil {
			panic("hybrid.Middleware: " + err.Error())
		}
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if m.admit(w, r) {
				next.ServeHTTP(w, r)
			}
		})
	}
}

// Admit decides r, whose key is key, under limit, and answers it the way
// Middleware does, for a handler that limits by hand (a key read from the
// request's body, say): it writes the RateLimit headers and, when the
// request is not admitted, the whole answer (429 with Retry-After, 503 for
// an outage, the error handler's), and reports whether the handler should
// go on. opts are Middleware's, WithLimit included: the limits are charged
// all-or-none. Unlike Middleware, it does not panic on a limit the Limiter
// does not have: that request gets 503, as after SetLimits removed the
// limit.
func Admit(w http.ResponseWriter, r *http.Request, l *Limiter, limit, key string, opts ...MiddlewareOption) bool {
	return newMiddleware(l, limit, func(*http.Request) string { return key }, opts).admit(w, r)
}

// newMiddleware is the configuration of a Middleware or an Admit.
func newMiddleware(l *Limiter, limit string, key func(*http.Request) string, opts []MiddlewareOption) *middleware {
	m := &middleware{l: l, checks: []check{{limit: limit, key: key}}, outageRetryAfter: DefaultOutageRetryAfter}
	for _, o := range opts {
		o(m)
	}
	if m.deny == nil {
		m.deny = denyTooManyRequests
	}
	if m.fail == nil {
		m.fail = failUnavailable
	}
	return m
}

// admit decides r under each of the middleware's limits and answers it
// unless every one admits it (or it is skipped): it reports whether the
// handler should go on. A request turned away gets back the tokens of the
// limits that admitted it.
func (m *middleware) admit(w http.ResponseWriter, r *http.Request) bool {
	if m.skip != nil && m.skip(r) {
		return true
	}
	n := 1
	if m.cost != nil {
		n = m.cost(r)
	}
	var one [1]Reservation
	rs := one[:0]
	if len(m.checks) > 1 {
		rs = make([]Reservation, 0, len(m.checks))
	}
	var failed error
	for i := range m.checks {
		rs = rs[:len(rs)+1]
		if failed = m.reserve(r, &m.checks[i], n, &rs[len(rs)-1]); failed != nil {
			rs = rs[:len(rs)-1]
			break
		}
		if rs[len(rs)-1].ls == nil {
			rs = rs[:len(rs)-1] // no key: EmptyKeySkip
		}
	}
	turned := failed != nil
	for i := range rs {
		turned = turned || !rs[i].Allowed
	}
	if turned {
		refund(r, rs, n)
	}
	if failed != nil {
		m.fail(w, r, failed)
		return false
	}
	return m.answer(w, r, rs)
}

// reserve decides r under c, taking n tokens, into *rv; it leaves rv.ls
// nil for a request without a key that EmptyKeySkip lets through, and
// returns the error a request gets that c cannot decide.
func (m *middleware) reserve(r *http.Request, c *check, n int, rv *Reservation) error {
	key := c.key(r)
	if key == "" {
		switch m.emptyKey {
		case EmptyKeySkip:
			return nil
		case EmptyKeyReject:
			return fmt.Errorf("%w: limit %q", ErrEmptyKey, c.limit)
		}
	}
	// One lookup: the decision and the headers are of the same limit, even
	// while SetLimits changes it.
	ls, err := m.l.entry(c.limit)
	if err != nil {
		return err
	}
	rv.l, rv.ls, rv.key, rv.n = m.l, ls, heldKey(key), n
	if len(m.checks) == 1 {
		// Nothing to give back to: the request is turned away only by
		// this limit's own denial.
		return m.l.decide(r.Context(), ls, key, n, &rv.Decision, nil)
	}
	rv.at = time.Now()
	return m.l.decide(r.Context(), ls, key, n, &rv.Decision, &rv.at)
}

// refund cancels the reservations rs of n tokens that admitted a request
// that is turned away, even if its client is gone, and shows the tokens
// given back in what each says is left.
func refund(r *http.Request, rs []Reservation, n int) {
	ctx := context.WithoutCancel(r.Context())
	for i := range rs {
		if rs[i].Allowed && !rs[i].Shadowed && rs[i].Cancel(ctx) == nil {
			rs[i].Remaining += int64(n)
		}
	}
}

// answer writes every limit's RateLimit members for the decisions rs and,
// unless all of them admit the request, the answer: 503 for an outage (a
// FailClosed rejection), else the deny handler's for the denial with the
// longest wait. It reports whether the handler should go on.
func (m *middleware) answer(w http.ResponseWriter, r *http.Request, rs []Reservation) bool {
	var denial, outage *Reservation
	for i := range rs {
		d := &rs[i]
		if q := d.ls.quota(); !q.Shadow {
			WriteHeaders(w.Header(), d.ls.Name, q, d.Decision)
		}
		switch {
		case d.Allowed:
		case d.Source == SourceFailClosed:
			outage = cmp.Or(outage, d)
		case denial == nil || d.RetryAfter > denial.RetryAfter:
			denial = d
		}
	}
	switch {
	case outage != nil:
		if m.outageRetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(m.outageRetryAfter, 1), 10))
		}
		m.fail(w, r, fmt.Errorf("%w: limit %q", ErrFailClosed, outage.ls.Name))
	case denial != nil:
		m.deny(w, r, denial.Decision)
	default:
		return true
	}
	return false
}

func denyTooManyRequests(w http.ResponseWriter, _ *http.Request, _ Decision) {
	http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
}

func failUnavailable(w http.ResponseWriter, _ *http.Request, err error) {
	switch {
	case errors.Is(err, ErrEmptyKey):
		http.Error(w, "rate limit key missing", http.StatusBadRequest)
		return
	case errors.Is(err, ErrExceedsBurst):
		http.Error(w, "request costs more than the rate limit can ever admit", http.StatusInternalServerError)
		return
	}
	http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
}

// WriteHeaders writes the IETF RateLimit header fields of decision d of
// the named limit, whose policy is q (Limiter.Quota), to h. Middleware
// calls it for every decision; a handler that calls AllowN itself calls it
// to answer with the same fields.
//
// RateLimit-Policy gets the member "limit";q=Q;w=W: a token bucket of rate
// r and burst b is advertised as a quota Q = max(b, r·W) per window W =
// max(1, b/r) seconds. RateLimit gets the member "limit";r=R;t=T: R tokens
// remain (the whole quota for a FailOpen decision) and the bucket is full
// again in T seconds. A decision of the FailClosed policy gets no RateLimit
// member: nothing is known of the quota while Redis is unreachable.
//
// Both fields are Structured Field Lists (RFC 9651) whose members are the
// policies that apply. WriteHeaders keeps the members of other limits
// already in h (an outer Middleware's, or an earlier call's), replaces a
// member of the same limit, and writes each field as one comma-separated
// line, which list parsers and clients that read only the first line (Go's
// Header.Get) both read whole. The limit's name is a Structured Field
// String: bytes outside printable ASCII are written as %xx.
//
// A denial that waiting can end also gets Retry-After in whole seconds (at
// least 1), or keeps the one already in h if that is longer. A denial that
// waiting cannot end (RetryAfter Never) and a FailClosed decision get none.
func WriteHeaders(h http.Header, limit string, q Quota, d Decision) {
	window := int64(1)
	if q.Rate > 0 {
		window = max(1, int64(math.Round(float64(q.Burst)/q.Rate)))
	}
	quota := max(int64(q.Burst), int64(math.Ceil(q.Rate*float64(window))))
	name := sfString(limit)
	mergeMember(h, "RateLimit-Policy", name, fmt.Sprintf("%s;q=%d;w=%d", name, quota, window))
	if d.Source == SourceFailClosed {
		mergeMember(h, "RateLimit", name, "")
		return
	}
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
	mergeMember(h, "RateLimit", name, fmt.Sprintf("%s;r=%d;t=%d", name, remaining, reset))
	if !d.Allowed && d.RetryAfter != Never && d.RetryAfter <= longestWait {
		after := ceilSeconds(d.RetryAfter, 1)
		if old, err := strconv.ParseInt(h.Get("Retry-After"), 10, 64); err == nil && old > after {
			return
		}
		h.Set("Retry-After", strconv.FormatInt(after, 10))
	}
}

// mergeMember sets the member of the list field whose name (a serialized
// Structured Field String) is name to member, keeping every other member of
// every line of the field in order, and writes the list as one line. An
// empty member removes the named one.
func mergeMember(h http.Header, field, name, member string) {
	var members []string
	for _, line := range h.Values(field) {
		for m := range splitList(line) {
			if m != "" && !namesMember(m, name) {
				members = append(members, m)
			}
		}
	}
	if member != "" {
		members = append(members, member)
	}
	if len(members) == 0 {
		h.Del(field)
		return
	}
	h.Set(field, strings.Join(members, ", "))
}

// namesMember reports whether the list member m names name: it starts with
// name and then ends or goes on with its parameters.
func namesMember(m, name string) bool {
	rest, ok := strings.CutPrefix(m, name)
	return ok && (rest == "" || rest[0] == ';')
}

// splitList yields the members of a list field line, split at the commas
// outside quoted strings, without surrounding spaces.
func splitList(line string) iter.Seq[string] {
	return func(yield func(string) bool) {
		start, quoted := 0, false
		for i := 0; i < len(line); i++ {
			switch c := line[i]; {
			case quoted && c == '\\':
				i++
			case c == '"':
				quoted = !quoted
			case c == ',' && !quoted:
				if !yield(strings.TrimSpace(line[start:i])) {
					return
				}
				start = i + 1
			}
		}
		yield(strings.TrimSpace(line[start:]))
	}
}

// sfString serializes s as a Structured Field String (RFC 9651 section
// 4.1.6), which holds printable ASCII only: '"' and '\' are escaped, and
// every other byte outside printable ASCII is written as %xx.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			fmt.Fprintf(&b, "%%%02x", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
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

// StatusHandler returns an http.Handler that serves the Status of every
// limit of l, in the order of Limits, as a JSON array (Content-Type
// application/json): for an operator's status page or a health check. Mount
// it where only operators reach it; it says nothing about any key.
func StatusHandler(l *Limiter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limits := l.Limits()
		out := make([]Status, 0, len(limits))
		for _, lim := range limits {
			if st, err := l.Status(lim.Name); err == nil { // removed since Limits
				out = append(out, st)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(out); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
}
