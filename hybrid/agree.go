package hybrid

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Instances that run a limit at different rates, bursts or modes (a rolling
// deploy of a new rate; two services that share one Redis and name a limit
// alike under the default prefix) still decide: each script carries its
// caller's rate and burst, so those in Global and Hybrid mode admit up to
// the largest of them; one in Local mode is not counted in Redis, and its
// local quota comes on top.
// Every definitionsEvery each instance writes what it runs each limit at to
// Redis and reads what the others do; a difference is logged when it
// changes and counted in hybridlimit_limit_disagreeing_instances.

// definitionsEvery is how often the loop compares the instances'
// definitions: a disagreement shows within this long, for one script per
// limit per instance, not per decision.
const definitionsEvery = 5 * time.Second

// definitionsTTL is how long an instance's definition counts after its
// last write: a few periods, so that one late write does not make an
// instance vanish, and one that stopped is forgotten soon after.
const definitionsTTL = 3 * definitionsEvery

// definition is what an instance runs lim at, as the instances compare it.
func definition(lim Limit) string {
	return fmt.Sprintf("rate=%g burst=%d mode=%s", lim.Rate, lim.Burst, lim.Mode)
}

// compareDefinitions writes what this instance runs each limit of set at,
// reads the others', and reports each limit's disagreements when they
// change. Redis unreachable, it tries again at the next period: the health
// checks say so already.
func (l *Limiter) compareDefinitions(set *limitSet) {
	if l.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.RedisTimeout)
	defer cancel()
	self := l.members.Name()
	for _, ls := range set.order {
		mine := definition(ls.Limit)
		defs, err := l.store.Definitions(ctx, ls.Name, self, mine, definitionsTTL)
		ls.m.redisCommands.Inc()
		if err != nil {
			ls.m.redisErrors.Inc()
			return
		}
		l.noteDisagreement(ls, self, mine, defs)
	}
}

// noteDisagreement sets ls's gauge of the instances whose definition of it
// differs from mine, and logs the disagreement when it changes.
func (l *Limiter) noteDisagreement(ls *limitEntry, self, mine string, defs map[string]string) {
	var others []string
	for inst, def := range defs {
		if inst != self && def != mine {
			others = append(others, inst+": "+def)
		}
	}
	slices.Sort(others)
	ls.m.disagreeing.Set(float64(len(others)))
	now := strings.Join(others, "; ")
	if now == ls.disagreement {
		return
	}
	ls.disagreement = now
	if now == "" {
		l.log.Info("hybridlimit: instances agree on the limit again", "limit", ls.Name, "definition", mine)
		return
	}
	l.log.Warn("hybridlimit: instances run a limit at different definitions",
		"limit", ls.Name, "instance", self, "definition", mine, "others", now)
}
