// Package membership reports N, the number of live instances of a service,
// self included, and tells its watchers when N changes.
//
// A rate limit shared by N instances gives each instance a default share of
// rate/N, so N must follow instances as they start, leave and crash. The
// Counter interface is all a consumer needs: a cheap Count for hot paths, a
// stable Name that identifies this instance, and Watch to learn of changes.
//
// Two implementations are provided. Static holds a count set by its owner,
// for single-instance use and tests (with a Bus, several Statics in one
// process message each other and leave gracefully). Memberlist is backed by a
// github.com/hashicorp/memberlist gossip cluster: Join starts a node, joins the
// given seeds, and counts the live members, optionally encrypting gossip with
// a shared key and warning when the count exceeds a configured maximum.
//
// Instances of a deployment start together and in no particular order, so
// Join keeps trying its seeds, with randomized exponential back-off, for up
// to Config.JoinTimeout; each instance listens while it retries, so they
// find each other whatever their order. Seeds may be DNS names, resolved
// again at every attempt (a Kubernetes headless service lists the current
// pods). A node that later finds itself alone, every other member gone or
// cut off, tries its seeds again in the background until Close, so that a
// healed partition or restarted instances merge again.
//
// A member that leaves gracefully (Close) is gone from the others' counts
// within a gossip round or two; a member that crashes is gone once failure
// detection declares it dead, which takes seconds with the Local profile
// and longer with LAN.
//
// A consumer that must not under-count also needs to know which of the
// two happened: a member declared dead may still be running, cut off by a
// partition, while one that left gracefully stopped first. Both
// implementations are Rosters: WatchView gives the members by name, and
// the names of those that left gracefully (Memberlist.Close, Static.Leave).
// Close whatever uses the count before leaving: hybrid.Limiter.Close does,
// and closes its Members last.
//
// Watchers are called from one goroutine owned by the Counter, never from
// memberlist's own callbacks, so a slow watcher cannot stall gossip. Changes
// that happen in quick succession may be coalesced: a watcher always sees the
// latest count, in order, but not necessarily every intermediate one.
//
// Members can also tell each other things: the Messenger interface sends
// small messages (at most MaxMessage bytes) to every other live member or
// to one by name, best effort, and calls receivers with each message and
// its sender's name. A Memberlist sends each message in one UDP packet,
// encrypted with the gossip key when there is one; a Static reaches the
// other Statics connected to the same Bus, in one process, for tests and
// benchmarks. Either way a message may be lost but is never corrupted,
// receivers run on a goroutine owned by the Messenger, and a receiver that
// falls behind loses messages (counted by Dropped) rather than stalling
// gossip or the sender.
package membership
