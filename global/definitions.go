package global

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed definitions.lua
	definitionsLua    string
	definitionsScript = redis.NewScript(definitionsLua)
)

// DefinitionsKey returns the Redis key of the hash in which the instances
// say what they run limit at: "<prefix>:defs:{<limit>}".
func (s *Store) DefinitionsKey(limit string) string {
	return s.prefix + ":defs:{" + limit + "}"
}

// Definitions records def as what instance runs limit at (its rate, burst
// and mode, as text) for ttl, and returns the definitions of every
// instance whose record has not ended, this one's included, by instance.
// Instances that call it more often than ttl see each other's; one that
// stops is forgotten ttl after its last call. It is one script, sent by
// each instance every few seconds, not per decision.
func (s *Store) Definitions(ctx context.Context, limit, instance, def string, ttl time.Duration) (map[string]string, error) {
	if instance == "" {
		return nil, errors.New("global: Definitions: empty instance")
	}
	ms := max(ttl.Milliseconds(), 1)
	v, err := definitionsScript.Run(ctx, s.rdb, []string{s.DefinitionsKey(limit)}, instance, def, ms).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("global: definitions of %q: %w", limit, err)
	}
	out := make(map[string]string, len(v)/2)
	for i := 0; i+1 < len(v); i += 2 {
		out[v[i]] = v[i+1]
	}
	return out, nil
}
