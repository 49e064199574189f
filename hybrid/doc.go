// Package hybrid enforces one rate limit across many service instances while
// deciding every request in process.
//
// A Limiter holds a set of named limits. Each instance learns the live
// instance count N from a membership.Counter and decides every request with
// a golang.org/x/time/rate limiter per key (package local) running at its
// share of the limit. For limits in Hybrid mode, Redis arbitrates the shares
// as rate leases (package global): each instance leases a share sized to its
// recent demand, the live leases of a key never sum above the limit, and one
// background goroutine renews the leases of all keys in one pipelined round
// trip per tick. Decisions never wait on Redis.
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
package hybrid
