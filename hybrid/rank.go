package hybrid

import (
	"slices"
	"time"

	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/membership"
)

// The default shares of a limit (package local's name for its local
// quotas: Local mode, and FailLocal while Redis is unreachable) split its
// burst so that the shares of all instances sum to exactly the burst:
// burst/N-hat each, rounded down, and one token more for the instances
// whose rank is below burst mod N-hat (local.Split). The rank must be one
// that every instance computes alike, unique, and such that no view of the
// cluster lets two instances hold the same remainder token.
//
// An instance's rank is the position of its name among the names of every
// member seen within PeakWindow, sorted (membership.Roster), the same
// window N-hat looks back over. Ranks are unique wherever the instances'
// views hold the same names, whether N-hat is the live count or larger:
// the names in the window are at least N-hat many, so at most burst mod
// N-hat of the instances that may be running (at most N-hat of them) rank
// below it. How the views may disagree, and why that never lets the shares
// sum above the burst by more than invariant 1 allows:
//
//   - A member is declared dead, or is cut off by a partition: its name
//     stays in everyone's window for PeakWindow, as N-hat does, so no rank
//     moves (where ranks by the live names would restart from 0 on each
//     side of a partition, and hand the remainder out twice). A member
//     that leaves gracefully (membership.View.Left: it stopped deciding
//     first) is taken out of every sample at once: ranks and N-hat fall,
//     as in the next case.
//   - A name ages out of the window, or N-hat drops: ranks and N-hat only
//     fall, and a default share grows only as they fall (it is a
//     non-increasing function of both, see rankShare), so every instance
//     that has already moved holds at most what the new split gives it and
//     every one that has not holds less: the sum stays at most the burst
//     throughout.
//   - A member joins: the instances that have heard of it may move down in
//     the ranking, those that have not keep their old shares, and the
//     joiner runs its own share. That is the allowance of invariant 1, one
//     default share per instance per membership change, which N-hat's own
//     change takes already (the others run their old rate/N-hat until they
//     hear); the ranks add nothing beyond it.
//   - The names seen are fewer than N-hat (a Counter without a Roster, a
//     Static whose count says more instances than its Bus connects, a
//     count that ran ahead of the member list): some instance may hold any
//     rank, so this one takes none (local.NoRank) and runs burst/N-hat
//     rounded down; the shares then sum below the burst, never above.
//
// The ranks serve only those local quotas. A Hybrid key is decided exactly
// in Redis or on a lease Redis granted, and Redis counts every instance at
// what its record holds, nobody without one: no rank enters its sums.

// rankShare is the burst of the default share of rank rank among n
// instances: burst/n rounded down, plus one if rank < burst mod n. It is
// local.Split's burst, written as the number of tokens j < burst with
// j mod n == rank, which shows it non-increasing in both rank and n.
func rankShare(burst, n, rank int) int {
	return local.Split(1, burst, n, rank).Burst
}

// roster returns the names of the live members, sorted, or nil when the
// Counter cannot tell them.
func (l *Limiter) roster() []string {
	r, ok := l.members.(membership.Roster)
	if !ok {
		return nil
	}
	return r.View().Members
}

// observe records, at now, the live count n and the member names (nil:
// none known), unless they are those of the latest sample.
func (l *Limiter) observe(now time.Time, n int, names []string) {
	l.peakMu.Lock()
	defer l.peakMu.Unlock()
	if k := len(l.samples); k > 0 && l.samples[k-1].n == n && slices.Equal(l.samples[k-1].names, names) {
		return
	}
	l.samples = append(l.samples, peerSample{at: now, n: n, names: names})
}

// place returns this instance's place for the default shares at now: N-hat,
// the largest count seen within PeakWindow (or the live count, if larger),
// and its rank (see rankIn).
func (l *Limiter) place(now time.Time) (n, rank int) {
	live := l.members.Count()
	l.peakMu.Lock()
	defer l.peakMu.Unlock()
	l.prune(now)
	return rankIn(l.samples, live, l.members.Name())
}

// rankIn returns N-hat, the largest of live and the counts of samples (at
// least 1), and the rank of self among the names of samples: its position
// among them sorted, or local.NoRank when they are fewer than N-hat or do
// not name self.
func rankIn(samples []peerSample, live int, self string) (n, rank int) {
	n = max(live, 1)
	var names []string
	for _, s := range samples {
		n = max(n, s.n)
		names = append(names, s.names...)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) < n {
		return n, local.NoRank
	}
	i, ok := slices.BinarySearch(names, self)
	if !ok {
		return n, local.NoRank
	}
	return n, i
}

// placeOf is the local.Place of ls's local quota for N-hat n and rank
// rank: a Hybrid limit with Redis reachable decides nothing by it (its keys
// are exact or leased), so a rank may get no burst at all and the quotas
// sum to at most the burst; a limit that decides by it (Local mode, an
// outage with FailLocal) keeps a token on every instance, or its keys could
// admit nothing.
func placeOf(ls *limitEntry, n, rank int) local.Place {
	p := local.Place{Instances: n, Rank: rank, MinBurst: 1}
	if ls.Mode == Hybrid && !ls.degraded.Load() {
		p.MinBurst = 0
	}
	return p
}
