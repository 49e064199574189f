// Package global is the Redis side of hybridlimit: a classic atomic token
// bucket for limits decided per request in Redis, and rate leases that share
// one global rate among many instances.
//
// Both run as Lua scripts that read the clock with redis.call('TIME'), so the
// clocks of the instances never matter, and each script touches exactly one
// key, so they work on Redis Cluster. Keys carry a TTL and disappear when idle.
//
// A rate lease says "instance i may admit r tokens/s on this key until t".
// Store.Lease grants each instance the smaller of its max-min fair share of
// the rate and what the other live leases leave free; instances holding more
// than their fair share shrink at their next renewal. A request also says
// which grant the instance runs until its answer arrives (LeaseRequest.Running),
// and Redis counts the instance at that one too until it ends, so the sum of
// what the instances of a key may be running never exceeds its rate, even
// when an answer is lost after Redis ran the request. Many leases are renewed
// in one pipelined round trip.
//
// Redis counts every live instance of a key, always: one with a lease at
// what it may be running, one that decides the key exactly (Store.TakeExact)
// at the default share it gave the key's pool (for a limit with exact
// bursts, at the demand its takes measure: see LeaseRequest.ExactBursts),
// and one with no record at
// its default share rate/N, which it may run without asking. The pool, a
// token bucket in the key's lease hash, holds the part of the rate and
// burst that no lease and no default share holds; exact users take from it
// one request at a time.
//
// A lease holds the part of the key's burst in proportion to its rate, or,
// when the request gives the limit's burst (LeaseRequest.Burst), a part of
// its own that Redis counts as it counts the rate: max-min fair over the
// parts the instances ask for, never more in all than the burst (see
// Lease.Burst). An instance light on a key's rate so keeps what its
// clients' uneven requests need, while a saturated one takes less.
//
// A Store does not decide anything by itself about outages or local quotas;
// package hybrid composes it with a local limiter and a membership count.
package global
