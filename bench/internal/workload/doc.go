// Package workload describes the traffic the bench program feeds every
// strategy: scenarios, their open-loop arrival schedules and the reference
// an exact limiter would admit.
//
// A Scenario is a fixed plan: how many instances, the limit of every key,
// the total demand and how it is split over instances and keys, and the
// events (a Redis outage, an instance leaving and another joining) at fixed
// offsets from the start. Arrivals turns it into one schedule per instance,
// the same for every strategy and every run with the same seed: arrivals are
// open-loop, scheduled at a set rate whatever the answers, so that accuracy
// is measured against real demand.
//
// Exact is the reference: one exact token bucket per key fed the merged
// arrival stream of all instances, which is what a perfect global limiter
// would admit.
package workload
