// Package global is the Redis side of hybridlimit. A Store runs two kinds of
// Lua scripts:
//
//   - Store.TakeN, the classic atomic token bucket: every decision is one
//     script in Redis (package hybrid's Global mode). Its key is BucketKey.
//   - Store.AskLeases and Store.TakePool, the records of placement version 3,
//     which share one rate among many instances (package hybrid's Hybrid
//     mode). Their key is RecordKey: one hash per (limit, key) holding every
//     instance's record of the key and the key's pool.
//
// Every script reads the clock with redis.call('TIME'), so the instances'
// clocks never matter, and touches one key, so it runs on Redis Cluster:
// the bucket and the hash of one (limit, key) share a hash tag, and so a
// slot. A key longer than MaxKeyBytes, with a brace or starting with "#" is
// named by its SHA-256. Keys expire once idle.
//
// # Placement
//
// Every (instance, key) is either leased, admitting locally at the rate
// Redis granted it until the lease ends, or exact, running nothing locally
// and taking each decision from the key's pool. An instance without a
// record runs nothing.
//
// AskLeases grants, renews or releases many leases in one pipeline. Each
// grant is the instance's max-min fair share of the rate over the live
// wants (an exact user wants its measured demand), capped at what the other
// leases leave. An ask says what the instance runs until it hears the
// answer (LeaseAsk.Running), and Redis counts it at that too, so an answer
// that is lost or late never lets the others grow into a rate still in use.
//
// TakePool takes tokens from the key's pool for an exact instance: the pool
// is a token bucket holding the part of the rate and burst that no lease
// holds. A fresh key's pool is full, so a client's burst of up to the
// limit's burst is admitted whole. Callers the pool cannot serve now are
// given turns, one refill apart, so that waiting instances do not all ask
// at once.
//
// Redis counts every instance at what it may run: what the lease records
// hold plus the pool never exceed the rate, nor the burst.
//
// An exact admission may also hand the instance tokens ahead of its next
// requests (credit, PoolTake.Extra), which its record counts out of the
// pool until they end or its next take names them (PoolTake.CreditID).
//
// Each instance numbers its placements of a key with a generation (Gen,
// 1 to 255, compared modulo 256) bumped at every change of placement. An
// ask or take sent in a placement the instance has left since is stale: it
// cannot undo the record of a newer one (LeaseGrant.Stale).
//
// If Redis loses its records (FLUSHALL, a failover to an empty replica),
// the first ask that says it runs a grant Redis has no record of reveals
// the loss (LeaseGrant.Lost). Leases granted before it may still run, and
// of them Redis knows only what instances claim: each ask that finds its
// record gone adds what its instance runs to known (the hash's "lost"
// field, "until_us known"), and pushes the loss's end to the longest lease
// (LeaseAsk.MaxTTL) from then. Until it ends, grants and the pool together
// hold at most known: a grant grows beyond what its instance runs only
// into what the claimers gave up since the loss, and the pool holds what
// the lease records leave of known (capacity, in placement.lua).
//
// A Store decides nothing about outages or local quotas; package hybrid
// composes it with a local limiter and a membership count.
package global
