package hybrid_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// An outage is never answered as a rate limit: with Redis killed, or
// paused, every request of a client under its limit on a FailClosed limit
// gets 503 from the first failed decision on (its key's take fails, and
// it is refused as an outage), never 429; and the limit degrades within a
// RedisTimeout and a tick or two of the first failed decision (logged; the
// bound checked is generous, for a busy machine).
func TestOutageIsNeverARateLimit(t *testing.T) {
	for _, fault := range []string{"kill", "pause"} {
		t.Run(fault, func(t *testing.T) {
			srv := redistest.Start(t)
			cfg := hybrid.DefaultConfig(nil, nil)
			l := newLimiter(t, hybrid.Config{Redis: fastClient(t, srv), Limits: []hybrid.Limit{
				{Name: "login", Rate: hybrid.PerMinute(5), Burst: 5, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed},
			}})
			h := hybrid.Middleware(l, "login", byHeader)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusNoContent)
			}))
			if resp := serve(t, h, "before"); resp.StatusCode != http.StatusNoContent {
				t.Fatalf("before the fault: %d", resp.StatusCode)
			}
			switch fault {
			case "kill":
				srv.Kill(t)
			case "pause":
				srv.Pause(t, 5*time.Second)
			}
			start := time.Now()
			codes := map[int]int{}
			for i := 0; ; i++ {
				// Every request is a user's first: under its limit.
				codes[serve(t, h, fmt.Sprint("user-", i)).StatusCode]++
				if st, _ := l.Status("login"); st.Degraded {
					break
				}
				if time.Since(start) > 5*time.Second {
					t.Fatalf("not degraded within 5 s; answers %v", codes)
				}
			}
			took := time.Since(start)
			t.Logf("degraded %v after the fault (RedisTimeout %v, tick %v); answers %v", took.Round(time.Millisecond), cfg.RedisTimeout, cfg.Tick, codes)
			if codes[http.StatusTooManyRequests] != 0 || len(codes) != 1 || codes[http.StatusServiceUnavailable] == 0 {
				t.Errorf("answers %v: want only 503 for users under their limit while Redis is down", codes)
			}
			if limit := 2*cfg.RedisTimeout + 2*cfg.Tick + 500*time.Millisecond; took > limit {
				t.Errorf("degraded %v after the fault, want within about a RedisTimeout and a tick (at most %v)", took, limit)
			}
		})
	}
}
