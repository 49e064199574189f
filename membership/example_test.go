package membership_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"time"

	"github.com/hybridlimit/hybridlimit/membership"
)

func ExampleNewStatic() {
	c := membership.NewStatic("api-1", 4)
	fmt.Println(c.Name(), c.Count())

	changed := make(chan int)
	stop := c.Watch(func(n int) { changed <- n })
	c.Set(5)
	fmt.Println("count is now", <-changed)
	stop()
	// Output:
	// api-1 4
	// count is now 5
}

func ExampleJoin() {
	// Tests and examples bind to loopback on a free port; a production node
	// starts from membership.DefaultConfig() and lists Seeds.
	m, err := membership.Join(membership.Config{
		Name:     "api-1",
		BindAddr: "127.0.0.1",
		Profile:  membership.Local,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	// Other instances would join with Seeds: []string{m.Addr()}.
	fmt.Println(m.Name(), m.Count() == 1, m.Members())
	// Output:
	// api-1 true [api-1]
}

func ExampleJoinContext() {
	// The first instance of a deployment.
	first, err := membership.Join(membership.Config{Name: "api-1", BindAddr: "127.0.0.1", Profile: membership.Local})
	if err != nil {
		log.Fatal(err)
	}
	defer first.Close()
	_, port, _ := net.SplitHostPort(first.Addr())

	// The second finds it through a DNS name, resolved at every attempt;
	// here a stand-in for DNS answers. Had the first not been listening
	// yet, JoinContext would have kept trying for up to JoinTimeout.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	second, err := membership.JoinContext(ctx, membership.Config{
		Name:          "api-2",
		BindAddr:      "127.0.0.1",
		Profile:       membership.Local,
		Seeds:         []string{net.JoinHostPort("api.example", port)},
		JoinTimeout:   10 * time.Second,
		RetryInterval: 100 * time.Millisecond,
		Resolve: func(ctx context.Context, host string) ([]string, error) {
			return []string{"127.0.0.1"}, nil
		},
	})
	if errors.Is(err, membership.ErrJoin) {
		log.Fatalf("no seed answered: %v", err)
	} else if err != nil {
		log.Fatal(err)
	}
	defer second.Close()
	fmt.Println(second.Count(), second.Members())
	// Output:
	// 2 [api-1 api-2]
}

func ExampleDefaultConfig() {
	// A production node in Kubernetes: every instance seeds the others
	// through a headless service (with publishNotReadyAddresses: true, so
	// that starting instances are listed), resolved again at every attempt.
	// Join waits up to DefaultJoinTimeout for one of them to answer; a node
	// later left alone tries them again in the background.
	cfg := membership.DefaultConfig()
	cfg.Seeds = []string{"api-members.default.svc.cluster.local"} // port: DefaultPort
	cfg.SecretKey = bytes.Repeat([]byte{0x2a}, 32)                // from a Secret, in real life
	cfg.Logger = slog.Default()

	m, err := membership.Join(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	fmt.Println("instances:", m.Count())
}

func ExampleStatic_Members() {
	// Statics in one process learn each other's names through a Bus, as
	// memberlist nodes do through gossip: each sees the same sorted list,
	// and so the same rank for every member.
	bus := membership.NewBus()
	a, b := membership.NewStatic("api-b", 2), membership.NewStatic("api-a", 2)
	fmt.Println(a.Members())
	a.Connect(bus)
	b.Connect(bus)
	fmt.Println(a.Members(), b.Members())
	// Output:
	// [api-b]
	// [api-a api-b] [api-a api-b]
}

func ExampleStatic_Leave() {
	bus := membership.NewBus()
	a, b := membership.NewStatic("api-1", 2), membership.NewStatic("api-2", 2)
	a.Connect(bus)
	b.Connect(bus)

	views := make(chan membership.View, 1)
	stop := a.WatchView(func(v membership.View) { views <- v })
	defer stop()

	// api-2 shuts down: whatever used b stopped first, then it leaves.
	b.Leave()
	v := <-views
	fmt.Println(v.Count, v.Members, "left:", v.Left)
	// Output:
	// 1 [api-1] left: [api-2]
}

func ExampleMemberlist_WatchView() {
	first, err := membership.Join(membership.Config{Name: "api-1", BindAddr: "127.0.0.1", Profile: membership.Local})
	if err != nil {
		log.Fatal(err)
	}
	defer first.Close()
	second, err := membership.Join(membership.Config{Name: "api-2", BindAddr: "127.0.0.1", Profile: membership.Local,
		Seeds: []string{first.Addr()}})
	if err != nil {
		log.Fatal(err)
	}

	left := make(chan membership.View, 16)
	stop := first.WatchView(func(v membership.View) {
		if len(v.Left) > 0 {
			left <- v
		}
	})
	defer stop()

	// A graceful leave (Close) is reported in Left; a crash never is.
	second.Close()
	v := <-left
	fmt.Println(v.Count, v.Members, "left:", v.Left)
	// Output:
	// 1 [api-1] left: [api-2]
}
