// Package hybrid enforces one rate limit across many service instances,
// deciding most requests in process.
//
// A Limiter holds a set of named limits, each in one of three modes:
//
//   - Local: a golang.org/x/time/rate-style bucket per key at this
//     instance's share of the limit, rate/N-hat, N-hat being the largest
//     instance count a membership.Counter reported within PeakWindow. No
//     Redis; right when traffic is balanced.
//   - Global: one atomic token-bucket script in Redis per decision: exact,
//     one round trip each.
//   - Hybrid: each key on each instance is either leased, deciding locally
//     at a rate share Redis granted it, sized to its demand and renewed with
//     every other key's lease in one pipelined round trip per tick; or
//     decided exactly, one script per decision against the key's pool in
//     Redis (the part of the limit no lease holds), with a deny cache. A
//     key's first decisions on an instance are exact, so a client's burst
//     of up to the limit's burst is admitted whole wherever it lands; the
//     key moves to a lease when one would admit as well for fewer scripts.
//     Redis counts every instance at what it may run, so a key's instances
//     never admit more than its limit. Only exact decisions wait on Redis,
//     bounded by Config.RedisTimeout. Nothing depends on messages between
//     instances: any membership.Counter will do.
//
// When Redis cannot be reached, each limit follows the outage policy its
// owner chose (a Hybrid key once its lease has run out): FailLocal (the
// local quota rate/N-hat), FailOpen (admit) or FailClosed (reject). There
// is no default: an unset policy is an error at New.
//
// The placement policy of Hybrid keys lives in package hybrid/placement, a
// clock-free state machine tested with step tables; loop.go drives it.
package hybrid
