package membership_test

import (
	"fmt"
	"log"

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
