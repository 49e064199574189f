// Package local keeps the in-process side of one rate limit: a token bucket
// per key, with golang.org/x/time/rate's arithmetic, each running at this
// instance's share of the limit.
//
// A key starts at the default share (rate/N, and burst/N rounded down plus a
// token of the remainder for the instances of the lowest ranks, N being the
// instance count: see Split and Place) and may be assigned another share
// until a deadline, after which it falls back to the default share by
// itself, on the next decision, without anyone having to notice. The
// caller (package hybrid) assigns the shares it leases from Redis; local
// knows nothing of Redis or membership.
//
// Keys live in shards chosen by a hash of the key, each a hash table behind
// one mutex, so that decisions on different keys rarely contend on a lock.
// A decision takes its shard's mutex once and nothing else: each key's
// bucket is x/time/rate's Limiter written out without its own mutex, step
// for step the same arithmetic (the same admissions and the same tokens, to
// the bit), its times kept as offsets like the key's. A decision on a hot key
// costs about what a bare rate.Limiter's AllowN costs. Deciding on an
// existing key allocates nothing. A key takes about the memory of a bare
// map[string]*rate.Limiter entry (see BenchmarkMemory): keys are held by
// value, in pages, found through slots of 8 bytes. Idle keys are evicted by
// EvictIdle, so memory follows the active keys.
//
// Every bucket is fed a time that never moves backwards: x/time/rate
// over-admits when concurrent callers hand it timestamps out of order
// (golang/go#65508, golang/go#71360), and so would the same arithmetic here,
// so each key clamps the time it is given to the latest time it has seen,
// under the same lock as the decision.
package local
