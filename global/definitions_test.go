package global_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/global"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// Definitions returns every live instance's definition, its caller's
// included; a record ends its ttl after its last write and is deleted;
// limits do not see each other's.
func TestDefinitions(t *testing.T) {
	srv := redistest.Start(t)
	s := global.New(srv.Client(t), "defs")
	ctx := context.Background()
	if _, err := s.Definitions(ctx, "api", "a", "rate=1", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Definitions(ctx, "api", "b", "rate=2", 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	got, err := s.Definitions(ctx, "other", "a", "rate=3", time.Hour)
	if err != nil || !maps.Equal(got, map[string]string{"a": "rate=3"}) {
		t.Fatalf("another limit: %v, %v", got, err)
	}
	eventually(t, "b's record ends", func() bool {
		got, err := s.Definitions(ctx, "api", "a", "rate=1", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return maps.Equal(got, map[string]string{"a": "rate=1"})
	})
	if n, err := srv.Client(t).HLen(ctx, s.DefinitionsKey("api")).Result(); err != nil || n != 1 {
		t.Errorf("the hash holds %d fields after b's ended (%v), want 1", n, err)
	}
	if _, err := s.Definitions(ctx, "api", "", "rate=1", time.Hour); err == nil {
		t.Error("an empty instance was accepted")
	}
}
