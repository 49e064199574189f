// Package gossiptest provides memberlist transports that a test can
// partition at run time, on real UDP and TCP sockets of 127.0.0.1.
//
// A Network hands out Transports. Each wraps a memberlist.NetTransport bound
// to a free port of 127.0.0.1 and belongs to a named group. Give one to each
// node (membership.Config.Transport, or memberlist.Config.Transport). Split
// cuts groups off from each other, Heal joins them again:
//
//	nw := gossiptest.NewNetwork(nil)
//	left, _ := nw.Transport("left")
//	right, _ := nw.Transport("right")
//	// ... start one node on each transport, join them ...
//	nw.Split("left", "right") // the nodes stop hearing each other
//	nw.Heal()                 // and may talk again
//
// While a split holds, a Transport drops the packets it would send to a
// transport of a group cut off from its own, drops the packets it receives
// from one, and refuses to dial one. Nothing else changes: the sockets stay
// open, addresses that no transport of the Network is bound to are never
// cut, and a stream connection opened before the split stays open.
//
// memberlist learns of a partition the way it learns of a crash: failure
// detection declares the nodes it cannot reach dead, which takes seconds
// with the Local profile (about 7 s for a 2|2 split of four nodes, longer
// on a loaded machine). Whether the sides merge again once the split heals
// is up to memberlist (v0.5.4): for GossipToTheDeadTime after declaring a
// node dead (15 s with the Local profile) it still gossips to it, the node
// refutes its death, and push/pull exchanges spread the rest, so a split
// healed that soon merges within a few push/pull intervals; one healed
// later never merges by itself, since memberlist does not rejoin dead
// nodes. A node that joins across the healed split learns its seed's side
// only. (A membership.Memberlist that a split leaves alone, counting only
// itself, tries its seeds again until one answers, so it does merge.)
package gossiptest
