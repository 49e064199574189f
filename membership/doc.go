// Package membership reports N, the number of live instances of a service,
// self included, with the members' names, tells its watchers when they
// change, and tells a member's graceful leave from its failure.
//
// A rate limit shared by N instances gives each instance a default share of
// rate/N, so N must follow instances as they start, leave and crash. The
// Counter interface is all a consumer needs: a cheap Count for hot paths, a
// stable Name that identifies this instance, and Watch to learn of changes.
//
// Two implementations are provided. Static holds a count set by its owner,
// for single-instance use and tests (with a Bus, several Statics in one
// process know each other by name and leave gracefully). Memberlist is
// backed by a github.com/hashicorp/memberlist gossip cluster: Join starts a
// node, joins the given seeds, and counts the live members, optionally
// encrypting gossip with a shared key and warning when the count exceeds a
// configured maximum.
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
package membership
