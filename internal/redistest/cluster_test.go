package redistest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

func TestClusterServesEverySlot(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	cc := c.Client(t)
	ctx := context.Background()
	for i := range 100 {
		if err := cc.Set(ctx, fmt.Sprint("k", i), i, 0).Err(); err != nil {
			t.Fatalf("SET k%d: %v", i, err)
		}
	}
	// Keys spread over the masters: each got some.
	for _, m := range c.Masters {
		n, err := m.Client(t).DBSize(ctx).Result()
		if err != nil || n == 0 {
			t.Errorf("master %s holds %d keys (%v)", m.Addr, n, err)
		}
	}
}
