package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/membership"
)

// TestLookupByName decides under every limit of a Limiter by its name, with
// few limits (found by comparing names in order) and many (found in a map),
// and checks that each decision is its own limit's: limit i has burst i+1,
// so i+1 tokens are admitted whole and i+2 exceed its burst. Names that are
// prefixes of others, and unknown names, must not be confused.
func TestLookupByName(t *testing.T) {
	for _, count := range []int{1, 2, 8, 9, 20} {
		t.Run(fmt.Sprint("limits=", count), func(t *testing.T) {
			cfg := hybrid.Config{Members: membership.NewStatic("lookup-1", 1)}
			for i := range count {
				cfg.Limits = append(cfg.Limits, hybrid.Limit{Name: fmt.Sprint("l", i), Rate: 1, Burst: i + 1, Mode: hybrid.Local, OnOutage: hybrid.FailLocal})
			}
			l := newLimiter(t, cfg)
			ctx := context.Background()
			for i := range count {
				name := fmt.Sprint("l", i)
				if d, err := l.AllowN(ctx, name, "k", i+1); err != nil || !d.Allowed {
					t.Errorf("%s: %d tokens: %+v, %v; want admitted", name, i+1, d, err)
				}
				if _, err := l.AllowN(ctx, name, "k", i+2); !errors.Is(err, hybrid.ErrExceedsBurst) {
					t.Errorf("%s: %d tokens: %v; want ErrExceedsBurst", name, i+2, err)
				}
			}
			for _, name := range []string{"", "l", fmt.Sprint("l", count), "l00"} {
				if _, err := l.Allow(ctx, name, "k"); !errors.Is(err, hybrid.ErrUnknownLimit) {
					t.Errorf("limit %q: %v; want ErrUnknownLimit", name, err)
				}
			}
		})
	}
}
