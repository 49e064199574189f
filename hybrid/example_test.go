package hybrid_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
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
