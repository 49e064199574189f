package global

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed take.lua
	takeLua    string
	takeScript = redis.NewScript(placementLua + "\n" + takeLua)
)

// maxAsked is the largest PoolTake.Asked: Lua's numbers are float64, exact
// up to 2^53.
const maxAsked = 1 << 53

// PoolTake asks for N tokens of a key's pool, in placement version 3, for
// an instance that decides the key exactly: it runs nothing locally, and
// each of its decisions is one take. The pool is the part of the rate and
// burst that no lease holds (see Store.AskLeases).
//
// A take records the instance as an exact user of the key, which Redis
// counts at 0 (it runs nothing locally) but whose demand, measured from
// Asked, the lease grants leave the pool. What a take does to the
// instance's record depends on the generations, as LeaseAsk.Gen compares
// them: a lease record as new as Gen or newer is kept and counted (the
// instance asked for it in the placement the take was sent in, or later,
// and may run it), and no exact record is written; an older lease record
// is replaced by an exact record (the instance stopped running that lease
// before it sent the take), whose rate goes to the pool at once; an exact
// record newer than Gen is left alone (a stale take); one of the same
// generation is updated; an older one, or none, is replaced by a new one.
// Stale or not, the take takes from the pool, and every record it writes
// carries the instance's live credit over (see Extra).
type PoolTake struct {
	// Limit and Key name the placement hash, see Store.RecordKey.
	Limit, Key string
	// Instance is the id of the asking instance, as in LeaseAsk. It must not
	// be empty.
	Instance string
	// Gen is the instance's generation of the key's placement the take was
	// made in, 1 to 255 (0 is invalid), see LeaseAsk.Gen.
	Gen uint8
	// Rate is the limit's global rate in tokens per second, above 0 and
	// finite.
	Rate float64
	// Burst is the limit's global burst in tokens, at least 1.
	Burst int
	// Instances is N-hat, the largest instance count seen lately, at least
	// 1. It bounds how far ahead turns are handed out, and what the pool
	// holds while Redis has lost records (see TakePool).
	Instances int
	// N is the number of tokens to take, at least 0. 0 takes nothing and is
	// always allowed: it joins the key, or reports its pool.
	N int
	// TTL is how long the instance's exact record lives after this take, at
	// least one microsecond.
	TTL time.Duration
	// Asked is the instance's cumulative count of the tokens asked for on
	// the key, this take's N included, from 0 to 2^53: a counter the
	// instance keeps, including the requests it denied itself while an
	// answer told it to wait. Redis measures the instance's demand from
	// it: a take of the record's generation adds what Asked grew by since
	// the record's latest take, per second, to the demand decayed over one
	// second; a take that starts a record starts it at N per second.
	Asked int64
	// Extra is the most tokens, at least 0, to take beyond N with an
	// admission, ahead of the instance's next requests (Take.Credit): its
	// demand over CreditTTL, at least 1, only from a pool that stays at
	// least half full after them and only to an instance without a live
	// credit. Redis counts them out of the pool until CreditTTL has passed
	// or a take names them (CreditID); see docs/protocol.md#credit.
	Extra int
	// CreditTTL is how long a credit handed by this take lives, at least
	// one microsecond when Extra is above 0.
	CreditTTL time.Duration
	// CreditID is the Take.CreditID of the last credit the instance was
	// handed on the key, which it has spent or let end (it takes from the
	// pool only then), or 0 if none: if the instance's record still counts
	// that credit, it stops counting it from now. A take that raced with
	// the answer that handed a newer credit names the older one, and ends
	// nothing.
	CreditID uint32
}

// validate checks r fully, so that no take that Lua would reject reaches
// Redis.
func (r *PoolTake) validate() error {
	switch {
	case r.Instance == "":
		return fmt.Errorf("%w: empty instance", ErrInvalid)
	case r.Gen == 0:
		return fmt.Errorf("%w: gen 0", ErrInvalid)
	case !finite(r.Rate) || r.Rate <= 0:
		return fmt.Errorf("%w: rate %v is not a positive finite number", ErrInvalid, r.Rate)
	case r.Burst < 1:
		return fmt.Errorf("%w: burst %d is less than 1", ErrInvalid, r.Burst)
	case r.Instances < 1:
		return fmt.Errorf("%w: instances %d is less than 1", ErrInvalid, r.Instances)
	case r.N < 0:
		return fmt.Errorf("%w: n %d is negative", ErrInvalid, r.N)
	case r.TTL < time.Microsecond:
		return fmt.Errorf("%w: ttl %v is less than 1µs", ErrInvalid, r.TTL)
	case r.Extra < 0:
		return fmt.Errorf("%w: extra %d is negative", ErrInvalid, r.Extra)
	case r.CreditTTL < 0 || (r.Extra > 0 && r.CreditTTL < time.Microsecond):
		return fmt.Errorf("%w: credit ttl %v is less than 1µs", ErrInvalid, r.CreditTTL)
	case r.Asked < 0 || r.Asked > maxAsked:
		return fmt.Errorf("%w: asked %d is not from 0 to 2^53", ErrInvalid, r.Asked)
	}
	return nil
}

// TakePool takes r.N tokens from the pool of (r.Limit, r.Key) if they are
// all there, in one script call on Redis server time, and records
// r.Instance's take (see PoolTake). A denial takes nothing.
//
// The pool holds a fraction f = 1 − H/Rate (from 0 to 1) of the rate and
// of the burst, H being what all the lease records of the key hold, the
// caller's own included when the take keeps it; while Redis has lost
// records (see LeaseGrant.Lost), at most X/Instances, X being the exact
// users, the caller counted as one unless the take keeps its lease. It
// refills at its rate up to its burst less the live credits (see
// PoolTake.Extra); a pool that does not exist yet is full, so a client's
// burst of up to Burst on a fresh key is admitted whole. The Take reports
// both (Take.PoolRate, Take.PoolBurst); RetryAfter
// is Never when r.N exceeds the pool's burst or its rate is 0, so the
// caller may ask again once the leases have shrunk.
//
// Callers the pool cannot serve at once are given turns: a denial's
// Turn, and an admission's when it left the pool less than one token, is
// one take's refill after the turn handed out before it, from when the
// tokens would first be there (a denial's RetryAfter: at the pool's rate, or for an
// exact caller at up to its demand, at most Rate/Instances: the leases
// leave the pool that much from their next renewals), at most
// Instances−1 refills later and fewer than the pool's burst holds. A
// caller that waits for its turn before it asks again leaves the next
// tokens to the one whose turn it is, so that a key whose requests land
// on every instance costs about one call per admission rather than one
// per instance at each refill. Turns are hints only: tokens go to whoever
// asks first.
//
// An invalid take returns an error wrapping ErrInvalid without calling
// Redis. Any other error means Redis could not decide; the Take is then
// zero.
func (s *Store) TakePool(ctx context.Context, r PoolTake) (Take, error) {
	if err := r.validate(); err != nil {
		return Take{}, fmt.Errorf("global: take %q: %w", r.Key, err)
	}
	keys := []string{s.RecordKey(r.Limit, r.Key)}
	args := []any{
		r.Instance,
		strconv.Itoa(int(r.Gen)),
		formatFloat(r.Rate),
		strconv.Itoa(r.Burst),
		strconv.Itoa(r.Instances),
		strconv.FormatInt(int64(r.TTL/time.Microsecond), 10),
		strconv.Itoa(r.N),
		strconv.FormatInt(r.Asked, 10),
		strconv.Itoa(r.Extra),
		strconv.FormatUint(uint64(r.CreditID), 10),
		strconv.FormatInt(int64(r.CreditTTL/time.Microsecond), 10),
	}
	cmd := takeScript.EvalSha(ctx, s.rdb, keys, args...)
	if isNoScript(cmd.Err()) {
		cmd = takeScript.Eval(ctx, s.rdb, keys, args...)
	}
	v, err := cmd.Result()
	if err != nil {
		return Take{}, fmt.Errorf("global: take %q: %w", r.Key, err)
	}
	t, err := parsePoolTake(v)
	if err != nil {
		return Take{}, fmt.Errorf("global: take %q: %w", r.Key, err)
	}
	return t, nil
}

// parsePoolTake reads the reply of take.lua.
func parsePoolTake(v any) (Take, error) {
	f, err := replyStrings(v, 8)
	if err != nil {
		return Take{}, err
	}
	t, err := parseTakeFields(f[0], f[1], f[2], f[7])
	if err != nil {
		return Take{}, err
	}
	rate, err1 := strconv.ParseFloat(f[3], 64)
	burst, err2 := strconv.ParseFloat(f[4], 64)
	turn, err3 := strconv.ParseInt(f[5], 10, 64)
	credit, err4 := strconv.Atoi(f[6])
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || !finite(rate) || !finite(burst) ||
		turn < 0 || credit < 0 || (credit > 0 && !t.Allowed) {
		return Take{}, fmt.Errorf("%w: %q", ErrReply, f)
	}
	t.PoolRate, t.PoolBurst, t.Turn, t.Credit = rate, burst, time.Duration(turn)*time.Microsecond, credit
	if credit > 0 {
		t.CreditID = uint32(t.At.UnixMicro()) // as take.lua names it
	}
	return t, nil
}
