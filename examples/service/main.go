// Command service is the README's embedding example, whole: an HTTP
// service that limits each API key (or, without one, each client address
// behind trusted load balancers) across all its instances, skips its health
// check, charges writes more than reads, and shuts down gracefully.
package main

import (
	"context"
	"errors"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/membership"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	rdb := redis.NewClient(&redis.Options{Addr: "redis:6379", ContextTimeoutEnabled: true})
	defer rdb.Close() // after the Limiter, which does not close it
	members, err := membership.Join(membership.Config{BindPort: 7946, Seeds: []string{"api-members:7946"}})
	if err != nil {
		return err
	}
	// 100 requests a second per client across every instance, bursts of 50;
	// while Redis is down each instance admits its share (or read the
	// limits from a file with limitsfile.Load).
	api := hybrid.Limit{Name: "api", Rate: 100, Burst: 50, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal}
	lim, err := hybrid.New(hybrid.DefaultConfig(rdb, members, api))
	if err != nil {
		return err
	}

	// The client is its API key; without one, its address. X-Forwarded-For
	// is read only from the load balancers' own addresses.
	clientIP, err := hybrid.ClientIP("X-Forwarded-For", "10.0.0.0/8")
	if err != nil {
		return err
	}
	limit := hybrid.Middleware(lim, "api",
		hybrid.KeyFirst(hybrid.KeyHeader("X-Api-Key"), clientIP),
		hybrid.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		hybrid.WithCost(func(r *http.Request) int {
			if r.Method == http.MethodPost {
				return 5 // a write costs five reads
			}
			return 1
		}),
	)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello\n")) })
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {})
	srv := &http.Server{Addr: ":8080", Handler: limit(mux)}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			log.Fatal(err)
		}
	}()
	<-ctx.Done()
	// Finish the requests in flight, then release the leases in one round
	// trip and leave the cluster, so that the others take the shares at once.
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	return lim.Close(shutdown)
}
