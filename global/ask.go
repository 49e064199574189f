package global

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	// placement.lua holds the helpers of the scripts that read a key's
	// placement hash (Store.RecordKey); it is prepended to each.
	//go:embed placement.lua
	placementLua string

	//go:embed ask.lua
	askLua    string
	askScript = redis.NewScript(placementLua + "\n" + askLua)
)

// LeaseAsk asks for, renews or releases one instance's lease of one
// (limit, key), in placement version 3 (see Store.AskLeases).
//
// Every (instance, key) is either leased (it admits locally at its grant
// until the lease ends) or exact (it runs nothing locally and takes each
// decision from the key's pool, see PoolTake); an instance without a
// record runs nothing. Gen, bumped by the instance at every change of
// placement, orders its asks and takes: see Gen.
type LeaseAsk struct {
	// Limit and Key name the placement hash, see Store.RecordKey.
	Limit, Key string
	// Instance is the id of the asking instance. It must not be empty, and
	// a restarted process must not reuse its predecessor's: it would
	// inherit its records.
	Instance string
	// Gen is the instance's generation of the key's placement this ask was
	// made in, 1 to 255 (0 is invalid), compared in serial number
	// arithmetic modulo 256: a is newer than b when a-b is 1 to 127 modulo
	// 256, so 3 is newer than 250. An ask older than the instance's record
	// (sent in a placement the instance has left since) is stale: nothing
	// is written, and the answer says so (LeaseGrant.Stale).
	Gen uint8
	// Want is the rate in tokens per second the instance asks for, at
	// least 0 and finite. An instance that wants 0 is granted 0 but keeps
	// a record until TTL; see Release to end it.
	Want float64
	// Release ends the instance's record of the key, unless the record is
	// newer than Gen: the instance stopped running its lease before it
	// asked. Its rate and burst go to the pool at once. The other fields
	// must be valid all the same: they size the pool.
	Release bool
	// Rate is the limit's global rate in tokens per second, above 0 and
	// finite.
	Rate float64
	// Burst is the limit's global burst in tokens, at least 1. A lease
	// holds the part of it in proportion to its rate, Burst·Granted/Rate.
	Burst int
	// Instances is N-hat, the largest instance count seen lately, at least
	// 1. It splits what nobody wants: see Store.AskLeases.
	Instances int
	// TTL is the lease lifetime, at least one microsecond.
	TTL time.Duration
	// MaxTTL is the longest lease any instance of the limit may hold, used
	// when Redis turns out to have lost its records (see LeaseGrant.Lost).
	// Anything below TTL, zero included, means TTL.
	MaxTTL time.Duration
	// Running is the grant in tokens per second that the instance runs now
	// on the key (0: none), at least 0 and finite. The instance learns of
	// this ask's grant only when the answer arrives, or never if the answer
	// is lost: until RunningFor ends, Redis counts it at the larger of
	// Running and its new grant, so that what it gives up is not granted to
	// the others before it stops running it. Running above 0 with no lease
	// record of the instance in Redis proves that Redis lost its records
	// (see LeaseGrant.Lost).
	Running float64
	// RunningFor is how much longer the instance runs Running, at least 0;
	// it is sent rounded up to the microsecond.
	RunningFor time.Duration
	// Drain says the instance comes from the exact placement: with a grant,
	// the lease's part of the burst (Burst·Granted/Rate, rounded down), or
	// what the pool holds if that is less, moves from the key's pool to the
	// instance (LeaseGrant.Drained), so that what the pool held for its
	// traffic goes on in its local bucket instead of staying behind.
	Drain bool
	// Recorded says the instance holds a record of the key in Redis that
	// its last answered ask left, which lives yet and which it did not
	// release (a lease, or an ask granted too little to run): Redis
	// finding no record of the instance has lost it, and perhaps the
	// others' too, as when Running is above 0 (see LeaseGrant.Lost). An
	// instance that runs nothing still proves the loss this way, before
	// its ask is granted what a lease Redis forgot still runs.
	Recorded bool
	// YoungFor is how long another instance's demand on the key must have
	// lasted (since its first record, whichever placement it is in) for
	// its want to count in this grant's fair share: a shorter pulse, which
	// may end before this instance's lease is cut for it, takes only what
	// is free (the pool, grants too small to run). Zero counts every want.
	// It must not be negative.
	YoungFor time.Duration
}

// LeaseGrant is the answer to one LeaseAsk.
type LeaseGrant struct {
	// Granted is the rate in tokens per second the instance may admit
	// locally for In from when the script ran. It is 0 for a release and a
	// stale ask.
	Granted float64
	// Fair is the instance's max-min fair share of the rate. Granted below
	// Fair means other instances still hold more than their share and
	// will shrink at their next renewals, so asking again soon is
	// worthwhile. Contended, it is the want capped at the fair level;
	// uncontended, the want, plus an N-th of what nobody wants (and at
	// least Rate/Instances while that is free) when no other instance
	// decides the key exactly. 0 for a release and a stale ask.
	Fair float64
	// Demand is the sum of the live wants: the others' leases' wants and
	// exact users' measured demand, and this ask's want. 0 for a release
	// and a stale ask.
	Demand float64
	// Contended reports whether Demand exceeds the rate.
	Contended bool
	// Lost reports that Redis lost records that instances may still run,
	// less than the longest lease (LeaseAsk.MaxTTL) ago: Granted is then
	// at most the ask's Running, so that no instance grows into them.
	Lost bool
	// Stale reports that the ask was older than the instance's record
	// (see LeaseAsk.Gen): it wrote nothing.
	Stale bool
	// In is the lease's lifetime from when the script ran, which the
	// caller can add to its own clock: the ask's TTL for a grant, 0 for a
	// release and a stale ask.
	In time.Duration
	// Drained is how many whole tokens moved from the key's pool to the
	// instance with the grant (see LeaseAsk.Drain): they are its to admit
	// in its local bucket, up to its lease's burst.
	Drained int
	// Err is the failure of this ask alone (an error wrapping ErrInvalid,
	// WRONGTYPE at its key, a Redis Cluster node that is down), nil on
	// success. When Err is set the other fields are zero.
	Err error
}

// maxTTL is the longest lease of any instance, at least a's.
func (a *LeaseAsk) maxTTL() time.Duration {
	return max(a.MaxTTL, a.TTL)
}

// validate checks a fully, so that no ask that Lua would reject reaches
// Redis.
func (a *LeaseAsk) validate() error {
	switch {
	case a.Instance == "":
		return fmt.Errorf("%w: empty instance", ErrInvalid)
	case a.Gen == 0:
		return fmt.Errorf("%w: gen 0", ErrInvalid)
	case !finite(a.Want) || a.Want < 0:
		return fmt.Errorf("%w: want %v is not a non-negative finite number", ErrInvalid, a.Want)
	case !finite(a.Rate) || a.Rate <= 0:
		return fmt.Errorf("%w: rate %v is not a positive finite number", ErrInvalid, a.Rate)
	case a.Burst < 1:
		return fmt.Errorf("%w: burst %d is less than 1", ErrInvalid, a.Burst)
	case a.Instances < 1:
		return fmt.Errorf("%w: instances %d is less than 1", ErrInvalid, a.Instances)
	case a.TTL < time.Microsecond:
		return fmt.Errorf("%w: ttl %v is less than 1µs", ErrInvalid, a.TTL)
	case !finite(a.Running) || a.Running < 0:
		return fmt.Errorf("%w: running %v is not a non-negative finite number", ErrInvalid, a.Running)
	case a.YoungFor < 0:
		return fmt.Errorf("%w: young for %v is negative", ErrInvalid, a.YoungFor)
	case a.RunningFor < 0:
		return fmt.Errorf("%w: running for %v is negative", ErrInvalid, a.RunningFor)
	}
	return nil
}

// args is ask.lua's ARGV for a.
func (a *LeaseAsk) args() []any {
	return []any{
		a.Instance,
		strconv.Itoa(int(a.Gen)),
		formatFloat(a.Want),
		formatFloat(a.Rate),
		strconv.Itoa(a.Burst),
		strconv.Itoa(a.Instances),
		strconv.FormatInt(int64(a.TTL/time.Microsecond), 10),
		strconv.FormatInt(int64(a.maxTTL()/time.Microsecond), 10),
		formatFloat(a.Running),
		// Rounded up: Redis must count the grant until it has ended.
		strconv.FormatInt(int64((a.RunningFor+time.Microsecond-1)/time.Microsecond), 10),
		flag(a.Drain),
		flag(a.Release),
		strconv.FormatInt(int64(a.YoungFor/time.Microsecond), 10),
		flag(a.Recorded),
	}
}

// AskLeases grants, renews or releases the leases in asks and writes the
// answer to asks[i] in out[i]. All asks go out in one pipeline (go-redis
// splits it per node on a Cluster); scripts missing from a node's cache
// are sent again with EVAL in one more pipeline.
//
// Each grant is min(fair share, Rate − what the other instances' lease
// records hold), where a lease record holds the larger of its grant, while
// it lives, and the grant its instance said it was running (Running), until
// RunningFor ends; the fair share is the max-min fair split of the rate
// over the live wants, exact users wanting their measured demand (see
// LeaseGrant.Fair). So the leases and the key's pool, which holds what the
// leases leave, never hold more than the rate between them, nor more than
// the burst. The instance's record is replaced in the same step: an exact
// user moving to a lease is counted at one or the other, never at
// neither.
//
// Invalid asks get an Err wrapping ErrInvalid in out and are not sent.
// The returned error is non-nil only when the batch as a whole failed (no
// ask got an answer: the connection, the context), or when out is shorter
// than asks; the elements of out are then unspecified. On a Cluster with
// one node down, only the asks for that node's slots fail, each with the
// node's error in out[i].Err.
func (s *Store) AskLeases(ctx context.Context, asks []LeaseAsk, out []LeaseGrant) error {
	if len(out) < len(asks) {
		return fmt.Errorf("global: ask: %w: %d results for %d asks", ErrInvalid, len(out), len(asks))
	}
	cmds := make([]*redis.Cmd, len(asks))
	keys := make([][]string, len(asks))
	valid := 0
	for i := range asks {
		out[i] = LeaseGrant{}
		if err := asks[i].validate(); err != nil {
			out[i].Err = fmt.Errorf("global: ask %q: %w", asks[i].Key, err)
			continue
		}
		keys[i] = []string{s.RecordKey(asks[i].Limit, asks[i].Key)}
		valid++
	}
	if valid == 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
	for i := range asks {
		if keys[i] != nil {
			cmds[i] = askScript.EvalSha(ctx, pipe, keys[i], asks[i].args()...)
		}
	}
	if err := execPipeline(ctx, pipe); err != nil {
		return fmt.Errorf("global: ask: %w", err)
	}
	var retry []int
	for i, cmd := range cmds {
		if cmd != nil && isNoScript(cmd.Err()) {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		pipe = s.rdb.Pipeline()
		for _, i := range retry {
			cmds[i] = askScript.Eval(ctx, pipe, keys[i], asks[i].args()...)
		}
		if err := execPipeline(ctx, pipe); err != nil {
			return fmt.Errorf("global: ask: %w", err)
		}
	}
	for i, cmd := range cmds {
		if cmd == nil {
			continue // invalid, out[i] already set
		}
		g, err := parseGrant(cmd)
		if err != nil {
			out[i] = LeaseGrant{Err: fmt.Errorf("global: ask %q: %w", asks[i].Key, err)}
			continue
		}
		out[i] = g
	}
	return nil
}

// parseGrant reads the reply of ask.lua.
func parseGrant(cmd *redis.Cmd) (LeaseGrant, error) {
	v, err := cmd.Result()
	if err != nil {
		return LeaseGrant{}, err
	}
	f, err := replyStrings(v, 8)
	if err != nil {
		return LeaseGrant{}, err
	}
	granted, err1 := strconv.ParseFloat(f[0], 64)
	fair, err2 := strconv.ParseFloat(f[1], 64)
	demand, err3 := strconv.ParseFloat(f[2], 64)
	in, err4 := strconv.ParseInt(f[4], 10, 64)
	drained, err5 := strconv.Atoi(f[6])
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil || !finite(granted) || granted < 0 ||
		!isFlag(f[3]) || !isFlag(f[5]) || !isFlag(f[7]) || in < 0 || drained < 0 {
		return LeaseGrant{}, fmt.Errorf("%w: %q", ErrReply, f)
	}
	return LeaseGrant{
		Granted:   granted,
		Fair:      fair,
		Demand:    demand,
		Contended: f[3] == "1",
		Lost:      f[5] == "1",
		Stale:     f[7] == "1",
		In:        time.Duration(in) * time.Microsecond,
		Drained:   drained,
	}, nil
}
