package hybrid

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/membership"
)

// Sentinel errors. Errors returned by this package wrap one of them.
var (
	// ErrConfig is wrapped by every error New returns for a bad Config.
	ErrConfig = errors.New("hybrid: invalid config")
	// ErrClosed is returned by decisions made after Close.
	ErrClosed = errors.New("hybrid: limiter closed")
	// ErrUnknownLimit is returned for a limit name the Limiter was not
	// configured with.
	ErrUnknownLimit = errors.New("hybrid: unknown limit")
	// ErrInvalidN is returned when n is below 1.
	ErrInvalidN = errors.New("hybrid: n must be at least 1")
	// ErrExceedsBurst is returned, with a denial, when n exceeds the limit's
	// burst: such a request can never be admitted.
	ErrExceedsBurst = errors.New("hybrid: n exceeds burst and can never be admitted")
)

// Never is the RetryAfter of a denial that no amount of waiting can turn
// into an admission.
const Never = time.Duration(math.MaxInt64)

// Mode says how a limit decides. The zero value is unset and rejected by New.
type Mode int

const (
	// ModeUnset is the zero Mode; New rejects it.
	ModeUnset Mode = iota
	// Local decides at rate/N per instance with no Redis at all: right only
	// when traffic is balanced and N is right.
	Local
	// Global runs one atomic token-bucket script in Redis per decision:
	// exact, one round trip per decision.
	Global
	// Hybrid decides in process at a share leased from Redis: bounded
	// accuracy, one pipeline per instance per renewal tick for all keys.
	Hybrid
)

// String returns the mode's name: local, global or hybrid.
func (m Mode) String() string {
	switch m {
	case Local:
		return "local"
	case Global:
		return "global"
	case Hybrid:
		return "hybrid"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Policy says what a limit does while Redis cannot be reached. The zero
// value is unset and rejected by New: the choice must be explicit.
type Policy int

const (
	// PolicyUnset is the zero Policy; New rejects it.
	PolicyUnset Policy = iota
	// FailLocal admits at most rate/N per instance, with N the largest
	// instance count seen within Config.PeakWindow (less the instances
	// that left gracefully since).
	FailLocal
	// FailOpen admits every request.
	FailOpen
	// FailClosed rejects every request.
	FailClosed
)

// String returns the policy's name: fail-local, fail-open or fail-closed.
func (p Policy) String() string {
	switch p {
	case FailLocal:
		return "fail-local"
	case FailOpen:
		return "fail-open"
	case FailClosed:
		return "fail-closed"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// Source says what made a decision.
type Source int

const (
	// SourceLease: the key's leased share of a Hybrid limit, or a few
	// tokens Redis handed a key decided exactly ahead of its next requests
	// here (credit; Status.LeasedKeys does not count such a key).
	SourceLease Source = iota + 1
	// SourceLocal: the local quota, rate/N (Local mode, or the FailLocal
	// policy).
	SourceLocal
	// SourceGlobal: the token bucket of a Global limit in Redis, one
	// script for the decision.
	SourceGlobal
	// SourceExact: the pool in Redis of a Hybrid key decided exactly (its
	// first decisions here, thin keys, keys sprayed near their limit, a
	// cost its lease cannot hold), one script for the decision, or a
	// denial held in process until the turn Redis gave.
	SourceExact
	// SourceFailOpen: the FailOpen policy, Redis being unreachable.
	SourceFailOpen
	// SourceFailClosed: the FailClosed policy, Redis being unreachable.
	SourceFailClosed
)

const numSources = int(SourceFailClosed) + 1

// String returns the source's name, as the metrics' source label has it:
// lease, local, global, exact, fail_open or fail_closed.
func (s Source) String() string {
	switch s {
	case SourceLease:
		return "lease"
	case SourceLocal:
		return "local"
	case SourceGlobal:
		return "global"
	case SourceExact:
		return "exact"
	case SourceFailOpen:
		return "fail_open"
	case SourceFailClosed:
		return "fail_closed"
	}
	return fmt.Sprintf("Source(%d)", int(s))
}

// Decision is the outcome of one decision. A denial is a Decision, not an
// error.
type Decision struct {
	// Allowed reports whether the request is admitted.
	Allowed bool
	// Remaining is the number of whole tokens the client has left, as
	// this instance knows them: in a Global limit's bucket, or a Hybrid
	// key's pool in Redis (with the tokens taken ahead for the key's next
	// requests here) when decided exactly, what the limit as a whole would
	// admit now, less what other instances hold of it (leases, tokens taken
	// ahead for their next requests); on a
	// lease, what the lease here holds; in Local mode, this instance's
	// quota. The last two are lower bounds for a client whose requests
	// stay on this instance.
	Remaining int64
	// RetryAfter is how long to wait before the same request could be
	// admitted; 0 when Allowed, Never when it never can. An exact denial
	// says when the key's pool in Redis would hold the tokens; the
	// instances that ask for the same tokens are then given turns, and an
	// instance whose turn is later tells its next requests when it comes
	// (at most N-hat-1 refills later): it does not ask Redis before. A
	// lease's denial says when the lease would hold them; a Local limit's,
	// when this instance's quota would.
	RetryAfter time.Duration
	// Source says what decided.
	Source Source
	// Shadowed reports that the limit is in shadow mode (Limit.Shadow) and
	// denied this request: Allowed is true only because a limit in shadow
	// mode admits every request. Source and Remaining are those of the
	// denial, RetryAfter is 0. False for every admission a limit would have
	// made anyway, and for every decision of a limit not in shadow mode.
	Shadowed bool
}

// Limit describes one named limit.
type Limit struct {
	// Name identifies the limit in calls, Redis keys and metrics. Required:
	// valid UTF-8 without ':', '{' or '}'.
	Name string
	// Rate is the global rate in tokens per second, across all instances.
	// It must be positive and finite.
	Rate float64
	// Burst is the global burst in tokens. It must be at least 1.
	Burst int
	// Mode says how the limit decides. Required.
	Mode Mode
	// OnOutage says what the limit does while Redis cannot be reached.
	// Required, also for Local limits (which never need Redis), so that
	// switching a limit's mode never silently picks a policy.
	OnOutage Policy
	// Shadow puts the limit in shadow mode (Envoy's shadow_mode): every
	// request is decided, counted in the metrics and logged as usual, with
	// the outcome the limit decided, and then admitted. A decision the
	// limit denied comes back with Allowed and Shadowed true. Use it to
	// watch what a new or changed limit would do before enforcing it. False,
	// the zero value, enforces the limit.
	Shadow bool `json:",omitempty"`
}

// Config configures a Limiter. Every field says what its zero value means.
type Config struct {
	// Redis is the client for Global and Hybrid limits: any
	// redis.UniversalClient (single node, Sentinel or Cluster) will do. It
	// may be nil only if every limit is Local (and stays so). The Limiter
	// does not close it. When a call ends at its deadline and the Limiter
	// logs an outage, it dials the client's address once more with the
	// client's own dialer (for a *redis.Client, Sentinel's included, and a
	// *redis.ClusterClient) so that the log line names the cause the
	// deadline hid: connection refused, no such host, a certificate the
	// client rejects.
	Redis global.Rediser
	// Members reports the live instance count N and this instance's name.
	// Nil means a single instance (membership.NewStatic with a random
	// name). Any Counter works: Hybrid placement needs no messages between
	// instances. If it implements io.Closer, Close closes it (leaving the
	// cluster), after the Limiter has stopped deciding and released its
	// records. If it is a membership.Roster (membership.Memberlist and
	// membership.Static are), an instance that leaves gracefully stops
	// counting in N-hat at once (see PeakWindow and Limiter.Close), and the
	// instances rank themselves by their names, so that the local quotas
	// (Local mode, FailLocal) hand out the burst's remainder by rank and
	// sum to exactly each limit's burst; without one, each instance's
	// quota burst is burst/N rounded down.
	Members membership.Counter
	// Limits are the limits the Limiter starts with, with unique names. At
	// least one is required. Limiter.SetLimits replaces them while it runs.
	Limits []Limit
	// Prefix starts every Redis key. Empty means "hybridlimit".
	Prefix string
	// Tick is the lease loop's period. Zero means 50ms.
	Tick time.Duration
	// ContendedTTL is the lifetime of a new lease, and of one whose share
	// still moves; a lease renews at half its lifetime. Zero means 600ms.
	ContendedTTL time.Duration
	// UncontendedTTL is the longest lease: an uncontended lease's lifetime
	// from its first renewal, and the one a settled contended lease grows
	// to (see package hybrid/placement). A leased key without decisions for
	// half of it goes back to exact decisions and releases its lease. Zero
	// means 5s.
	UncontendedTTL time.Duration
	// RedisTimeout bounds every call to Redis. Zero means a quarter of
	// ContendedTTL. It must be below ContendedTTL.
	RedisTimeout time.Duration
	// IdleAfter is how long a key may go without decisions before it is
	// evicted: forgotten, its memory given back. It does not end leases: a
	// leased key idle for half UncontendedTTL goes back to exact decisions
	// and releases its lease (see UncontendedTTL), and no key is evicted
	// while a grant is in force on it. A key evicted while it asked for a
	// lease releases the record its ask left. Zero means 30s.
	IdleAfter time.Duration
	// PeakWindow is how long an instance count is remembered. The local
	// quotas (Local mode, FailLocal) and the fair shares of Hybrid leases
	// use N-hat, the largest count seen within PeakWindow, so that an
	// instance that seems to fail (a crash, a false verdict of failure
	// detection, a gossip partition) stays counted for PeakWindow: it may
	// still be deciding. An instance that leaves gracefully (its Limiter
	// closed, then its Members, see Limiter.Close) is dropped from N-hat
	// at once when Members is a membership.Roster. Zero means 1 minute.
	PeakWindow time.Duration
	// Registerer receives the metrics. Nil means no metrics are registered.
	Registerer prometheus.Registerer
	// Logger receives one line per state change. Nil means no logging.
	Logger *slog.Logger
}

// DefaultConfig returns a Config with the default timings and the given
// Redis client, membership and limits.
func DefaultConfig(rdb global.Rediser, members membership.Counter, limits ...Limit) Config {
	return Config{
		Redis:          rdb,
		Members:        members,
		Limits:         limits,
		Prefix:         "hybridlimit",
		Tick:           50 * time.Millisecond,
		ContendedTTL:   600 * time.Millisecond,
		UncontendedTTL: 5 * time.Second,
		RedisTimeout:   150 * time.Millisecond,
		IdleAfter:      30 * time.Second,
		PeakWindow:     time.Minute,
	}
}

// withDefaults fills the zero fields of c.
func (c Config) withDefaults() Config {
	d := DefaultConfig(nil, nil)
	if c.Prefix == "" {
		c.Prefix = d.Prefix
	}
	if c.Tick == 0 {
		c.Tick = d.Tick
	}
	if c.ContendedTTL == 0 {
		c.ContendedTTL = d.ContendedTTL
	}
	if c.UncontendedTTL == 0 {
		c.UncontendedTTL = d.UncontendedTTL
	}
	if c.RedisTimeout == 0 {
		c.RedisTimeout = c.ContendedTTL / 4
	}
	if c.IdleAfter == 0 {
		c.IdleAfter = d.IdleAfter
	}
	if c.PeakWindow == 0 {
		c.PeakWindow = d.PeakWindow
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Members == nil {
		c.Members = membership.NewStatic("", 1)
	}
	return c
}

// validate reports the first problem with c, which has its defaults filled.
func (c Config) validate() error {
	if err := c.validateTimings(); err != nil {
		return err
	}
	return validateLimits(c.Limits, c.Redis != nil)
}

// validateLimits reports the first problem with limits, to be run with a
// Redis client if haveRedis.
func validateLimits(limits []Limit, haveRedis bool) error {
	if len(limits) == 0 {
		return fmt.Errorf("%w: no limits: give at least one Limit", ErrConfig)
	}
	seen := make(map[string]bool, len(limits))
	needRedis := false
	for i, l := range limits {
		if err := l.validate(i); err != nil {
			return err
		}
		if seen[l.Name] {
			return fmt.Errorf("%w: limit %q is defined twice: give each limit a unique Name", ErrConfig, l.Name)
		}
		seen[l.Name] = true
		needRedis = needRedis || l.Mode != Local
	}
	if needRedis && !haveRedis {
		return fmt.Errorf("%w: Redis is nil but some limits are Global or Hybrid: give a Redis client, or make every limit Local", ErrConfig)
	}
	return nil
}

// validateTimings reports the first problem with c's durations.
func (c Config) validateTimings() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Tick", c.Tick}, {"ContendedTTL", c.ContendedTTL}, {"UncontendedTTL", c.UncontendedTTL},
		{"RedisTimeout", c.RedisTimeout}, {"IdleAfter", c.IdleAfter}, {"PeakWindow", c.PeakWindow}} {
		if d.v < 0 {
			return fmt.Errorf("%w: %s is %v: use a positive duration, or 0 for the default", ErrConfig, d.name, d.v)
		}
	}
	if c.RedisTimeout >= c.ContendedTTL {
		return fmt.Errorf("%w: RedisTimeout %v must be below ContendedTTL %v, so a slow Redis cannot outlast a lease", ErrConfig, c.RedisTimeout, c.ContendedTTL)
	}
	if c.ContendedTTL <= 2*c.Tick {
		return fmt.Errorf("%w: ContendedTTL %v must be more than two ticks (Tick %v) so leases renew before they end", ErrConfig, c.ContendedTTL, c.Tick)
	}
	if c.UncontendedTTL < c.ContendedTTL {
		return fmt.Errorf("%w: UncontendedTTL %v must not be below ContendedTTL %v", ErrConfig, c.UncontendedTTL, c.ContendedTTL)
	}
	return nil
}

// validate reports the first problem with l, the i-th limit of a Config.
func (l Limit) validate(i int) error {
	if l.Name == "" {
		return fmt.Errorf("%w: limit #%d has no Name", ErrConfig, i)
	}
	if !utf8.ValidString(l.Name) || strings.ContainsAny(l.Name, ":{}") {
		// In a Redis key "<prefix>:{<limit>:<key>}" a ':' would let two
		// (limit, key) pairs share one key, and a brace would move the
		// hash tag; a metric label must be UTF-8.
		return fmt.Errorf("%w: limit name %q must be valid UTF-8 without ':', '{' or '}'", ErrConfig, l.Name)
	}
	if math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0) || l.Rate <= 0 {
		return fmt.Errorf("%w: limit %q: Rate %v must be a positive, finite number of tokens per second", ErrConfig, l.Name, l.Rate)
	}
	if l.Burst < 1 {
		return fmt.Errorf("%w: limit %q: Burst %d must be at least 1", ErrConfig, l.Name, l.Burst)
	}
	switch l.Mode {
	case Local, Global, Hybrid:
	case ModeUnset:
		return fmt.Errorf("%w: limit %q: Mode is unset: choose hybrid.Local, hybrid.Global or hybrid.Hybrid", ErrConfig, l.Name)
	default:
		return fmt.Errorf("%w: limit %q: unknown %v: choose hybrid.Local, hybrid.Global or hybrid.Hybrid", ErrConfig, l.Name, l.Mode)
	}
	switch l.OnOutage {
	case FailLocal, FailOpen, FailClosed:
	case PolicyUnset:
		return fmt.Errorf("%w: limit %q: OnOutage is unset: choose what happens when Redis is down: "+
			"hybrid.FailLocal (strict local quota rate/N), hybrid.FailOpen (admit) or hybrid.FailClosed (reject)", ErrConfig, l.Name)
	default:
		return fmt.Errorf("%w: limit %q: unknown %v: choose hybrid.FailLocal, hybrid.FailOpen or hybrid.FailClosed", ErrConfig, l.Name, l.OnOutage)
	}
	return nil
}
