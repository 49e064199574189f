package global

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrInvalid is wrapped by the errors returned for arguments that cannot be
// sent to Redis: NaN or infinite rates, negative counts, an empty instance id
// and the like. Such requests never reach the network.
var ErrInvalid = errors.New("global: invalid argument")

// ErrReply is wrapped by the errors returned when Redis answers a script with
// a reply of an unexpected shape.
var ErrReply = errors.New("global: unexpected reply")

// DefaultPrefix is the key prefix used when New is given an empty prefix.
const DefaultPrefix = "hybridlimit"

var (
	//go:embed tokenbucket.lua
	tokenBucketLua    string
	tokenBucketScript = redis.NewScript(tokenBucketLua)
)

// Rediser is the part of a go-redis client that a Store uses. *redis.Client,
// *redis.ClusterClient, *redis.Ring and redis.UniversalClient all satisfy it.
type Rediser interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

var (
	_ Rediser = (*redis.Client)(nil)
	_ Rediser = (*redis.ClusterClient)(nil)
	_ Rediser = (*redis.Ring)(nil)
	_ Rediser = redis.UniversalClient(nil)
)

// Store runs the token bucket and placement scripts against Redis. It holds
// no state of its own besides the client and the prefix, and is safe for
// concurrent use.
type Store struct {
	rdb    Rediser
	prefix string
}

// New returns a Store that runs its scripts through rdb and keeps its keys
// under prefix. An empty prefix means DefaultPrefix.
func New(rdb Rediser, prefix string) *Store {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &Store{rdb: rdb, prefix: prefix}
}

// MaxKeyBytes is the longest key that goes into Redis key names as it is.
// Keys often come from clients (an API key, a header, an address), and a
// client may send megabytes: a longer key is named in Redis by "#" and the
// hex SHA-256 of the key, 65 bytes. So is a key with a brace, which would
// move the Redis Cluster hash tag (and could put many keys on one shard),
// and a key starting with "#", which could spell another key's hashed
// name. Two different keys share a name only if SHA-256 collides.
const MaxKeyBytes = 128

// RecordKey returns the Redis key of the placement hash of (limit, key), in
// which Store.AskLeases and Store.TakePool keep every instance's record of
// the key and the key's pool: "<prefix>:v4:{<limit>:<key>}", with key
// hashed if it is longer than MaxKeyBytes, holds a brace or starts with
// "#". The braces are a Redis Cluster hash tag, the same as BucketKey's:
// all the keys of one (limit, key) live in one slot. The "v4" names the
// version of the records, so that records of another version are never
// read as these. Limit names should not contain ':', or two (limit, key)
// pairs may share a key.
func (s *Store) RecordKey(limit, key string) string {
	return s.prefix + ":v4:" + hashTag(limit, key)
}

// BucketKey returns the Redis key of the token bucket of (limit, key), the
// one Store.TakeN runs: "<prefix>:{<limit>:<key>}:tb", with key named as in
// RecordKey.
func (s *Store) BucketKey(limit, key string) string {
	return s.prefix + ":" + hashTag(limit, key) + ":tb"
}

// hashTag is "{<limit>:<key>}", the Redis Cluster hash tag of every key of
// (limit, key), with key named as keyName does.
func hashTag(limit, key string) string {
	return "{" + limit + ":" + keyName(key) + "}"
}

// keyName is key as it appears in Redis key names, see MaxKeyBytes.
func keyName(key string) string {
	if len(key) <= MaxKeyBytes && !strings.ContainsAny(key, "{}") && !strings.HasPrefix(key, "#") {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "#" + hex.EncodeToString(sum[:])
}

// formatFloat formats f so that Lua's tonumber reads it back exactly.
func formatFloat(f float64) string {
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// flag formats b as the scripts read a boolean: "1" or "0".
func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// isFlag reports whether s is a boolean as the scripts write one.
func isFlag(s string) bool { return s == "0" || s == "1" }

// finite reports whether f is neither NaN nor infinite.
func finite(f float64) bool {
	return !math.IsNaN(f) && !math.IsInf(f, 0)
}

// replyStrings checks that v is an array of n strings, as every script returns.
func replyStrings(v any, n int) ([]string, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) != n {
		return nil, fmt.Errorf("%w: %T of %d elements, want %d strings", ErrReply, v, len(arr), n)
	}
	out := make([]string, n)
	for i, e := range arr {
		s, ok := e.(string)
		if !ok {
			return nil, fmt.Errorf("%w: element %d is %T, want string", ErrReply, i, e)
		}
		out[i] = s
	}
	return out, nil
}

// execPipeline executes pipe and returns an error only if it failed as a
// whole: a context or connection error rather than an error reply to one of
// its commands, which stays in that command.
func execPipeline(ctx context.Context, pipe redis.Pipeliner) error {
	cmds, err := pipe.Exec(ctx)
	if err == nil {
		return nil
	}
	// Exec returns the first failed command's error. On a Cluster a node
	// that is down fails only the commands sent to it; but go-redis retries
	// them after a backoff, and when our deadline ends that wait it sets the
	// context's error on every command without one, answered or not. A
	// failed dial on a single node is reported by Exec alone, with the
	// commands left empty. So: a command with a value was answered (its
	// context error is dropped), a reply error is an answer too, and the
	// batch as a whole failed only when nothing was answered.
	answered := 0
	for _, cmd := range cmds {
		e := cmd.Err()
		switch {
		case !cmdEmpty(cmd):
			if isContextError(e) {
				cmd.SetErr(nil)
			}
			answered++
		case e == nil:
			cmd.SetErr(err)
		case isRedisError(e):
			answered++
		}
	}
	if answered > 0 {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	return err
}

func isContextError(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// cmdEmpty reports whether cmd got neither a value nor an error.
func cmdEmpty(cmd redis.Cmder) bool {
	c, ok := cmd.(*redis.Cmd)
	return ok && c.Val() == nil
}

// isNoScript reports whether err is Redis's NOSCRIPT: the script cache was
// flushed or the node is new, and the script must be sent again with EVAL.
func isNoScript(err error) bool {
	return redis.HasErrorPrefix(err, "NOSCRIPT")
}

// IsReplyError reports whether err is Redis's answer about one command (for
// example WRONGTYPE at a key, or NOPERM for a user that may not run scripts)
// as opposed to a failure to reach Redis (connection, timeout, context).
func IsReplyError(err error) bool { return isRedisError(err) }

// isRedisError reports whether err is an error reply from Redis about one
// command, as opposed to a failure of the connection or the context.
func isRedisError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && !errors.Is(err, redis.ErrClosed)
}

// probeSHA is the SHA-1 of a script no one loads: Check asks Redis to run
// it, and Redis answers NOSCRIPT to a client that may run scripts.
const probeSHA = "0000000000000000000000000000000000000000"

// Check tells, in one pipeline, whether Redis answers this client and lets
// it run scripts: it sends PING and an EVALSHA of a script Redis does not
// have, whose expected answer is NOSCRIPT. It returns nil then; otherwise
// PING's error (the connection, the context, WRONGPASS), or the EVALSHA's
// refusal, such as NOPERM for an ACL user without the right to run scripts.
func (s *Store) Check(ctx context.Context) error {
	pipe := s.rdb.Pipeline()
	ping := pipe.Ping(ctx)
	probe := pipe.EvalSha(ctx, probeSHA, nil)
	_, err := pipe.Exec(ctx)
	if ping.Val() != "PONG" {
		// A connection that failed as it was set up (a refused password)
		// leaves the commands without a reply or an error of their own.
		if perr := ping.Err(); perr != nil {
			return perr
		}
		return err
	}
	if err := probe.Err(); err != nil && !isNoScript(err) {
		return err
	}
	return nil
}

// defaultPingBudget bounds each master's PING when Ping's ctx has no
// deadline.
const defaultPingBudget = time.Second

// Ping reports whether Redis answers: nil when it does. On a Cluster it
// pings every master at once and any answer will do, so that one master
// down is not taken for Redis gone; elsewhere it sends one PING through a
// pipeline (the part of a client Rediser covers).
func (s *Store) Ping(ctx context.Context) error {
	if c, ok := s.rdb.(masters); ok {
		// ForEachMaster first reloads the Cluster's slots from a node it
		// picks, which may be the dead one: that can use up ctx's time
		// before any master is pinged. Each PING gets the whole budget.
		budget := defaultPingBudget
		if dl, ok := ctx.Deadline(); ok {
			budget = time.Until(dl)
		}
		var mu sync.Mutex
		var last error
		answered := false
		err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget)
			defer cancel()
			err := m.Ping(pctx).Err()
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				answered = true
			} else {
				last = err
			}
			return nil
		})
		switch {
		case answered:
			return nil
		case last != nil:
			return last
		case err != nil:
			return err
		}
		return errors.New("global: ping: no Cluster master known")
	}
	pipe := s.rdb.Pipeline()
	pipe.Ping(ctx)
	_, err := pipe.Exec(ctx)
	return err
}

// masters is the part of a *redis.ClusterClient that Ping uses.
type masters interface {
	ForEachMaster(ctx context.Context, fn func(ctx context.Context, client *redis.Client) error) error
}
