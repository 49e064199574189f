package membership

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults for the Config fields that govern joining the seeds.
const (
	// DefaultJoinTimeout is how long Join keeps trying the seeds when
	// Config.JoinTimeout is zero: long enough for the instances of a
	// deployment started together to come up, short enough that a node
	// given the wrong seeds fails while someone is still watching.
	DefaultJoinTimeout = 30 * time.Second

	// DefaultRetryInterval is the first wait between two attempts to join
	// the seeds when Config.RetryInterval is zero.
	DefaultRetryInterval = time.Second

	// DefaultMaxRetryInterval caps the wait between two attempts to join
	// the seeds when Config.MaxRetryInterval is zero. A node that has lost
	// every other member finds them again within about this long after they
	// can be reached.
	DefaultMaxRetryInterval = 15 * time.Second
)

// backoff is the schedule of waits between attempts to join the seeds. The
// k-th wait (k from 0) is drawn from [d/2, d), d = min(first·2^k, most):
// doubling bounds the load on seeds that are down, and the random half
// spreads instances that failed together (a whole deployment starting) so
// that they do not retry in step. It is a value handed its randomness, so
// that tests can table it.
type backoff struct {
	first, most time.Duration
	d           time.Duration // the bound of the next wait; 0 before the first
}

// next returns the next wait, given u drawn uniformly from [0, 1).
func (b *backoff) next(u float64) time.Duration {
	d := b.d
	if d == 0 {
		d = b.first
	}
	if d > b.most/2 {
		b.d = b.most
	} else {
		b.d = 2 * d
	}
	half := d / 2
	return half + time.Duration(u*float64(d-half))
}

// seed is one Config.Seeds entry, parsed once by Join.
type seed struct {
	raw      string // as configured, for messages
	nodeName string // memberlist's optional "name/" prefix, slash included
	host     string // an IP address or a name to resolve
	port     string
	isIP     bool
}

// parseSeeds parses "host:port", "host" (port is then defaultPort, as
// memberlist does) and memberlist's "name/host:port" forms.
func parseSeeds(seeds []string, defaultPort int) ([]seed, error) {
	out := make([]seed, 0, len(seeds))
	for _, s := range seeds {
		sd := seed{raw: s}
		rest := s
		if i := strings.Index(s, "/"); i >= 0 {
			sd.nodeName, rest = s[:i+1], s[i+1:]
			if i == 0 {
				return nil, fmt.Errorf("%w: seed %q: empty node name before /", ErrInvalidConfig, s)
			}
		}
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			// No port (or a bare IPv6 address): memberlist's rule.
			host, port = strings.Trim(rest, "[]"), strconv.Itoa(defaultPort)
		}
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
			return nil, fmt.Errorf("%w: seed %q: port must be 1 to 65535", ErrInvalidConfig, s)
		}
		if host == "" || strings.ContainsAny(host, " \t[]") {
			return nil, fmt.Errorf("%w: seed %q: want host:port", ErrInvalidConfig, s)
		}
		sd.host, sd.port = host, port
		sd.isIP = net.ParseIP(host) != nil
		out = append(out, sd)
	}
	return out, nil
}

// resolveSeeds returns the addresses to try, in the seeds' order without
// duplicates, and why a seed gave none. Names are resolved afresh at every
// call: the members behind a DNS name change as instances come and go.
func (m *Memberlist) resolveSeeds(ctx context.Context) (addrs []string, errs []error) {
	for _, s := range m.seeds {
		if s.isIP {
			addrs = append(addrs, s.nodeName+net.JoinHostPort(s.host, s.port))
			continue
		}
		ips, err := m.resolve(ctx, s.host)
		if err == nil && len(ips) == 0 {
			err = errors.New("no addresses")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("resolve seed %s: %w", s.raw, err))
			continue
		}
		for _, ip := range ips {
			addrs = append(addrs, s.nodeName+net.JoinHostPort(ip, s.port))
		}
	}
	seen := make(map[string]bool, len(addrs))
	return slices.DeleteFunc(addrs, func(a string) bool {
		dup := seen[a]
		seen[a] = true
		return dup
	}), errs
}

// attempt resolves the seeds and tries to join through each address once,
// stopping early when ctx ends. It returns how many addresses answered and,
// when none did, why. An address being tried when ctx ends is tried to the
// end: memberlist's push/pull cannot be interrupted, and is bounded by its
// TCPTimeout.
func (m *Memberlist) attempt(ctx context.Context) (int, error) {
	addrs, errs := m.resolveSeeds(ctx)
	answered := 0
	for _, a := range addrs {
		if ctx.Err() != nil {
			break
		}
		n, err := m.ml.Join([]string{a})
		answered += n
		if err != nil {
			errs = append(errs, flatten(err))
		}
	}
	if answered > 0 {
		return answered, nil
	}
	if len(errs) == 0 {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		return 0, errors.New("no seed address to try")
	}
	return 0, joinError{errs}
}

// join tries the seeds until one answers (this node itself counts), another
// member joins this node, timeout has passed since it started or ctx ends.
// On failure it returns an error wrapping ErrJoin.
func (m *Memberlist) join(ctx context.Context, timeout time.Duration) error {
	start := time.Now()
	deadline := start.Add(timeout)
	b := m.newBackoff()
	var last error
	for attempts := 1; ; attempts++ {
		if err := ctx.Err(); err != nil {
			return m.joinFailed(attempts-1, time.Since(start), err, last)
		}
		if m.ml.NumMembers() > 1 {
			m.logger.Debug("membership: joined by another member", "name", m.name, "attempts", attempts-1)
			return nil
		}
		n, err := m.attempt(ctx)
		if n > 0 {
			if attempts > 1 {
				m.logger.Info("membership: a seed answered", "name", m.name, "attempts", attempts, "after", time.Since(start))
			}
			return nil
		}
		last = err
		left := time.Until(deadline)
		if left <= 0 {
			return m.joinFailed(attempts, time.Since(start), nil, last)
		}
		wait := min(b.next(rand.Float64()), left)
		if attempts == 1 {
			m.logger.Info("membership: no seed answered yet; retrying", "name", m.name, "for", timeout, "err", err)
		} else {
			m.logger.Debug("membership: no seed answered", "name", m.name, "attempt", attempts, "retry_in", wait, "err", err)
		}
		if !m.sleep(ctx, wait) && ctx.Err() != nil {
			return m.joinFailed(attempts, time.Since(start), ctx.Err(), last)
		}
	}
}

// joinFailed is join's error: it names the seeds and says why the last
// attempt failed, and wraps ctx's error when that is why join stopped.
func (m *Memberlist) joinFailed(attempts int, after time.Duration, ctxErr, last error) error {
	raw := make([]string, len(m.seeds))
	for i, s := range m.seeds {
		raw[i] = s.raw
	}
	via := strings.Join(raw, ", ")
	after = after.Round(time.Millisecond)
	tries := strconv.Itoa(attempts) + " attempts"
	if attempts == 1 {
		tries = "1 attempt"
	}
	switch {
	case ctxErr != nil && last != nil:
		return fmt.Errorf("%w via %s: %w after %s in %v; last: %w", ErrJoin, via, ctxErr, tries, after, last)
	case ctxErr != nil:
		return fmt.Errorf("%w via %s: %w before any attempt", ErrJoin, via, ctxErr)
	default:
		return fmt.Errorf("%w via %s: no seed answered in %s over %v; last: %w", ErrJoin, via, tries, after, last)
	}
}

// sleep waits for d, or until another member joins this node or ctx
// ends. It reports whether d passed.
func (m *Memberlist) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return true
		case <-m.changed:
			if m.ml.NumMembers() > 1 {
				return false
			}
		case <-ctx.Done():
			return false
		}
	}
}

// catchUpAfter is how long after Join a node exchanges state with the
// seeds once more (see rejoinLoop): long enough for a seed to have merged
// the members that joined at the same time.
const catchUpAfter = time.Second

func (m *Memberlist) newBackoff() backoff {
	return backoff{first: m.retryInterval, most: m.maxRetryInterval}
}

// rejoinLoop runs from Join to Close on a node that has seeds. Whenever the
// node is alone (every other member left or was declared dead, or the only
// seed that answered at Join was itself) it tries the seeds again, with
// back-off, until another member is back: a healed partition, restarted
// instances or a seed name that now resolves elsewhere. Membership events
// wake it; it never runs inside a memberlist callback.
//
// First, catchUpAfter after Join, it exchanges state with the seeds once
// more: a node that joined while another was joining may have missed it
// (the member it joined through had not merged the other yet, and had
// already spent its gossip about it), and would count one member short,
// a larger default share, until memberlist's periodic state exchange,
// 15 to 30 s later.
func (m *Memberlist) rejoinLoop(ctx context.Context) {
	defer close(m.rejoinDone)
	t := time.NewTimer(catchUpAfter)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		return
	}
	if m.ml.NumMembers() > 1 {
		if _, err := m.attempt(ctx); err != nil && ctx.Err() == nil {
			m.logger.Debug("membership: catching up with the seeds failed", "name", m.name, "err", err)
		}
		m.membersChanged()
	}
	for {
		if m.ml.NumMembers() == 1 {
			m.rejoin(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-m.changed:
		}
	}
}

// rejoin retries the seeds while the node is alone and ctx lasts, waiting
// before each attempt.
func (m *Memberlist) rejoin(ctx context.Context) {
	start := time.Now()
	m.logger.Info("membership: no other member; trying the seeds in the background", "name", m.name)
	b := m.newBackoff()
	for attempts := 1; ; attempts++ {
		wait := b.next(rand.Float64())
		m.sleep(ctx, wait)
		if ctx.Err() != nil {
			return
		}
		if m.ml.NumMembers() > 1 {
			m.logger.Info("membership: another member joined", "name", m.name, "after", time.Since(start), "count", m.ml.NumMembers())
			return
		}
		_, err := m.attempt(ctx)
		if ctx.Err() != nil {
			return
		}
		if m.ml.NumMembers() > 1 {
			m.logger.Info("membership: rejoined through the seeds", "name", m.name, "attempts", attempts, "after", time.Since(start), "count", m.ml.NumMembers())
			return
		}
		if err == nil {
			err = errors.New("only this node answered")
		}
		m.logger.Debug("membership: rejoin attempt failed", "name", m.name, "attempt", attempts, "err", err)
	}
}
