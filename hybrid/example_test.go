package hybrid_test

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/membership"
)

// The examples with output use Local limits, which need neither Redis nor a
// cluster, so that they run anywhere.

func ExampleNew() {
	l, err := hybrid.New(hybrid.Config{
		Limits: []hybrid.Limit{{
			Name:     "api",
			Rate:     100, // tokens per second, across all instances
			Burst:    20,
			Mode:     hybrid.Local,
			OnOutage: hybrid.FailOpen,
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())
	st, err := l.Status("api")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %s, %d instance, %v tokens/s burst %d\n", st.Name, st.Mode, st.Instances, st.LocalShare.Limit, st.LocalShare.Burst)

	// What to do while Redis is down must be chosen, even for a Local limit.
	_, err = hybrid.New(hybrid.Config{
		Limits: []hybrid.Limit{{Name: "login", Rate: 1, Burst: 5, Mode: hybrid.Local}},
	})
	fmt.Println(errors.Is(err, hybrid.ErrConfig))
	fmt.Println(err)
	// Output:
	// api: local, 1 instance, 100 tokens/s burst 20
	// true
	// hybrid: invalid config: limit "login": OnOutage is unset: choose what happens when Redis is down: hybrid.FailLocal (strict local quota rate/N), hybrid.FailOpen (admit) or hybrid.FailClosed (reject)
}

func ExampleLimiter_Allow() {
	l, err := hybrid.New(hybrid.Config{
		Members: membership.NewStatic("api-1", 1),
		Limits: []hybrid.Limit{{
			Name: "search", Rate: 1, Burst: 3, Mode: hybrid.Local, OnOutage: hybrid.FailLocal,
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	ctx := context.Background()
	for range 4 {
		d, err := l.Allow(ctx, "search", "user-42")
		if err != nil {
			log.Fatal(err) // the limiter could not decide
		}
		if d.Allowed {
			fmt.Println("allowed, remaining", d.Remaining)
			continue
		}
		// A denial is a Decision, not an error. At 1 token/s the next
		// token is about a second away.
		fmt.Printf("denied by %v, retry after about %v\n", d.Source, d.RetryAfter.Round(time.Second))
	}
	// Output:
	// allowed, remaining 2
	// allowed, remaining 1
	// allowed, remaining 0
	// denied by local, retry after about 1s
}

func ExampleLimiter_Wait() {
	l, err := hybrid.New(hybrid.Config{
		Limits: []hybrid.Limit{{
			Name: "export", Rate: 1000, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailClosed,
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	// Wait for the token rather than being denied; ctx bounds the wait.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 3 {
		if err := l.Wait(ctx, "export", "tenant-7", 1); err != nil {
			fmt.Println("gave up:", err)
			return
		}
		fmt.Println("admitted")
	}
	// Output:
	// admitted
	// admitted
	// admitted
}

func ExampleLimiter_AllowN() {
	l, err := hybrid.New(hybrid.Config{
		Limits: []hybrid.Limit{{
			Name: "upload", Rate: 10, Burst: 5, Mode: hybrid.Local, OnOutage: hybrid.FailLocal,
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())
	ctx := context.Background()

	d, err := l.AllowN(ctx, "upload", "user-42", 4)
	fmt.Println(d.Allowed, d.Remaining, err)

	// More tokens than the burst can never be admitted: the denial comes
	// with ErrExceedsBurst and RetryAfter Never, so no caller waits for it.
	d, err = l.AllowN(ctx, "upload", "user-42", 6)
	fmt.Println(d.Allowed, d.RetryAfter == hybrid.Never, errors.Is(err, hybrid.ErrExceedsBurst))
	fmt.Println(err)
	// Output:
	// true 1 <nil>
	// false true true
	// hybrid: n exceeds burst and can never be admitted: limit "upload": n 6 > burst 5
}

// This example is the set-up of a production instance: Redis arbitrates the
// shares, memberlist counts the instances. It needs both, so it is compiled
// but not run.
func Example_production() {
	rdb := redis.NewClient(&redis.Options{Addr: "redis.internal:6379"})
	defer rdb.Close() // after the Limiter, which does not close it

	// The gossip key comes from the application's secret store, never from
	// source code.
	gossipKey, err := base64.StdEncoding.DecodeString(os.Getenv("GOSSIP_KEY"))
	if err != nil {
		log.Fatal(err)
	}
	members, err := membership.Join(membership.Config{
		BindPort:     membership.DefaultPort,
		Seeds:        []string{"api-0.api.internal:7946", "api-1.api.internal:7946"},
		SecretKey:    gossipKey, // 32 bytes shared by every instance: AES-256
		MaxInstances: 64,
	})
	if err != nil {
		log.Fatal(err)
	}

	// The Limiter closes members on Close, leaving the cluster.
	l, err := hybrid.New(hybrid.DefaultConfig(rdb, members, hybrid.Limit{
		Name:     "api",
		Rate:     1000, // per second, for each key, across the cluster
		Burst:    200,
		Mode:     hybrid.Hybrid,
		OnOutage: hybrid.FailLocal, // Redis down: a strict rate/N per instance
	}))
	if err != nil {
		log.Fatal(err)
	}

	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		d, err := l.Allow(r.Context(), "api", r.Header.Get("X-User"))
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		case !d.Allowed:
			w.Header().Set("Retry-After", fmt.Sprint(int(d.RetryAfter.Seconds()+1)))
			http.Error(w, "slow down", http.StatusTooManyRequests)
		default:
			fmt.Fprintln(w, "hello")
		}
	})
	srv := &http.Server{Addr: ":8080"}
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		slog.Error("serve", "error", err)
	}

	// Release the leases in one round trip so the other instances can use
	// the shares at once.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := l.Close(ctx); err != nil {
		slog.Error("closing the limiter", "error", err)
	}
}

func ExampleMiddleware() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: 1, Burst: 2, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	byClient := func(r *http.Request) string { return r.Header.Get("X-Api-Key") }
	h := hybrid.Middleware(l, "api", byClient)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	for range 3 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Api-Key", "alice")
		h.ServeHTTP(rec, req)
		fmt.Printf("%d RateLimit-Policy: %s RateLimit: %s Retry-After: %q\n", rec.Code,
			rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit"), rec.Header().Get("Retry-After"))
	}
	// Output:
	// 200 RateLimit-Policy: "api";q=2;w=2 RateLimit: "api";r=1;t=1 Retry-After: ""
	// 200 RateLimit-Policy: "api";q=2;w=2 RateLimit: "api";r=0;t=2 Retry-After: ""
	// 429 RateLimit-Policy: "api";q=2;w=2 RateLimit: "api";r=0;t=1 Retry-After: "1"
}

// Two limits on one route, charged all-or-none: a per-route limit and a
// per-client one. Each appears in the RateLimit fields; when the client's
// denies a request, the route gets its token back (r=9 both times).
func ExampleWithLimit() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "route", Rate: 10, Burst: 10, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
		{Name: "client", Rate: 1, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	limit := hybrid.Middleware(l, "route", func(*http.Request) string { return "search" },
		hybrid.WithLimit("client", hybrid.KeyHeader("X-Api-Key")))
	h := limit(hello)

	for range 2 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/search", nil)
		req.Header.Set("X-Api-Key", "alice")
		h.ServeHTTP(rec, req)
		fmt.Println(rec.Code)
		fmt.Println("  RateLimit-Policy:", rec.Header().Get("RateLimit-Policy"))
		fmt.Println("  RateLimit:", rec.Header().Get("RateLimit"))
	}
	// Output:
	// 200
	//   RateLimit-Policy: "route";q=10;w=1, "client";q=1;w=1
	//   RateLimit: "route";r=9;t=1, "client";r=0;t=1
	// 429
	//   RateLimit-Policy: "route";q=10;w=1, "client";q=1;w=1
	//   RateLimit: "route";r=9;t=1, "client";r=0;t=1
}

// A request checked against a limit and then turned away by something
// else (here, a quota of the account that Reserve does not know of) gives
// its tokens back with Cancel.
func ExampleLimiter_Reserve() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "uploads", Rate: hybrid.PerHour(10), Burst: 10, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())
	ctx := context.Background()

	accountFull := true
	r, err := l.Reserve(ctx, "uploads", "alice", 4)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("admitted:", r.Allowed, "left:", r.Remaining)
	if accountFull {
		// The upload will not happen: it must not count against alice.
		if err := r.Cancel(ctx); err != nil {
			log.Print(err) // the tokens stay taken: the limit errs on the safe side
		}
	}
	// Without the refund 6 are left; with it, the 4 less a hair of refill
	// time (see Cancel).
	d, _ := l.AllowN(ctx, "uploads", "alice", 9)
	fmt.Println("then 9 at once:", d.Allowed)
	// Output:
	// admitted: true left: 6
	// then 9 at once: true
}

func ExampleWithCost() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "rows", Rate: 100, Burst: 100, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	// A request for n rows costs n tokens.
	rows := func(r *http.Request) int {
		n, err := strconv.Atoi(r.URL.Query().Get("limit"))
		if err != nil {
			return 1
		}
		return n
	}
	// A cost above the burst can never be admitted: a mistake, by default
	// a 500. Here the client chose it, so it is told 413.
	tooLarge := func(w http.ResponseWriter, r *http.Request, err error) {
		if errors.Is(err, hybrid.ErrExceedsBurst) {
			http.Error(w, "ask for at most 100 rows at once", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
	}
	h := hybrid.Middleware(l, "rows", hybrid.KeyHeader("X-Api-Key"), hybrid.WithCost(rows), hybrid.WithErrorHandler(tooLarge))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	for _, q := range []string{"?limit=60", "?limit=30", "?limit=30", "", "?limit=500"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/export"+q, nil)
		req.Header.Set("X-Api-Key", "alice")
		h.ServeHTTP(rec, req)
		fmt.Printf("%-11q %d RateLimit: %s Retry-After: %q\n", q, rec.Code, rec.Header().Get("RateLimit"), rec.Header().Get("Retry-After"))
	}
	// Output:
	// "?limit=60" 200 RateLimit: "rows";r=40;t=1 Retry-After: ""
	// "?limit=30" 200 RateLimit: "rows";r=10;t=1 Retry-After: ""
	// "?limit=30" 429 RateLimit: "rows";r=10;t=1 Retry-After: "1"
	// ""          200 RateLimit: "rows";r=9;t=1 Retry-After: ""
	// "?limit=500" 413 RateLimit:  Retry-After: ""
}

func ExampleWithSkip() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: 1, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	// The load balancer's health checks are never limited.
	health := func(r *http.Request) bool { return r.URL.Path == "/healthz" }
	everyone := func(*http.Request) string { return "all" }
	h := hybrid.Middleware(l, "api", everyone, hybrid.WithSkip(health))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	for _, path := range []string{"/", "/", "/healthz", "/healthz"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		fmt.Printf("%-8s %d RateLimit: %q\n", path, rec.Code, rec.Header().Get("RateLimit"))
	}
	// Output:
	// /        200 RateLimit: "\"api\";r=0;t=1"
	// /        429 RateLimit: "\"api\";r=0;t=1"
	// /healthz 200 RateLimit: ""
	// /healthz 200 RateLimit: ""
}

func ExampleWithDenyHandler() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: 1, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	// A JSON body instead of text. The RateLimit fields and Retry-After
	// are already set.
	deny := func(w http.ResponseWriter, r *http.Request, d hybrid.Decision) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintf(w, `{"error":"rate_limited","retry_after_seconds":%d}`+"\n", int(math.Ceil(d.RetryAfter.Seconds())))
	}
	h := hybrid.Middleware(l, "api", hybrid.KeyHeader("X-Api-Key"), hybrid.WithDenyHandler(deny))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	for range 2 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Api-Key", "alice")
		h.ServeHTTP(rec, req)
		fmt.Printf("%d Retry-After: %q body: %s\n", rec.Code, rec.Header().Get("Retry-After"), cmp.Or(strings.TrimSpace(rec.Body.String()), "-"))
	}
	// Output:
	// 200 Retry-After: "" body: -
	// 429 Retry-After: "1" body: {"error":"rate_limited","retry_after_seconds":1}
}

func ExampleWithErrorHandler() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: 1, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	if err != nil {
		log.Fatal(err)
	}

	// Log what the limiter could not decide, and answer in JSON.
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // a deterministic example
			}
			return a
		},
	}))
	onError := func(w http.ResponseWriter, r *http.Request, err error) {
		logger.Error("rate limiter", "error", err, "outage", errors.Is(err, hybrid.ErrFailClosed))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, `{"error":"unavailable"}`)
	}
	h := hybrid.Middleware(l, "api", hybrid.KeyHeader("X-Api-Key"), hybrid.WithErrorHandler(onError))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	l.Close(context.Background()) // say, during shutdown
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Print(rec.Code, " ", rec.Body)
	// Output:
	// level=ERROR msg="rate limiter" error="hybrid: limiter closed" outage=false
	// 503 {"error":"unavailable"}
}

// While Redis is down, a FailClosed limit rejects every request: an outage,
// answered 503 with a Retry-After of a few seconds rather than as a rate
// limit.
func ExampleWithOutageRetryAfter() {
	// A Redis that is down: an address where nothing listens.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()

	l, err := hybrid.New(hybrid.Config{Redis: rdb, Limits: []hybrid.Limit{
		{Name: "login", Rate: 1, Burst: 5, Mode: hybrid.Global, OnOutage: hybrid.FailClosed},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	for _, h := range []http.Handler{
		hybrid.Middleware(l, "login", hybrid.KeyHeader("X-User"))(ok),
		hybrid.Middleware(l, "login", hybrid.KeyHeader("X-User"), hybrid.WithOutageRetryAfter(30*time.Second))(ok),
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/login", nil)
		req.Header.Set("X-User", "alice")
		h.ServeHTTP(rec, req)
		fmt.Printf("%d Retry-After: %s RateLimit-Policy: %s RateLimit: %q\n", rec.Code,
			rec.Header().Get("Retry-After"), rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit"))
	}
	// Output:
	// 503 Retry-After: 5 RateLimit-Policy: "login";q=5;w=5 RateLimit: ""
	// 503 Retry-After: 30 RateLimit-Policy: "login";q=5;w=5 RateLimit: ""
}

func ExampleWithEmptyKey() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: 1, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	for _, e := range []hybrid.EmptyKey{hybrid.EmptyKeyShared, hybrid.EmptyKeySkip, hybrid.EmptyKeyReject} {
		h := hybrid.Middleware(l, "api", hybrid.KeyHeader("X-Api-Key"), hybrid.WithEmptyKey(e))(ok)
		fmt.Print(e, ":")
		for range 3 {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil)) // no X-Api-Key
			fmt.Print(" ", rec.Code)
		}
		fmt.Println()
	}
	// Output:
	// shared: 200 429 429
	// skip: 200 200 200
	// reject: 400 400 400
}

// A handler that decides itself, here with a cost known only once the
// request is read, answers with the same header fields as Middleware.
func ExampleWriteHeaders() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		// KiB uploaded per client: 1 KiB/s, 4 KiB at once.
		{Name: "upload-kib", Rate: 1, Burst: 4, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	upload := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		kib := max(1, (len(body)+1023)/1024)
		d, err := l.AllowN(r.Context(), "upload-kib", r.Header.Get("X-Api-Key"), kib)
		if err != nil && !errors.Is(err, hybrid.ErrExceedsBurst) {
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		q, err := l.Quota("upload-kib")
		if err != nil {
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		hybrid.WriteHeaders(w.Header(), "upload-kib", q, d)
		if !d.Allowed {
			http.Error(w, "upload quota exceeded", http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "stored", len(body), "bytes")
	})

	for range 2 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPut, "/files/a", strings.NewReader(strings.Repeat("x", 3000)))
		req.Header.Set("X-Api-Key", "alice")
		upload.ServeHTTP(rec, req)
		fmt.Printf("%d RateLimit-Policy: %s RateLimit: %s Retry-After: %q\n", rec.Code,
			rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit"), rec.Header().Get("Retry-After"))
	}
	// Output:
	// 200 RateLimit-Policy: "upload-kib";q=4;w=4 RateLimit: "upload-kib";r=1;t=3 Retry-After: ""
	// 429 RateLimit-Policy: "upload-kib";q=4;w=4 RateLimit: "upload-kib";r=1;t=2 Retry-After: "2"
}

func ExampleClientIP() {
	// The service runs behind load balancers in 10.0.0.0/8 that append the
	// address of their peer to X-Forwarded-For.
	clientIP, err := hybrid.ClientIP("X-Forwarded-For", "10.0.0.0/8")
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range []struct{ peer, xff string }{
		{"10.0.0.5:41000", "203.0.113.7"},              // through the load balancer
		{"10.0.0.5:41000", "1.2.3.4, 203.0.113.7"},     // a client that sent its own X-Forwarded-For
		{"198.51.100.2:5000", "1.2.3.4"},               // a client that bypassed the load balancer
		{"10.0.0.5:41000", "2001:db8::7, 10.0.0.9"},    // two load balancers, an IPv6 client
		{"10.0.0.5:41000", "203.0.113.7, not-an-addr"}, // a proxy wrote garbage: the peer
	} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = r.peer
		req.Header.Set("X-Forwarded-For", r.xff)
		fmt.Println(clientIP(req))
	}

	_, err = hybrid.ClientIP("X-Forwarded-For", "10.0.0.0/88")
	fmt.Println(err)
	// Output:
	// 203.0.113.7
	// 203.0.113.7
	// 198.51.100.2
	// 2001:db8::7
	// 10.0.0.5
	// hybrid: invalid config: ClientIP: trusted proxy "10.0.0.0/88" is not an IP address or CIDR prefix
}

func ExampleKeyHeader() {
	key := hybrid.KeyHeader("X-Api-Key")
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	fmt.Printf("%q\n", key(req))
	req.Header.Set("X-Api-Key", "alice")
	fmt.Printf("%q\n", key(req))
	// Output:
	// ""
	// "alice"
}

// Each API key has its own bucket; requests without one have a bucket per
// client address.
func ExampleKeyFirst() {
	clientIP, err := hybrid.ClientIP("X-Forwarded-For", "10.0.0.0/8")
	if err != nil {
		log.Fatal(err)
	}
	key := hybrid.KeyFirst(hybrid.KeyHeader("X-Api-Key"), clientIP)

	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "203.0.113.7:5000"
	fmt.Println(key(req))
	req.Header.Set("X-Api-Key", "alice")
	fmt.Println(key(req))
	// Output:
	// 1:203.0.113.7
	// 0:alice
}

// Each client has a bucket on each route.
func ExampleKeyJoin() {
	clientIP, err := hybrid.ClientIP("")
	if err != nil {
		log.Fatal(err)
	}
	key := hybrid.KeyJoin(hybrid.KeyRoute, clientIP)

	mux := http.NewServeMux()
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) { fmt.Println(key(r)) })
	for _, path := range []string{"/items/1", "/items/2"} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.RemoteAddr = "203.0.113.7:5000"
		mux.ServeHTTP(httptest.NewRecorder(), req)
	}
	// Output:
	// GET /items/{id}|203.0.113.7
	// GET /items/{id}|203.0.113.7
}

// A limit per route: the Middleware wraps each route's handler inside the
// mux, where the request knows the pattern that matched.
func ExampleKeyRoute() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "route", Rate: 1, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailOpen},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	perRoute := hybrid.Middleware(l, "route", hybrid.KeyRoute)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", perRoute(ok))
	mux.Handle("GET /users/{id}", perRoute(ok))

	for _, path := range []string{"/items/1", "/items/2", "/users/1"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		fmt.Println(path, rec.Code)
	}
	// Output:
	// /items/1 200
	// /items/2 429
	// /users/1 200
}

func ExamplePerMinute() {
	fmt.Println(hybrid.PerMinute(120), "tokens/s")
	// Output: 2 tokens/s
}

func ExamplePerSecond() {
	fmt.Println(hybrid.PerSecond(10), "tokens/s")
	// Output: 10 tokens/s
}

func ExamplePerHour() {
	fmt.Println(hybrid.PerHour(7200), "tokens/s")
	// Output: 2 tokens/s
}

func ExamplePerDay() {
	// One token a day: a limit of, say, one free export per user and day.
	fmt.Printf("%.3g tokens/s, one every %v\n", hybrid.PerDay(1), time.Duration(float64(time.Second)/hybrid.PerDay(1)))
	// Output: 1.16e-05 tokens/s, one every 24h0m0s
}

func ExampleLimiter_SetLimits() {
	api := hybrid.Limit{Name: "api", Rate: 100, Burst: 2, Mode: hybrid.Local, OnOutage: hybrid.FailOpen}
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{api}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())
	ctx := context.Background()
	var got []bool
	for range 3 {
		d, _ := l.Allow(ctx, "api", "user-42")
		got = append(got, d.Allowed)
	}
	fmt.Println(got)

	// Without a restart: a larger burst for api, and a new limit. The
	// Limiter checks the whole set first; an invalid one changes nothing.
	api.Burst = 10
	search := hybrid.Limit{Name: "search", Rate: hybrid.PerMinute(30), Burst: 5, Mode: hybrid.Local, OnOutage: hybrid.FailLocal}
	if err := l.SetLimits([]hybrid.Limit{api, search}); err != nil {
		log.Fatal(err)
	}
	st, _ := l.Status("api")
	fmt.Println("api burst", st.Burst, "search rate", l.Limits()[1].Rate)

	// A limit left out is removed: decisions on it are errors from now on.
	if err := l.SetLimits([]hybrid.Limit{search}); err != nil {
		log.Fatal(err)
	}
	_, err = l.Allow(ctx, "api", "user-42")
	fmt.Println(errors.Is(err, hybrid.ErrUnknownLimit))

	err = l.SetLimits([]hybrid.Limit{{Name: "login", Rate: 1, Burst: 5, Mode: hybrid.Local}})
	fmt.Println(errors.Is(err, hybrid.ErrConfig), len(l.Limits()))
	// Output:
	// [true true false]
	// api burst 10 search rate 0.5
	// true
	// true 1
}

func ExampleLimiter_Limits() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: 100, Burst: 20, Mode: hybrid.Local, OnOutage: hybrid.FailOpen},
		{Name: "login", Rate: hybrid.PerMinute(5), Burst: 5, Mode: hybrid.Local, OnOutage: hybrid.FailClosed},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())
	for _, lim := range l.Limits() {
		fmt.Printf("%s: %.4g/s burst %d, %s\n", lim.Name, lim.Rate, lim.Burst, lim.OnOutage)
	}
	// Output:
	// api: 100/s burst 20, fail-open
	// login: 0.08333/s burst 5, fail-closed
}

func ExampleLimit_shadow() {
	// A limit to try out before enforcing it: decided and counted as
	// usual, but every request admitted.
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{{
		Name: "new-api", Rate: hybrid.PerHour(100), Burst: 2, Mode: hybrid.Local, OnOutage: hybrid.FailOpen,
		Shadow: true,
	}}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())
	for range 3 {
		d, err := l.Allow(context.Background(), "new-api", "user-42")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("allowed %v, would have been denied %v\n", d.Allowed, d.Shadowed)
	}
	// Output:
	// allowed true, would have been denied false
	// allowed true, would have been denied false
	// allowed true, would have been denied true
}

func ExampleAdmit() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "login", Rate: hybrid.PerMinute(5), Burst: 2, Mode: hybrid.Local, OnOutage: hybrid.FailClosed},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	// The key is in the body: the handler limits by hand, and answers as
	// the middleware would.
	login := func(w http.ResponseWriter, r *http.Request) {
		var body struct{ User string }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		if !hybrid.Admit(w, r, l, "login", body.User) {
			return // 429 with Retry-After, or 503 while Redis is down
		}
		fmt.Fprintln(w, "welcome", body.User)
	}
	for range 3 {
		rec := httptest.NewRecorder()
		login(rec, httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(`{"User":"ann"}`)))
		fmt.Printf("%d Retry-After: %q\n", rec.Code, rec.Header().Get("Retry-After"))
	}
	// Output:
	// 200 Retry-After: ""
	// 200 Retry-After: ""
	// 429 Retry-After: "12"
}
