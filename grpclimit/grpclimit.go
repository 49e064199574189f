package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/hybridlimit/hybridlimit/hybrid"
)

// pushbackTrailer is the trailer in which a refused call states, in whole
// milliseconds, how long the client should wait before retrying; -1 means
// "do not retry". gRPC clients with a retry policy read it (gRFC A6), and
// grpc-go lets a server set it as ordinary metadata.
const pushbackTrailer = "grpc-retry-pushback-ms"

// longestWait is the longest wait a refusal states; a longer one is as good
// as hybrid.Never to a client (the HTTP middleware uses the same bound).
const longestWait = 24 * time.Hour

// KeyFunc returns the key a call is limited by: for example the caller's
// API key from the metadata, or its address. fullMethod is the method's full
// name, "/package.Service/Method". An empty key is handled as WithEmptyKey
// says. A KeyFunc is called once per call, concurrently.
type KeyFunc func(ctx context.Context, fullMethod string) string

// EmptyKey says what the interceptors do with a call whose key is empty:
// the same choices as the HTTP Middleware's, hybrid.EmptyKey. The zero value
// is EmptyKeyShared.
type EmptyKey = hybrid.EmptyKey

const (
	// EmptyKeyShared limits all calls without a key under one shared key,
	// the empty string: callers that cannot be told apart share one bucket,
	// so they can neither bypass the limit nor be turned away outright. It
	// is the default.
	EmptyKeyShared = hybrid.EmptyKeyShared
	// EmptyKeySkip admits calls without a key without taking a decision, so
	// a KeyFunc can leave calls unlimited by returning "". Beware of a
	// KeyFunc that returns "" for something a client controls (a missing
	// header): such clients are never limited.
	EmptyKeySkip = hybrid.EmptyKeySkip
	// EmptyKeyReject refuses calls without a key with codes.Unauthenticated,
	// without taking a decision.
	EmptyKeyReject = hybrid.EmptyKeyReject
)

// Option sets an optional behaviour of the interceptors.
type Option func(*options)

type options struct {
	also     []limitKey // WithLimit's, in order
	cost     func(ctx context.Context, fullMethod string) int
	skip     map[string]bool // full method names
	services []string        // prefixes "/package.Service/"
	emptyKey EmptyKey
	outage   time.Duration // retry delay of a fail-closed refusal
}

// WithCost sets the number of tokens a call takes: cost(ctx, fullMethod).
// Without it every call costs 1. A cost above the limit's burst is refused
// with codes.ResourceExhausted and no retry delay, since it can never be
// admitted; a cost below 1 is a server bug, answered with codes.Internal (use
// WithSkipMethods for calls that should be free). A nil cost means 1.
func WithCost(cost func(ctx context.Context, fullMethod string) int) Option {
	return func(o *options) { o.cost = cost }
}

// WithSkipMethods leaves the named methods unlimited: they reach the handler
// without a decision and without calling the KeyFunc. A name is either a full
// method name, "/package.Service/Method", or a whole service,
// "/package.Service/" (with the trailing slash), such as the health service
// "/grpc.health.v1.Health/". It panics if a name does not start with '/', as
// such a name could never match. Several WithSkipMethods add up.
func WithSkipMethods(names ...string) Option {
	for _, n := range names {
		if !strings.HasPrefix(n, "/") || n == "/" {
			panic(fmt.Sprintf("grpclimit: WithSkipMethods(%q): want a full method name \"/package.Service/Method\" or a service \"/package.Service/\"", n))
		}
	}
	return func(o *options) {
		for _, n := range names {
			if strings.HasSuffix(n, "/") {
				o.services = append(o.services, n)
				continue
			}
			if o.skip == nil {
				o.skip = make(map[string]bool)
			}
			o.skip[n] = true
		}
	}
}

// WithEmptyKey sets what the interceptors do with a call whose key is
// empty. Without it, EmptyKeyShared. It panics if e is none of the EmptyKey
// constants.
func WithEmptyKey(e EmptyKey) Option {
	if e < EmptyKeyShared || e > EmptyKeyReject {
		panic(fmt.Sprintf("grpclimit: WithEmptyKey(%v): want EmptyKeyShared, EmptyKeySkip or EmptyKeyReject", e))
	}
	return func(o *options) { o.emptyKey = e }
}

// WithOutageRetryAfter sets the retry delay stated with a call refused
// because Redis is unreachable and the limit fails closed (codes.Unavailable).
// Without it, hybrid.DefaultOutageRetryAfter (5s), as the HTTP Middleware
// states: gRPC retry policies commonly retry UNAVAILABLE, and a delay of a
// renewal tick would have clients hammer an outage. Zero or less states the
// limiter's own (its tick).
func WithOutageRetryAfter(d time.Duration) Option {
	return func(o *options) { o.outage = d }
}

// limitKey is one limit of an interceptor and the key it limits calls by.
type limitKey struct {
	limit string
	key   KeyFunc
}

// WithLimit limits each call under one more limit of the Limiter, keyed by
// key: a per-method limit beside a per-client one, say. An interceptor's
// limits (its own first, then WithLimit's in the order given) are charged
// all-or-none: each decides the call, and when any refuses it, those that
// admitted it get their tokens back (hybrid.Reservation.Cancel), so that a
// call turned away counts against none. The refusal is the first failure
// among them (an error, then a fail-closed outage), else the denial with
// the longest wait. The empty-key rule, the cost and the skipped methods
// apply to every limit. The interceptor panics if the Limiter has no limit
// of that name or key is nil.
func WithLimit(limit string, key KeyFunc) Option {
	return func(o *options) { o.also = append(o.also, limitKey{limit: limit, key: key}) }
}

// UnaryServerInterceptor returns a unary server interceptor that admits each
// call against limit of l, keyed by key, before calling the handler. A call
// that is not admitted fails as the package documentation describes, and the
// handler is not called. It panics if l or key is nil, or if l has no limit
// of that name (see hybrid.Middleware).
func UnaryServerInterceptor(l *hybrid.Limiter, limit string, key KeyFunc, opts ...Option) grpc.UnaryServerInterceptor {
	c := newChecker(l, limit, key, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		trailer, err := c.check(ctx, info.FullMethod)
		if err != nil {
			if trailer != nil {
				// Fails only outside a gRPC server (a test calling the
				// interceptor directly), where there is no one to tell.
				_ = grpc.SetTrailer(ctx, trailer)
			}
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor returns a stream server interceptor that admits
// each stream against limit of l, keyed by key, when it opens: the stream is
// one call of the given cost, whatever the number of messages on it. A stream
// that is not admitted fails as the package documentation describes, and the
// handler is not called. It panics if l or key is nil, or if l has no limit
// of that name (see hybrid.Middleware).
func StreamServerInterceptor(l *hybrid.Limiter, limit string, key KeyFunc, opts ...Option) grpc.StreamServerInterceptor {
	c := newChecker(l, limit, key, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		trailer, err := c.check(ss.Context(), info.FullMethod)
		if err != nil {
			if trailer != nil {
				ss.SetTrailer(trailer)
			}
			return err
		}
		return handler(srv, ss)
	}
}

// checker decides the calls of one interceptor. It is immutable, so safe for
// concurrent use.
type checker struct {
	l      *hybrid.Limiter
	limits []limitKey // the interceptor's, then WithLimit's
	options
}

func newChecker(l *hybrid.Limiter, limit string, key KeyFunc, opts []Option) *checker {
	if l == nil {
		panic("grpclimit: nil *hybrid.Limiter")
	}
	c := &checker{l: l, options: options{outage: hybrid.DefaultOutageRetryAfter}}
	for _, o := range opts {
		o(&c.options)
	}
	c.limits = append([]limitKey{{limit: limit, key: key}}, c.also...)
	for _, lk := range c.limits {
		if lk.key == nil {
			panic("grpclimit: nil KeyFunc")
		}
		if _, err := l.Quota(lk.limit); err != nil {
			panic("grpclimit: " + err.Error())
		}
	}
	return c
}

// check decides one call under every limit, all-or-none. It returns nil
// when the call may go on, or the error to answer with and the trailer to
// set (nil for none).
func (c *checker) check(ctx context.Context, fullMethod string) (metadata.MD, error) {
	if c.skipped(fullMethod) {
		return nil, nil
	}
	n := 1
	if c.cost != nil {
		n = c.cost(ctx, fullMethod)
	}
	if len(c.limits) == 1 {
		// Nothing to give back to: no reservation to allocate.
		_, md, err := c.reserve(ctx, fullMethod, c.limits[0], n, false)
		return md, err
	}
	var (
		taken   []*hybrid.Reservation
		trailer metadata.MD
		refused error
		worst   int           // of refused: see rank
		wait    time.Duration // of a denial refused
	)
	for _, lk := range c.limits {
		r, md, err := c.reserve(ctx, fullMethod, lk, n, true)
		if err == nil {
			if r != nil && r.Allowed {
				taken = append(taken, r)
			}
			continue
		}
		if k := rank(r); k > worst || (k == worst && r != nil && r.RetryAfter > wait) {
			trailer, refused, worst = md, err, k
			if r != nil {
				wait = r.RetryAfter
			}
		}
		if r == nil {
			break // not decided: the call is refused whatever the others say
		}
	}
	if refused != nil {
		give := context.WithoutCancel(ctx)
		for _, r := range taken {
			_ = r.Cancel(give) // a refund that fails leaves the tokens taken: safe
		}
	}
	return trailer, refused
}

// rank orders the refusals of one call, the one answered first: a limit
// that could not decide (r nil), then an outage, then a denial.
func rank(r *hybrid.Reservation) int {
	switch {
	case r == nil:
		return 3
	case r.Source == hybrid.SourceFailClosed:
		return 2
	}
	return 1
}

// reserve decides the call under lk, taking n tokens. It returns the
// reservation if refundable (nil if there was no decision) and, unless the
// call may go on, the trailer and the error to answer with.
func (c *checker) reserve(ctx context.Context, fullMethod string, lk limitKey, n int, refundable bool) (*hybrid.Reservation, metadata.MD, error) {
	key := lk.key(ctx, fullMethod)
	if key == "" {
		switch c.emptyKey {
		case EmptyKeyReject:
			return nil, nil, status.Error(codes.Unauthenticated, "grpclimit: no rate-limit key for this call")
		case EmptyKeySkip:
			return nil, nil, nil
		}
	}
	var r *hybrid.Reservation
	var d hybrid.Decision
	var err error
	if !refundable {
		d, err = c.l.AllowN(ctx, lk.limit, key, n)
	} else if r, err = c.l.Reserve(ctx, lk.limit, key, n); r != nil {
		d = r.Decision
	}
	if err == nil && d.Source == hybrid.SourceFailClosed && c.outage > 0 {
		d.RetryAfter = c.outage
	}
	md, err := refusal(lk.limit, n, d, err)
	return r, md, err
}

func (c *checker) skipped(fullMethod string) bool {
	if c.skip[fullMethod] {
		return true
	}
	for _, s := range c.services {
		if strings.HasPrefix(fullMethod, s) {
			return true
		}
	}
	return false
}

// refusal turns the outcome of a decision of n tokens under limit into the
// answer to a call: nil for an admission, otherwise the status error and the
// trailer to set (nil for none).
func refusal(limit string, n int, d hybrid.Decision, err error) (metadata.MD, error) {
	switch {
	case errors.Is(err, hybrid.ErrExceedsBurst):
		return pushback(hybrid.Never), status.Errorf(codes.ResourceExhausted,
			"grpclimit: rate limit %q: a call of cost %d exceeds its burst and can never be admitted", limit, n)
	case errors.Is(err, context.Canceled):
		return nil, status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return nil, status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, hybrid.ErrUnknownLimit), errors.Is(err, hybrid.ErrInvalidN):
		return nil, status.Errorf(codes.Internal, "grpclimit: rate limiter misconfigured: %v", err)
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "grpclimit: rate limiter unavailable: %v", err)
	case d.Allowed:
		return nil, nil
	case d.Source == hybrid.SourceFailClosed:
		return pushback(d.RetryAfter), withRetryInfo(status.Newf(codes.Unavailable,
			"grpclimit: rate limit %q is unavailable and fails closed", limit), d.RetryAfter).Err()
	}
	return pushback(d.RetryAfter), withRetryInfo(status.Newf(codes.ResourceExhausted,
		"grpclimit: rate limit %q exceeded", limit), d.RetryAfter).Err()
}

// withRetryInfo adds a RetryInfo detail of wait to st, unless waiting is
// pointless.
func withRetryInfo(st *status.Status, wait time.Duration) *status.Status {
	if wait > longestWait {
		return st
	}
	ds, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(max(0, wait))})
	if err != nil {
		// Only if the detail cannot be marshalled: the code says enough.
		return st
	}
	return ds
}

// pushback is the trailer stating wait in whole milliseconds, rounded up, or
// -1 (do not retry) when waiting is pointless.
func pushback(wait time.Duration) metadata.MD {
	ms := int64(-1)
	if wait <= longestWait {
		ms = int64((max(0, wait) + time.Millisecond - 1) / time.Millisecond)
	}
	return metadata.Pairs(pushbackTrailer, strconv.FormatInt(ms, 10))
}
