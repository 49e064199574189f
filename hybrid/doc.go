// Package hybrid enforces one rate limit across many service instances,
// deciding most requests in process.
//
// A Limiter holds a set of named limits. Each instance learns the instance
// count N from a membership.Counter and decides requests with a
// golang.org/x/time/rate limiter per key (package local) running at its
// share of the limit, N being the largest count seen within PeakWindow:
// an instance that seems to fail stays counted that long, since it may
// still be deciding, while one that leaves gracefully (Limiter.Close, then
// its membership) stops counting at once.
//
// For limits in Hybrid mode, each key sits where it is cheapest at full
// accuracy on each instance (placement version 2): its default share, with
// no Redis at all; a rate lease from Redis (package global) sized to its
// demand, the peers asked over membership to yield what they do not use,
// and the leases of all keys renewed in one pipelined round trip per tick;
// or the exact placement, one script per decision against the key's pool in
// Redis, with a deny cache. Redis counts every live instance at what it may
// run, always, so a key's instances never admit more than its limit. Only
// exact decisions wait on Redis, bounded by Config.RedisTimeout. Limit's
// ExactBursts chooses between split bursts (the default: keys start at
// their default share) and exact bursts (a client's burst admitted whole
// wherever it lands).
//
// When Redis cannot be reached and leases run out, each limit follows the
// outage policy its owner chose: FailLocal (a strict local quota of rate/N,
// N being the largest instance count seen recently), FailOpen (admit) or
// FailClosed (reject). There is no default: an unset policy is an error at
// New.
//
// Limits in Local mode never touch Redis (rate/N per instance); limits in
// Global mode run one atomic token-bucket script per decision, the classic
// exact and expensive design.
//
// Read engine.go first: the placement policy as a clock-free state machine,
// tested with step tables in engine_test.go. PLACEMENT.md, next to it, lists
// the rules the code adds to the project's design (turns, credit, drain,
// ranks, young yields, chance tests), what was measured and not kept, and
// the known gaps.
package hybrid
