package global

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// LeaseRequest asks for, renews or releases one instance's rate lease on one
// (limit, key).
//
// Redis counts every live instance of the key (see Instances): one with a
// lease at the larger of its grant and Running, an exact user (see
// ExactRequest) at Rate/Instances, the share it gave the key's pool (with
// ExactBursts, at the demand its takes measured, see ExactBursts), and
// one with no record at all ("unrecorded") at its default share,
// Rate/Instances, which it may run without asking. A request that is not a
// release replaces the instance's exact record with its lease record in one
// step, so an exact user moving to a lease is counted at one or the other,
// never at neither.
type LeaseRequest struct {
	// Limit and Key name the lease hash, see Store.LeaseKey.
	Limit, Key string
	// Instance is the id of the asking instance (its membership name). It
	// must not be empty, and a restarted process must not reuse its
	// predecessor's: it would inherit its records.
	Instance string
	// Want is the rate in tokens per second the instance asks for. 0 without
	// Yield releases its lease (and its exact record): the instance is then
	// unrecorded, counted at its default share again, but must not run that
	// share before the release's Expires (see Lease.Expires).
	Want float64
	// Yield says the instance gives up everything above Want: it is granted
	// at most Want, with no part of what nobody wants. With Want 0 it keeps
	// a record granted 0, so that it is counted at 0 instead of at its
	// default share until TTL.
	Yield bool
	// Rate is the limit's global rate in tokens per second, shared by all
	// instances.
	Rate float64
	// Instances is N-hat, the largest instance count seen lately, at least
	// 1. The instances of the key beyond those with a live record (this one
	// included) are unrecorded: each is counted as running, and wanting,
	// Rate/Instances.
	Instances int
	// TTL is the lease lifetime, at least one microsecond.
	TTL time.Duration
	// MaxTTL is the longest lease any instance may hold, used when Redis
	// turns out to have lost its records (see Held). Zero, or anything
	// below TTL, means TTL.
	MaxTTL time.Duration
	// Running is what the instance runs now on the key, in tokens per
	// second, and RunningFor how much longer it will: it learns of the grant
	// of this request only when the answer arrives, or never if the answer
	// is lost. While RunningFor lasts, Redis counts the instance at the
	// larger of Running and its new grant, so that what it gives up is not
	// granted to the others before it stops running it. For a key in its
	// default share, Running is that share; zero if the instance runs
	// nothing on the key.
	Running    float64
	RunningFor time.Duration
	// Held says Running is a grant Redis gave this instance, not its default
	// share. A Held request with Running above 0 whose record Redis does not
	// have proves that Redis lost state (FLUSHALL, a restart without
	// persistence, a failover that lost writes): from then until MaxTTL
	// later, when every lease granted before the loss has ended, every grant
	// on the key is capped at the Running of its request, or at the default
	// share Rate/Instances for an instance that decides the key exactly
	// (it holds a record of TakeExact), which the pool holds for it
	// meanwhile (see Lease.Lost).
	Held bool
	// ExactBursts says the limit's instances never run a default share
	// without asking (see ExactRequest.ExactBursts): instances that hold no
	// record of the key are then counted at 0, not at Rate/Instances, and
	// an exact user at the tokens per second its takes asked for, admitted
	// or not (decayed over one second), with 20% headroom, at least a
	// twentieth of Rate/Instances and at most all of it. An exact user runs
	// nothing locally and takes from the pool, which is what the leases
	// leave: what it is counted at is what the grants leave the pool for
	// it, so a heavy instance's lease is not held to its default share by
	// light exact users. (With split bursts an exact user may run its
	// default share once its record is released, and is counted at it.)
	ExactBursts bool
	// Young says the instance's demand above what it runs is recent: it is
	// granted as any request is, from what the others leave, but its
	// record wants no more than the larger of that grant and Running, so
	// that the other instances' fair shares, and their grants at their
	// next renewals, are not cut for it. The rest of its want still counts
	// as demand (Lease.Demand, Lease.Contended): while it goes unmet, no
	// instance is granted a part of what nobody wants on top of its own
	// want. An instance asks so while a
	// reallocation would cost more than it brings: a pulse that may end
	// before the others' cut has landed.
	Young bool
	// Drain is, for an instance on its way from the exact placement to a
	// lease, the limit's burst: with a grant, up to the grant's part of it
	// (Drain·Granted/Rate, the lease's burst) moves from the key's pool to
	// the instance (see Lease.Drained), so that what the pool held for its
	// traffic goes on in its local bucket instead of staying behind. Zero
	// moves none. It must not be negative.
	Drain int
	// Burst, when above zero, is the limit's burst, and Redis counts it
	// apart from the rate: it grants this instance a part of it of its own
	// (Lease.Burst), the max-min fair part of the parts asked for, within
	// what the others hold (a lease its granted part and the part it said
	// it ran, an exact user and an unrecorded instance burst/Instances,
	// with the remainder tokens their ranks may give the unrecorded). An
	// instance whose traffic is light but bursty may so hold more than its
	// rate's part of the burst while a saturated one, which needs little,
	// holds less; the parts held never sum to more than Burst. Zero: every
	// record holds its rate's part of the burst (Burst·Granted/Rate).
	Burst int
	// WantBurst is the part of the burst asked for, and RunningBurst the
	// part the instance runs now, counted until RunningFor ends as Running
	// is (both used only with Burst; neither negative).
	WantBurst, RunningBurst float64
}

// maxTTL is the longest lease of any instance, at least r's.
func (r *LeaseRequest) maxTTL() time.Duration {
	return max(r.MaxTTL, r.TTL)
}

// validate checks r fully, so that no request Lua would reject reaches Redis.
// burstArg is lease.lua's ARGV[14]: "burst want_b running_b", or empty
// without Burst.
func (r *LeaseRequest) burstArg() string {
	if r.Burst <= 0 {
		return ""
	}
	return strconv.Itoa(r.Burst) + " " + formatFloat(r.WantBurst) + " " + formatFloat(r.RunningBurst)
}

func (r *LeaseRequest) validate() error {
	switch {
	case r.Instance == "":
		return fmt.Errorf("%w: empty instance", ErrInvalid)
	case !finite(r.Want) || r.Want < 0:
		return fmt.Errorf("%w: want %v is not a non-negative finite number", ErrInvalid, r.Want)
	case !finite(r.Rate) || r.Rate < 0:
		return fmt.Errorf("%w: rate %v is not a non-negative finite number", ErrInvalid, r.Rate)
	case r.Instances < 1:
		return fmt.Errorf("%w: instances %d is less than 1", ErrInvalid, r.Instances)
	case r.TTL < time.Microsecond:
		return fmt.Errorf("%w: ttl %v is less than 1µs", ErrInvalid, r.TTL)
	case r.MaxTTL < 0:
		return fmt.Errorf("%w: max ttl %v is negative", ErrInvalid, r.MaxTTL)
	case !finite(r.Running) || r.Running < 0:
		return fmt.Errorf("%w: running %v is not a non-negative finite number", ErrInvalid, r.Running)
	case r.RunningFor < 0:
		return fmt.Errorf("%w: running for %v is negative", ErrInvalid, r.RunningFor)
	case r.Drain < 0:
		return fmt.Errorf("%w: drain %d is negative", ErrInvalid, r.Drain)
	case r.Burst < 0:
		return fmt.Errorf("%w: burst %d is negative", ErrInvalid, r.Burst)
	case r.Burst > 0 && (!finite(r.WantBurst) || r.WantBurst < 0 || !finite(r.RunningBurst) || r.RunningBurst < 0):
		return fmt.Errorf("%w: burst parts %v and %v are not non-negative finite numbers", ErrInvalid, r.WantBurst, r.RunningBurst)
	}
	return nil
}

// Lease is the answer to one LeaseRequest.
type Lease struct {
	// Granted is the rate in tokens per second this instance may admit until
	// Expires. It is 0 for a release.
	Granted float64
	// Fair is this instance's max-min fair share of the rate. Granted < Fair
	// means other instances still hold more than their share and will shrink
	// at their next renewal, so asking again soon is worthwhile.
	Fair float64
	// Demand is the sum of the live wants (young ones in full, see
	// LeaseRequest.Young), exact users and unrecorded instances counted as
	// the grant counts them (see LeaseRequest.ExactBursts).
	Demand float64
	// Contended reports whether Demand exceeds the rate.
	Contended bool
	// Expires is the Redis server time at which the lease ends. For a
	// release, it is when the instance may run its default share again:
	// the request's own time if its live record counted it at that share or
	// more (a lease, or an exact record) and no lease granted while it was
	// counted lower still runs; otherwise (a lower record, or one that
	// lapsed) when the other instances' leases stop holding more than their
	// own default shares (rate or burst part): only those may have been
	// granted what it did not hold. An exact record taken after a lower
	// lease, or while waiting out such a release, keeps that wait.
	// An instance whose record lapsed returns to its default share this
	// way too.
	Expires time.Time
	// Lost reports that Redis lost leases that instances may still run, less
	// than the longest lease ago: Granted is then at most the request's
	// Running (an exact user's: at least its default share, which it held
	// in the pool), so that no instance grows into them.
	Lost bool
	// In is Expires as a span from the moment the script ran, which the
	// caller can add to its own clock: the lease's TTL for a grant, and
	// for a release how long until the instance may run its default share
	// again (0 when it may at once).
	In time.Duration
	// Unrecorded is how many of the other live instances hold no record
	// of the key and were counted at their default share: asking them to
	// yield is what could free more for this instance.
	Unrecorded int
	// Drained is how many whole tokens moved from the key's exact pool to
	// this instance with the grant (see LeaseRequest.Drain): they are its
	// to admit now, in its local bucket, up to its lease's burst.
	Drained int
	// Burst is the part of the burst granted when the request gave the
	// limit's (LeaseRequest.Burst), and -1 otherwise: the grant then holds
	// its rate's part.
	Burst float64
	// Err is the failure of this request alone (for example WRONGTYPE at its
	// key, or an error wrapping ErrInvalid), nil on success. When Err is set
	// the other fields are zero.
	Err error
}

// Lease grants, renews or releases (Want 0) the leases in reqs and stores
// the answer to reqs[i] in out[i]. All requests go out in one pipeline
// (go-redis splits it per node on a Cluster); scripts missing from a node's
// cache are sent again with EVAL in one more pipeline.
//
// Each grant is min(fair share, Rate − what all the other instances are
// counted at, see LeaseRequest), so the sum of what the instances of a key
// may be running, each counted at the larger of its grant and its Running
// until RunningFor ends, never exceeds its rate. An uncontended fair share
// is the want plus an N-th of what nobody wants, and at least the default
// share Rate/Instances while that is free; a contended one is the want
// capped at the max-min fair level.
//
// Invalid requests get an Err wrapping ErrInvalid in out and are not sent.
// The returned error is non-nil only when the batch as a whole failed (no
// request got an answer: the connection, the context; or out is shorter
// than reqs); the elements of out are then unspecified. On a Cluster with
// one node down, only the requests for that node's slots fail, each with
// the node's error in out[i].Err.
func (s *Store) Lease(ctx context.Context, reqs []LeaseRequest, out []Lease) error {
	if len(out) < len(reqs) {
		return fmt.Errorf("global: lease: %w: %d results for %d requests", ErrInvalid, len(out), len(reqs))
	}
	cmds, err := s.runLeases(ctx, "lease", reqs, func(i int) []any {
		r := &reqs[i]
		return []any{
			r.Instance,
			formatFloat(r.Want),
			formatFloat(r.Rate),
			strconv.Itoa(r.Instances),
			strconv.FormatInt(int64(r.TTL/time.Microsecond), 10),
			formatFloat(r.Running),
			// Rounded up: Redis must count the grant until it has ended.
			strconv.FormatInt(int64((r.RunningFor+time.Microsecond-1)/time.Microsecond), 10),
			flag(r.Yield),
			flag(r.Held),
			strconv.FormatInt(int64(r.maxTTL()/time.Microsecond), 10),
			flag(r.ExactBursts),
			flag(r.Young),
			strconv.Itoa(r.Drain),
			r.burstArg(),
		}
	}, func(i int) error { return reqs[i].validate() }, out)
	if err != nil {
		return err
	}
	for i, cmd := range cmds {
		if cmd == nil {
			continue // invalid, out[i] already set
		}
		l, err := parseLease(cmd)
		if err != nil {
			err = fmt.Errorf("global: lease %q: %w", reqs[i].Key, err)
		}
		out[i] = l
		out[i].Err = err
	}
	return nil
}

// Release drops the leases and exact records of reqs[i].Instance on
// (reqs[i].Limit, reqs[i].Key) in one pipeline, so that their share is free
// for the other instances at once; each instance is then unrecorded,
// counted at its default share. Only Limit, Key and Instance are used: use
// Lease with Want 0 to learn when the instance may run its default share
// again (Lease.Expires). Failures of single
// requests (an empty instance, WRONGTYPE) are joined into the returned error
// but do not stop the others.
func (s *Store) Release(ctx context.Context, reqs []LeaseRequest) error {
	out := make([]Lease, len(reqs))
	cmds, err := s.runLeases(ctx, "release", reqs, func(i int) []any {
		// Want 0 releases; rate, n and the ttls only need to be valid.
		return []any{reqs[i].Instance, "0", "0", "1", "1", "0", "0", "0", "0", "1"}
	}, func(i int) error {
		if reqs[i].Instance == "" {
			return fmt.Errorf("%w: empty instance", ErrInvalid)
		}
		return nil
	}, out)
	if err != nil {
		return err
	}
	var errs []error
	for i, cmd := range cmds {
		if cmd == nil {
			errs = append(errs, out[i].Err)
			continue
		}
		if err := cmd.Err(); err != nil {
			errs = append(errs, fmt.Errorf("global: release %q: %w", reqs[i].Key, err))
		}
	}
	return errors.Join(errs...)
}

// runLeases runs lease.lua once per valid request in one pipeline, resending
// NOSCRIPT failures with EVAL in a second one. cmds[i] is nil for an invalid
// request, whose error is stored in out[i].Err. It returns an error only when
// the batch as a whole failed.
func (s *Store) runLeases(ctx context.Context, op string, reqs []LeaseRequest, args func(int) []any, validate func(int) error, out []Lease) ([]*redis.Cmd, error) {
	cmds := make([]*redis.Cmd, len(reqs))
	keys := make([][]string, len(reqs))
	valid := 0
	for i := range reqs {
		if err := validate(i); err != nil {
			out[i] = Lease{Err: fmt.Errorf("global: %s %q: %w", op, reqs[i].Key, err)}
			continue
		}
		keys[i] = []string{s.LeaseKey(reqs[i].Limit, reqs[i].Key)}
		valid++
	}
	if valid == 0 {
		return cmds, nil
	}
	pipe := s.rdb.Pipeline()
	for i := range reqs {
		if keys[i] != nil {
			cmds[i] = leaseScript.EvalSha(ctx, pipe, keys[i], args(i)...)
		}
	}
	if err := execPipeline(ctx, pipe); err != nil {
		return nil, fmt.Errorf("global: %s: %w", op, err)
	}

	var retry []int
	for i, cmd := range cmds {
		if cmd != nil && isNoScript(cmd.Err()) {
			retry = append(retry, i)
		}
	}
	if len(retry) == 0 {
		return cmds, nil
	}
	pipe = s.rdb.Pipeline()
	for _, i := range retry {
		cmds[i] = leaseScript.Eval(ctx, pipe, keys[i], args(i)...)
	}
	if err := execPipeline(ctx, pipe); err != nil {
		return nil, fmt.Errorf("global: %s: %w", op, err)
	}
	return cmds, nil
}

// parseLease reads the reply of lease.lua.
func parseLease(cmd *redis.Cmd) (Lease, error) {
	v, err := cmd.Result()
	if err != nil {
		return Lease{}, err
	}
	f, err := replyStrings(v, 10)
	if err != nil {
		return Lease{}, err
	}
	drained, err7 := strconv.Atoi(f[8])
	burst, err8 := strconv.ParseFloat(f[9], 64)
	granted, err1 := strconv.ParseFloat(f[0], 64)
	fair, err2 := strconv.ParseFloat(f[1], 64)
	demand, err3 := strconv.ParseFloat(f[2], 64)
	expiry, err4 := strconv.ParseInt(f[4], 10, 64)
	in, err5 := strconv.ParseInt(f[6], 10, 64)
	unrecorded, err6 := strconv.Atoi(f[7])
	if err := errors.Join(err1, err2, err3, err4, err5, err6, err7, err8); err != nil || !isFlag(f[3]) || !isFlag(f[5]) || drained < 0 {
		return Lease{}, fmt.Errorf("%w: %q", ErrReply, f)
	}
	return Lease{
		Granted:    granted,
		Fair:       fair,
		Demand:     demand,
		Contended:  f[3] == "1",
		Expires:    time.UnixMicro(expiry),
		Lost:       f[5] == "1",
		In:         time.Duration(in) * time.Microsecond,
		Unrecorded: unrecorded,
		Drained:    drained,
		Burst:      burst,
	}, nil
}
