package grpclimit_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybridlimit/grpclimit"
	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	check = "/grpc.health.v1.Health/Check" // unary
	watch = "/grpc.health.v1.Health/Watch" // server streaming
	// slow is a rate at which no token comes back during a test.
	slow = 0.01
)

// newLimiter starts a Limiter and closes it in t.Cleanup.
func newLimiter(t *testing.T, cfg hybrid.Config) *hybrid.Limiter {
	t.Helper()
	l, err := hybrid.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// local is a Limiter with one Local limit "api" of the given rate and burst.
func local(t *testing.T, rate float64, burst int) *hybrid.Limiter {
	t.Helper()
	return newLimiter(t, hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: rate, Burst: burst, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
}

// server is a real gRPC server on 127.0.0.1 serving the health service, and
// a client connected to it.
type server struct {
	client healthpb.HealthClient
	// handled counts the calls and streams that got past the interceptors
	// under test to the service.
	handled atomic.Int64
}

// start serves the health service behind the interceptors under test on a
// free port of 127.0.0.1; both are stopped in t.Cleanup.
func start(t *testing.T, unary grpc.UnaryServerInterceptor, stream grpc.StreamServerInterceptor, dial ...grpc.DialOption) *server {
	t.Helper()
	s := &server{}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(unary, func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			s.handled.Add(1)
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(stream, func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			s.handled.Add(1)
			return h(srv, ss)
		}),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	dial = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...)
	conn, err := grpc.NewClient(lis.Addr().String(), dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	s.client = healthpb.NewHealthClient(conn)
	return s
}

// both starts a server with the unary and the stream interceptor of the same
// limit and options.
func both(t *testing.T, l *hybrid.Limiter, limit string, opts ...grpclimit.Option) *server {
	t.Helper()
	return start(t,
		grpclimit.UnaryServerInterceptor(l, limit, byKey, opts...),
		grpclimit.StreamServerInterceptor(l, limit, byKey, opts...))
}

var byKey = grpclimit.ByMetadata("x-key")

// as is a context for a call keyed by key ("" for none).
func as(t *testing.T, key string) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	if key == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "x-key", key)
}

// eventually polls cond until it holds, failing the test after within.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// answer is what a client saw of one call.
type answer struct {
	code codes.Code
	// retryInfo is the RetryInfo delay, -1 without one.
	retryInfo time.Duration
	// pushback is the grpc-retry-pushback-ms trailer, "" without one.
	pushback string
}

func answerOf(err error, trailer metadata.MD) answer {
	a := answer{code: status.Code(err), retryInfo: -1}
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			a.retryInfo = ri.GetRetryDelay().AsDuration()
		}
	}
	if v := trailer.Get("grpc-retry-pushback-ms"); len(v) > 0 {
		a.pushback = v[0]
	}
	return a
}

// method calls one of the health service's methods through the client, the
// way the table tests need: unary Check, or server-streaming Watch until its
// first message.
type method func(t *testing.T, s *server, ctx context.Context) answer

func unary(t *testing.T, s *server, ctx context.Context) answer {
	t.Helper()
	var trailer metadata.MD
	_, err := s.client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	return answerOf(err, trailer)
}

func streaming(t *testing.T, s *server, ctx context.Context) answer {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the Watch
	stream, err := s.client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return answerOf(err, nil)
	}
	if _, err = stream.Recv(); err == nil {
		return answerOf(nil, nil)
	}
	return answerOf(err, stream.Trailer())
}

var methods = []struct {
	name string
	call method
}{
	{"unary", unary},
	{"stream", streaming},
}

// checkRetry checks a refusal's retry delay: RetryInfo in (0, most] and the
// pushback, its milliseconds rounded up.
func checkRetry(t *testing.T, a answer, most time.Duration) {
	t.Helper()
	if a.retryInfo <= 0 || a.retryInfo > most {
		t.Errorf("RetryInfo delay %v, want one in (0, %v]", a.retryInfo, most)
	}
	want := strconv.FormatInt(int64((a.retryInfo+time.Millisecond-1)/time.Millisecond), 10)
	if a.pushback != want {
		t.Errorf("pushback %q, want %q (the RetryInfo delay %v in ms, rounded up)", a.pushback, want, a.retryInfo)
	}
}

// TestDenial: a limit's denial is ResourceExhausted with the wait in
// RetryInfo and in the pushback trailer, the handler is not called, and keys
// are limited apart.
func TestDenial(t *testing.T) {
	for _, m := range methods {
		t.Run(m.name, func(t *testing.T) {
			s := both(t, local(t, slow, 2), "api")
			for i, step := range []struct {
				key  string
				code codes.Code
			}{
				{"alice", codes.OK},
				{"alice", codes.OK},
				{"alice", codes.ResourceExhausted},
				{"bob", codes.OK},
				{"alice", codes.ResourceExhausted},
			} {
				a := m.call(t, s, as(t, step.key))
				if a.code != step.code {
					t.Fatalf("call %d (%s): %v, want %v", i, step.key, a.code, step.code)
				}
				if step.code == codes.OK {
					if a.retryInfo != -1 || a.pushback != "" {
						t.Errorf("call %d: an admission with RetryInfo %v, pushback %q", i, a.retryInfo, a.pushback)
					}
					continue
				}
				checkRetry(t, a, time.Duration(1/slow)*time.Second)
			}
			if got := s.handled.Load(); got != 3 {
				t.Errorf("%d calls reached the service, want the 3 admitted", got)
			}
		})
	}
}

// TestRefusals: each way a call is refused without a denial by the limit,
// for calls and streams alike.
func TestRefusals(t *testing.T) {
	cost := func(n int) grpclimit.Option {
		return grpclimit.WithCost(func(context.Context, string) int { return n })
	}
	for _, tc := range []struct {
		name     string
		limit    string
		key      string
		opts     []grpclimit.Option
		close    bool
		remove   bool // SetLimits removes the limit once the interceptors are built
		code     codes.Code
		pushback string
	}{
		// Waiting can never help: no RetryInfo, and the pushback says so.
		{name: "cost above burst", limit: "api", key: "k", opts: []grpclimit.Option{cost(4)}, code: codes.ResourceExhausted, pushback: "-1"},
		{name: "cost 0", limit: "api", key: "k", opts: []grpclimit.Option{cost(0)}, code: codes.Internal},
		{name: "limit removed", limit: "api", key: "k", remove: true, code: codes.Internal},
		{name: "closed limiter", limit: "api", key: "k", close: true, code: codes.Unavailable},
		{name: "empty key denied", limit: "api", opts: []grpclimit.Option{grpclimit.WithEmptyKey(grpclimit.EmptyKeyReject)}, code: codes.Unauthenticated},
	} {
		for _, m := range methods {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				l := local(t, slow, 3)
				s := both(t, l, tc.limit, tc.opts...)
				if tc.close {
					if err := l.Close(context.Background()); err != nil {
						t.Fatal(err)
					}
				}
				if tc.remove {
					other := hybrid.Limit{Name: "other", Rate: slow, Burst: 3, Mode: hybrid.Local, OnOutage: hybrid.FailLocal}
					if err := l.SetLimits([]hybrid.Limit{other}); err != nil {
						t.Fatal(err)
					}
				}
				a := m.call(t, s, as(t, tc.key))
				if a.code != tc.code || a.pushback != tc.pushback || a.retryInfo != -1 {
					t.Errorf("got %v, pushback %q, RetryInfo %v; want %v, pushback %q, no RetryInfo",
						a.code, a.pushback, a.retryInfo, tc.code, tc.pushback)
				}
				if got := s.handled.Load(); got != 0 {
					t.Errorf("%d calls reached the service, want none", got)
				}
			})
		}
	}
}

// TestCost: a call takes the tokens its cost says, per method.
func TestCost(t *testing.T) {
	cost := grpclimit.WithCost(func(_ context.Context, fullMethod string) int {
		if fullMethod == watch {
			return 3
		}
		return 1
	})
	s := both(t, local(t, slow, 5), "api", cost)
	for i, step := range []struct {
		call method
		code codes.Code
	}{
		{streaming, codes.OK}, // 2 left
		{streaming, codes.ResourceExhausted},
		{unary, codes.OK}, // 1 left
		{unary, codes.OK}, // 0 left
		{unary, codes.ResourceExhausted},
	} {
		if a := step.call(t, s, as(t, "k")); a.code != step.code {
			t.Fatalf("call %d: %v, want %v", i, a.code, step.code)
		}
	}
}

// TestSkipMethods: skipped methods and services are neither limited nor
// keyed; the others are.
func TestSkipMethods(t *testing.T) {
	for _, tc := range []struct {
		skip        []string
		checkLimits bool
		watchLimits bool
	}{
		{nil, true, true},
		{[]string{"/grpc.health.v1.Health/"}, false, false},
		{[]string{check}, false, true},
		{[]string{watch}, true, false},
		{[]string{"/grpc.health.v1.Health/Che"}, true, true}, // names are exact
		{[]string{"/grpc.health.v1.Healt/"}, true, true},     // services too
		{[]string{"/other.Service/", check}, false, true},
	} {
		name := strings.Join(tc.skip, ",")
		if name == "" {
			name = "none"
		}
		t.Run(name, func(t *testing.T) {
			var keyed atomic.Int64
			key := func(ctx context.Context, fullMethod string) string {
				keyed.Add(1)
				return "k"
			}
			l := local(t, slow, 1)
			opts := []grpclimit.Option{grpclimit.WithSkipMethods(tc.skip...)}
			s := start(t, grpclimit.UnaryServerInterceptor(l, "api", key, opts...), grpclimit.StreamServerInterceptor(l, "api", key, opts...))
			// One token for both methods: the second limited call is
			// refused.
			limited, calls := 0, 0
			for _, c := range []struct {
				call    method
				limited bool
			}{{unary, tc.checkLimits}, {streaming, tc.watchLimits}, {unary, tc.checkLimits}, {streaming, tc.watchLimits}} {
				a := c.call(t, s, as(t, "k"))
				calls++
				want := codes.OK
				if c.limited {
					limited++
					if limited > 1 {
						want = codes.ResourceExhausted
					}
				}
				if a.code != want {
					t.Fatalf("call %d: %v, want %v", calls, a.code, want)
				}
			}
			if int(keyed.Load()) != limited {
				t.Errorf("KeyFunc called %d times, want %d (only for limited calls)", keyed.Load(), limited)
			}
		})
	}
}

// TestEmptyKey: calls without a key share one key, are refused, or are not
// limited, as chosen; calls with a key are limited as usual.
func TestEmptyKey(t *testing.T) {
	for _, tc := range []struct {
		empty grpclimit.EmptyKey
		codes []codes.Code // of three calls without a key
	}{
		{grpclimit.EmptyKeyShared, []codes.Code{codes.OK, codes.ResourceExhausted, codes.ResourceExhausted}},
		{grpclimit.EmptyKeyReject, []codes.Code{codes.Unauthenticated, codes.Unauthenticated, codes.Unauthenticated}},
		{grpclimit.EmptyKeySkip, []codes.Code{codes.OK, codes.OK, codes.OK}},
	} {
		for _, m := range methods {
			t.Run(tc.empty.String()+"/"+m.name, func(t *testing.T) {
				s := both(t, local(t, slow, 1), "api", grpclimit.WithEmptyKey(tc.empty))
				for i, want := range tc.codes {
					if a := m.call(t, s, as(t, "")); a.code != want {
						t.Fatalf("call %d without a key: %v, want %v", i, a.code, want)
					}
				}
				for i, want := range []codes.Code{codes.OK, codes.ResourceExhausted} {
					if a := m.call(t, s, as(t, "alice")); a.code != want {
						t.Fatalf("call %d with a key: %v, want %v", i, a.code, want)
					}
				}
			})
		}
	}
}

// TestFailClosed: while Redis is down, a FailClosed limit answers
// Unavailable with a retry delay, not ResourceExhausted, so a client can
// tell an outage from its own excess; the delay is
// hybrid.DefaultOutageRetryAfter, or WithOutageRetryAfter's, so that
// clients do not retry an outage every tick.
func TestFailClosed(t *testing.T) {
	srv := redistest.Start(t)
	l := newLimiter(t, hybrid.Config{
		Redis: srv.Client(t),
		Limits: []hybrid.Limit{
			{Name: "login", Rate: 100, Burst: 10, Mode: hybrid.Global, OnOutage: hybrid.FailClosed},
		},
	})
	s := both(t, l, "login")
	custom := both(t, l, "login", grpclimit.WithOutageRetryAfter(time.Minute))
	for _, m := range methods {
		if a := m.call(t, s, as(t, "alice")); a.code != codes.OK {
			t.Fatalf("%s with Redis up: %v, want OK", m.name, a.code)
		}
	}
	srv.Kill(t)
	// The first decision after the kill finds Redis gone.
	eventually(t, 10*time.Second, "the limit degrades", func() bool {
		unary(t, s, as(t, "alice"))
		st, err := l.Status("login")
		if err != nil {
			t.Fatal(err)
		}
		return st.Degraded
	})
	for _, m := range methods {
		a := m.call(t, s, as(t, "alice"))
		if a.code != codes.Unavailable {
			t.Fatalf("%s with Redis down: %v, want Unavailable", m.name, a.code)
		}
		checkRetry(t, a, hybrid.DefaultOutageRetryAfter)
		if a.retryInfo != hybrid.DefaultOutageRetryAfter {
			t.Errorf("%s: retry delay %v of a fail-closed outage; want %v", m.name, a.retryInfo, hybrid.DefaultOutageRetryAfter)
		}
		if a := m.call(t, custom, as(t, "alice")); a.code != codes.Unavailable || a.retryInfo != time.Minute {
			t.Errorf("%s with WithOutageRetryAfter(1m): %v after %v; want Unavailable after 1m", m.name, a.code, a.retryInfo)
		}
	}
}

// TestClientRetriesAfterPushback: a grpc-go client whose retry policy lists
// RESOURCE_EXHAUSTED waits for the pushback, not its own backoff (an hour
// here), and its retry is admitted.
func TestClientRetriesAfterPushback(t *testing.T) {
	const config = `{"methodConfig": [{
		"name": [{"service": "grpc.health.v1.Health"}],
		"retryPolicy": {
			"maxAttempts": 2,
			"initialBackoff": "3600s",
			"maxBackoff": "3600s",
			"backoffMultiplier": 1,
			"retryableStatusCodes": ["RESOURCE_EXHAUSTED"]
		}
	}]}`
	l := local(t, 5, 1) // a token every 200ms
	s := start(t,
		grpclimit.UnaryServerInterceptor(l, "api", byKey),
		grpclimit.StreamServerInterceptor(l, "api", byKey),
		grpc.WithDefaultServiceConfig(config))
	if a := unary(t, s, as(t, "k")); a.code != codes.OK {
		t.Fatalf("first call: %v", a.code)
	}
	ctx, cancel := context.WithTimeout(as(t, "k"), 10*time.Second)
	defer cancel()
	begun := time.Now()
	if _, err := s.client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("second call, retried after the pushback: %v", err)
	}
	if took := time.Since(begun); took < 100*time.Millisecond {
		t.Errorf("second call admitted after %v: it should have waited for the next token", took)
	}
}

// TestConcurrentCalls: concurrent calls on one key admit exactly the burst.
func TestConcurrentCalls(t *testing.T) {
	const burst, calls = 10, 40
	s := both(t, local(t, slow, burst), "api")
	var wg sync.WaitGroup
	var ok, exhausted atomic.Int64
	for i := range calls {
		call := methods[i%2].call
		wg.Go(func() {
			switch a := call(t, s, as(t, "k")); a.code {
			case codes.OK:
				ok.Add(1)
			case codes.ResourceExhausted:
				exhausted.Add(1)
			default:
				t.Errorf("unexpected %v", a.code)
			}
		})
	}
	wg.Wait()
	if ok.Load() != burst || exhausted.Load() != calls-burst {
		t.Errorf("%d admitted, %d refused; want %d and %d", ok.Load(), exhausted.Load(), burst, calls-burst)
	}
}

// TestByPeerIP: over TCP on 127.0.0.1, the key is the client's address
// without its port; addresses without an IP give no key.
func TestByPeerIP(t *testing.T) {
	got := make(chan string, 1)
	key := func(ctx context.Context, fullMethod string) string {
		k := grpclimit.ByPeerIP(ctx, fullMethod)
		got <- k
		return k
	}
	l := local(t, slow, 1)
	s := start(t, grpclimit.UnaryServerInterceptor(l, "api", key), grpclimit.StreamServerInterceptor(l, "api", key))
	if a := unary(t, s, as(t, "")); a.code != codes.OK {
		t.Fatal(a.code)
	}
	if k := <-got; k != "127.0.0.1" {
		t.Errorf("key %q, want 127.0.0.1", k)
	}

	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 4000}, "192.0.2.1"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.1"), Port: 4000}, "192.0.2.1"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 4000}, "2001:db8::1"},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 4000, Zone: "eth0"}, "fe80::1"},
		{&net.UnixAddr{Name: "/run/app.sock", Net: "unix"}, ""},
		{&net.UnixAddr{Name: "@", Net: "unix"}, ""},
		{nil, ""},
	} {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: tc.addr})
		if got := grpclimit.ByPeerIP(ctx, check); got != tc.want {
			t.Errorf("ByPeerIP(%v) = %q, want %q", tc.addr, got, tc.want)
		}
	}
	if got := grpclimit.ByPeerIP(context.Background(), check); got != "" {
		t.Errorf("ByPeerIP without a peer = %q, want \"\"", got)
	}
}

// TestByMetadata: the first value of the field, whatever the case of its
// name; "" without one.
func TestByMetadata(t *testing.T) {
	key := grpclimit.ByMetadata("X-Key")
	for _, tc := range []struct {
		md   metadata.MD
		want string
	}{
		{metadata.Pairs("x-key", "alice"), "alice"},
		{metadata.Pairs("X-Key", "alice"), "alice"},
		{metadata.Pairs("x-key", "alice", "x-key", "bob"), "alice"},
		{metadata.Pairs("x-other", "alice"), ""},
		{nil, ""},
	} {
		if got := key(metadata.NewIncomingContext(context.Background(), tc.md), check); got != tc.want {
			t.Errorf("ByMetadata(%v) = %q, want %q", tc.md, got, tc.want)
		}
	}
}

// TestPanics: arguments that could never work fail when the interceptor is
// built, not on its first call.
func TestPanics(t *testing.T) {
	l := local(t, slow, 1)
	for name, f := range map[string]func(){
		"nil limiter":          func() { grpclimit.UnaryServerInterceptor(nil, "api", byKey) },
		"nil key":              func() { grpclimit.StreamServerInterceptor(l, "api", nil) },
		"service without /":    func() { grpclimit.WithSkipMethods("grpc.health.v1.Health") },
		"just /":               func() { grpclimit.WithSkipMethods("/") },
		"one bad name of many": func() { grpclimit.WithSkipMethods(check, "Watch") },
		"unknown EmptyKey":     func() { grpclimit.WithEmptyKey(grpclimit.EmptyKey(3)) },
		"unknown limit":        func() { grpclimit.UnaryServerInterceptor(l, "apii", byKey) },
		"unknown stream limit": func() { grpclimit.StreamServerInterceptor(l, "apii", byKey) },
		"unknown WithLimit":    func() { grpclimit.UnaryServerInterceptor(l, "api", byKey, grpclimit.WithLimit("apii", byKey)) },
		"nil WithLimit key":    func() { grpclimit.UnaryServerInterceptor(l, "api", byKey, grpclimit.WithLimit("api", nil)) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f()
		})
	}
}

// TestLimitsAllOrNone: an interceptor with a per-client limit of 1 and a
// per-method limit of 2 (WithLimit) charges them all-or-none, against a
// real Redis in Global and Hybrid mode and in process in Local mode.
// alice's second call is denied by her limit and the method gets its
// token back, so bob's call is still admitted; carol is denied by the
// method, and her own limit gets its token back.
func TestLimitsAllOrNone(t *testing.T) {
	srv := redistest.Start(t)
	byMethod := func(_ context.Context, fullMethod string) string { return fullMethod }
	for _, mode := range []hybrid.Mode{hybrid.Local, hybrid.Global, hybrid.Hybrid} {
		t.Run(mode.String(), func(t *testing.T) {
			l := newLimiter(t, hybrid.Config{Redis: srv.Client(t), Limits: []hybrid.Limit{
				{Name: "client", Rate: slow, Burst: 1, Mode: mode, OnOutage: hybrid.FailClosed},
				{Name: "method", Rate: slow, Burst: 2, Mode: mode, OnOutage: hybrid.FailClosed},
			}})
			s := start(t, grpclimit.UnaryServerInterceptor(l, "client", byKey, grpclimit.WithLimit("method", byMethod)),
				grpclimit.StreamServerInterceptor(l, "client", byKey, grpclimit.WithLimit("method", byMethod)))
			for i, step := range []struct {
				key  string
				code codes.Code
			}{
				{"alice", codes.OK},
				{"alice", codes.ResourceExhausted},
				{"bob", codes.OK},
				{"carol", codes.ResourceExhausted},
			} {
				if a := unary(t, s, as(t, step.key)); a.code != step.code {
					t.Errorf("call %d (%s): %v, want %v", i, step.key, a.code, step.code)
				}
			}
			if d, err := l.Allow(context.Background(), "client", "carol"); err != nil || !d.Allowed {
				t.Errorf("carol's own limit after the method denied her: %+v, %v; want her token back", d, err)
			}
			if got := s.handled.Load(); got != 2 {
				t.Errorf("%d calls reached the service, want the 2 admitted", got)
			}
		})
	}
}
