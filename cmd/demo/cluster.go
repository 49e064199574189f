package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/membership"
)

// Timings of the demo's limiters: shorter leases than the library's
// defaults, so that an outage and the recovery show within a second or two.
const (
	tick           = 50 * time.Millisecond
	contendedTTL   = 600 * time.Millisecond
	uncontendedTTL = 1 * time.Second
	redisTimeout   = 100 * time.Millisecond
	// clientTimeout bounds every step of the go-redis client, so that
	// nothing hangs on a Redis that is down.
	clientTimeout = 200 * time.Millisecond
	// leaveTimeout bounds each of the two waits of an instance's leave:
	// for the news that it is leaving to go out (so that the others take
	// the departure for a graceful one, and re-split at once), then for its
	// goodbye to reach the other members.
	leaveTimeout = 500 * time.Millisecond
)

// instanceConfig configures one instance: a memberlist node, a Limiter and
// an HTTP server.
type instanceConfig struct {
	// Name is the instance's name in the cluster. Empty means the host name
	// and a random suffix.
	Name string
	// Gossip is the host:port memberlist binds (TCP and UDP); port 0 picks
	// a free one.
	Gossip string
	// Seeds are host:port addresses of members to join. Empty starts a new
	// cluster.
	Seeds []string
	// JoinTimeout is how long to keep trying Seeds while none answers. Zero
	// means membership.DefaultJoinTimeout.
	JoinTimeout time.Duration
	// HTTP is the host:port the HTTP server listens on; port 0 picks a free
	// one.
	HTTP string
	// Redis is the host:port of Redis.
	Redis string
	// Prefix starts every Redis key. Empty means the library's default.
	Prefix string
	// Limits are the limits served, each at /<name>.
	Limits []hybrid.Limit
	// Profile is memberlist's timing profile.
	Profile membership.Profile
	// Logger receives the library's state changes. Nil means none.
	Logger *slog.Logger
}

// instance is one service instance: the limiter, its membership and its
// HTTP server, with counters of the responses it gave per limit.
type instance struct {
	name     string
	gossip   string // memberlist address, the seed others join
	httpAddr string // host:port of the HTTP server
	lim      *hybrid.Limiter
	rdb      *redis.Client
	srv      *http.Server
	served   chan struct{} // closed when the HTTP server has stopped

	// limits are the limits served; setLimits replaces them, never mutates
	// them.
	limits atomic.Pointer[endpoints]
	// setMu serialises setLimits.
	setMu sync.Mutex

	closeOnce sync.Once
	closeErr  error
}

// endpoints are the limits an instance serves, each at /<name> behind the
// library's middleware, with the counts of its responses.
type endpoints struct {
	limits   []hybrid.Limit
	counts   []*responseCounts // of limits[i]; a limit keeps its counts across reloads
	handlers []http.Handler    // of limits[i]
	index    map[string]int    // limit name to index
}

// responseCounts counts the responses of one limit's endpoint.
type responseCounts struct {
	ok, denied, other atomic.Uint64
}

// startInstance starts an instance, or returns an error saying which part
// failed, having stopped the parts already started.
func startInstance(cfg instanceConfig) (*instance, error) {
	host, port, err := splitHostPort(cfg.Gossip)
	if err != nil {
		return nil, fmt.Errorf("gossip address %q: %w", cfg.Gossip, err)
	}
	members, err := membership.Join(membership.Config{
		Name:         cfg.Name,
		BindAddr:     host,
		BindPort:     port,
		Seeds:        cfg.Seeds,
		JoinTimeout:  cfg.JoinTimeout,
		Profile:      cfg.Profile,
		Logger:       cfg.Logger,
		LeaveTimeout: leaveTimeout,
	})
	if err != nil {
		return nil, err
	}
	rdb := newRedisClient(cfg.Redis)
	reg := prometheus.NewRegistry()
	lim, err := hybrid.New(hybrid.Config{
		Redis:          rdb,
		Members:        members, // closed by lim.Close
		Limits:         cfg.Limits,
		Prefix:         cfg.Prefix,
		Tick:           tick,
		ContendedTTL:   contendedTTL,
		UncontendedTTL: uncontendedTTL,
		RedisTimeout:   redisTimeout,
		Registerer:     reg,
		Logger:         cfg.Logger,
	})
	if err != nil {
		_ = members.Close()
		_ = rdb.Close()
		return nil, err
	}
	in := &instance{
		name:   members.Name(),
		gossip: members.Addr(),
		lim:    lim,
		rdb:    rdb,
		served: make(chan struct{}),
	}
	in.serve(cfg.Limits)
	ln, err := net.Listen("tcp", cfg.HTTP)
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = lim.Close(ctx)
		_ = rdb.Close()
		return nil, fmt.Errorf("http address %q: %w", cfg.HTTP, err)
	}
	in.httpAddr = ln.Addr().String()
	in.srv = &http.Server{Handler: in.handler(reg), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(in.served)
		_ = in.srv.Serve(ln) // ErrServerClosed after Shutdown
	}()
	return in, nil
}

// newRedisClient returns a client with short timeouts and no retries, so
// that a Redis that is down costs each call at most clientTimeout.
func newRedisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:         addr,
		DialTimeout:  clientTimeout,
		ReadTimeout:  clientTimeout,
		WriteTimeout: clientTimeout,
		MaxRetries:   -1,
		// After PoolSize failed dials in a row, go-redis stops dialling and
		// fails every call at once, re-dialling in the background only once
		// a second; a renewal every tick during an outage reaches that
		// after PoolSize/20 seconds, and recovery would then lag Redis's
		// return by up to a second. A large pool postpones that for any
		// outage the demo shows; the lease loop itself uses one connection.
		PoolSize:        1000,
		DisableIdentity: true,
	})
}

// splitHostPort splits "host:port"; the port must be a number (0 for a free
// one).
func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q is not a number from 0 to 65535", p)
	}
	return host, port, nil
}

// setLimits puts limits in force in the limiter and serves them, or
// returns the limiter's error and changes nothing.
func (in *instance) setLimits(limits []hybrid.Limit) error {
	in.setMu.Lock()
	defer in.setMu.Unlock()
	if err := in.lim.SetLimits(limits); err != nil {
		return err
	}
	in.serve(limits)
	return nil
}

// serve makes limits the ones served, keeping the counts of those served
// already.
func (in *instance) serve(limits []hybrid.Limit) {
	old := in.limits.Load()
	e := &endpoints{limits: limits, index: make(map[string]int, len(limits))}
	for i, l := range limits {
		c := &responseCounts{}
		if old != nil {
			if j, ok := old.index[l.Name]; ok {
				c = old.counts[j]
			}
		}
		admitted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintf(w, "admitted by %s under limit %q\n", in.name, l.Name)
		})
		e.counts = append(e.counts, c)
		e.handlers = append(e.handlers, in.counted(c, hybrid.Middleware(in.lim, l.Name, requestKey)(admitted)))
		e.index[l.Name] = i
	}
	in.limits.Store(e)
}

// handler serves each limit at /<name> behind the library's middleware,
// and /metrics and /healthz.
func (in *instance) handler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/{limit}", func(w http.ResponseWriter, r *http.Request) {
		e := in.limits.Load()
		i, ok := e.index[r.PathValue("limit")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		e.handlers[i].ServeHTTP(w, r)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", in.healthz)
	return mux
}

// requestKey is the key a request is limited by: the X-Key header, else
// the key query parameter, else the client's address.
func requestKey(r *http.Request) string {
	if k := r.Header.Get("X-Key"); k != "" {
		return k
	}
	if k := r.URL.Query().Get("key"); k != "" {
		return k
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// counted counts the status codes h answers with in c.
func (in *instance) counted(c *responseCounts, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(sw, r)
		switch sw.code {
		case http.StatusOK:
			c.ok.Add(1)
		case http.StatusTooManyRequests:
			c.denied.Add(1)
		default:
			c.other.Add(1)
		}
	})
}

// statusWriter remembers the status code written through it.
type statusWriter struct {
	http.ResponseWriter
	code        int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.code, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

// health is the body of /healthz.
type health struct {
	Name      string        `json:"name"`
	Instances int           `json:"instances"`
	Limits    []limitHealth `json:"limits"`
}

type limitHealth struct {
	Name          string  `json:"name"`
	Mode          string  `json:"mode"`
	OnOutage      string  `json:"on_outage"`
	Degraded      bool    `json:"degraded"`
	Rate          float64 `json:"rate"`
	LocalShare    float64 `json:"local_share"`
	LeasedRate    float64 `json:"leased_rate"`
	RedisCommands uint64  `json:"redis_commands"`
}

// healthz reports the instance count and each limit's state as JSON. It
// answers 200 while the limiter is open, degraded or not: an instance whose
// Redis is down still serves under its outage policies.
func (in *instance) healthz(w http.ResponseWriter, _ *http.Request) {
	h := health{Name: in.name, Instances: in.lim.Instances()}
	for _, l := range in.lim.Limits() {
		st, err := in.lim.Status(l.Name)
		if errors.Is(err, hybrid.ErrUnknownLimit) {
			continue // removed by a reload just now
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		h.Limits = append(h.Limits, limitHealth{
			Name: l.Name, Mode: l.Mode.String(), OnOutage: l.OnOutage.String(), Degraded: st.Degraded,
			Rate: l.Rate, LocalShare: float64(st.LocalShare.Limit), LeasedRate: st.LeasedRate,
			RedisCommands: st.RedisCommands,
		})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(h)
}

// shutdownWait bounds how long close waits for requests in flight.
const shutdownWait = time.Second

// close stops the HTTP server (waiting for requests in flight), closes the
// limiter (releasing its leases and leaving the cluster) and the Redis
// client. ctx bounds the whole. It is idempotent.
func (in *instance) close(ctx context.Context) error {
	in.closeOnce.Do(func() {
		var errs []error
		sctx, cancel := context.WithTimeout(ctx, shutdownWait)
		if err := in.srv.Shutdown(sctx); err != nil {
			// Connections still open (for example dialled by a client but
			// never used) are cut: the requests have been answered.
			_ = in.srv.Close()
		}
		cancel()
		<-in.served
		if err := in.lim.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", in.name, err))
		}
		if err := in.rdb.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
			errs = append(errs, fmt.Errorf("%s: redis client: %w", in.name, err))
		}
		in.closeErr = errors.Join(errs...)
	})
	return in.closeErr
}

// limitSample is one limit on one instance at one moment.
type limitSample struct {
	limit             hybrid.Limit
	ok, denied, other uint64
	st                hybrid.Status
}

// sample reads the counters and status of every limit served.
func (in *instance) sample() []limitSample {
	e := in.limits.Load()
	s := make([]limitSample, len(e.limits))
	for i, l := range e.limits {
		c := e.counts[i]
		s[i].limit = l
		s[i].ok, s[i].denied, s[i].other = c.ok.Load(), c.denied.Load(), c.other.Load()
		// An error only for a limit a reload removed just now: its Status
		// stays zero.
		s[i].st, _ = in.lim.Status(l.Name)
	}
	return s
}
