package grpclimit_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybridlimit/grpclimit"
	"github.com/hybridlimit/hybridlimit/hybrid"
)

// The examples use Local limits, which need neither Redis nor a cluster, so
// that they run anywhere. The first two run a real gRPC server; the others
// call an interceptor directly, with a stand-in handler, to show what an
// option decides.

func ExampleUnaryServerInterceptor() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: 1, Burst: 2, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	// Limit every call by its x-api-key metadata.
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		grpclimit.UnaryServerInterceptor(l, "api", grpclimit.ByMetadata("x-api-key")),
	))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "alice")
	for range 3 {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		st := status.Convert(err)
		fmt.Print(st.Code())
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				// At 1 token/s the next one is about a second away.
				fmt.Print(", retry in about ", ri.GetRetryDelay().AsDuration().Round(time.Second))
			}
		}
		fmt.Println()
	}
	// Output:
	// OK
	// OK
	// ResourceExhausted, retry in about 1s
}

func ExampleStreamServerInterceptor() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "watch", Rate: 0.1, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	// A stream is one call: it is admitted or refused when it opens.
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(
		grpclimit.StreamServerInterceptor(l, "watch", grpclimit.ByPeerIP),
	))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 2 {
		stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			log.Fatal(err)
		}
		// A refusal arrives with the first message.
		resp, err := stream.Recv()
		if err != nil {
			fmt.Println(status.Code(err))
			continue
		}
		fmt.Println(resp.GetStatus())
	}
	// Output:
	// SERVING
	// ResourceExhausted
}

// handler stands in for a service's handler in the examples that call an
// interceptor directly.
func handler(context.Context, any) (any, error) { return "ok", nil }

// call runs intercept as gRPC would for fullMethod, and prints the outcome.
func call(ctx context.Context, intercept grpc.UnaryServerInterceptor, fullMethod string) {
	_, err := intercept(ctx, nil, &grpc.UnaryServerInfo{FullMethod: fullMethod}, handler)
	fmt.Printf("%s: %v\n", fullMethod, status.Code(err))
}

func ExampleWithCost() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: 0.01, Burst: 10, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	// An export costs 8 tokens, anything else 1; the burst is 10.
	cost := func(_ context.Context, fullMethod string) int {
		if fullMethod == "/shop.Orders/Export" {
			return 8
		}
		return 1
	}
	intercept := grpclimit.UnaryServerInterceptor(l, "api", grpclimit.ByMetadata("x-api-key"), grpclimit.WithCost(cost))
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "alice"))
	call(ctx, intercept, "/shop.Orders/Export")
	call(ctx, intercept, "/shop.Orders/Get")
	call(ctx, intercept, "/shop.Orders/Export")
	call(ctx, intercept, "/shop.Orders/Get")
	// Output:
	// /shop.Orders/Export: OK
	// /shop.Orders/Get: OK
	// /shop.Orders/Export: ResourceExhausted
	// /shop.Orders/Get: OK
}

func ExampleWithSkipMethods() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: 0.01, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	// Health checks and the server's own status method are never limited.
	intercept := grpclimit.UnaryServerInterceptor(l, "api", grpclimit.ByMetadata("x-api-key"),
		grpclimit.WithSkipMethods("/grpc.health.v1.Health/", "/shop.Admin/Status"))
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "probe"))
	for _, m := range []string{
		"/shop.Orders/Get", "/shop.Orders/Get",
		"/grpc.health.v1.Health/Check", "/shop.Admin/Status", "/shop.Admin/Reset",
	} {
		call(ctx, intercept, m)
	}
	// Output:
	// /shop.Orders/Get: OK
	// /shop.Orders/Get: ResourceExhausted
	// /grpc.health.v1.Health/Check: OK
	// /shop.Admin/Status: OK
	// /shop.Admin/Reset: ResourceExhausted
}

func ExampleWithEmptyKey() {
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "api", Rate: 0.01, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	anonymous := context.Background() // no x-api-key
	for _, e := range []grpclimit.EmptyKey{grpclimit.EmptyKeyShared, grpclimit.EmptyKeyReject, grpclimit.EmptyKeySkip} {
		intercept := grpclimit.UnaryServerInterceptor(l, "api", grpclimit.ByMetadata("x-api-key"), grpclimit.WithEmptyKey(e))
		fmt.Println(e)
		call(anonymous, intercept, "/shop.Orders/Get")
		call(anonymous, intercept, "/shop.Orders/Get")
	}
	// Output:
	// shared
	// /shop.Orders/Get: OK
	// /shop.Orders/Get: ResourceExhausted
	// reject
	// /shop.Orders/Get: Unauthenticated
	// /shop.Orders/Get: Unauthenticated
	// skip
	// /shop.Orders/Get: OK
	// /shop.Orders/Get: OK
}

func ExampleByMetadata() {
	key := grpclimit.ByMetadata("X-Api-Key")
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "alice"))
	fmt.Printf("%q\n", key(ctx, "/shop.Orders/Get"))
	fmt.Printf("%q\n", key(context.Background(), "/shop.Orders/Get"))
	// Output:
	// "alice"
	// ""
}

func ExampleByPeerIP() {
	// gRPC puts the connection's peer in the context of every call.
	ctx := peer.NewContext(context.Background(), &peer.Peer{
		Addr: &net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 51234},
	})
	fmt.Printf("%q\n", grpclimit.ByPeerIP(ctx, "/shop.Orders/Get"))
	fmt.Printf("%q\n", grpclimit.ByPeerIP(context.Background(), "/shop.Orders/Get"))
	// Output:
	// "192.0.2.7"
	// ""
}
