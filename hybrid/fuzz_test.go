package hybrid_test

import (
	"context"
	"testing"

	"github.com/hybridlimit/hybridlimit/hybrid"
)

// FuzzAllowKey: any key and any n get a decision or a clear error, never a
// panic, and a key's bucket stays within [0, burst] and runs dry. The seed
// corpus runs with the normal tests; `go test -fuzz FuzzAllowKey ./hybrid`
// explores further.
func FuzzAllowKey(f *testing.F) {
	for _, k := range oddKeys {
		if len(k) < 1024 {
			f.Add(k, 1)
		}
	}
	f.Add("user-42", 3)
	f.Add("k", 0)
	f.Add("k", -7)
	f.Add("k", 1<<30)
	const burst = 3
	l, err := hybrid.New(hybrid.Config{Limits: []hybrid.Limit{
		{Name: "l", Rate: 1e-6, Burst: burst, Mode: hybrid.Local, OnOutage: hybrid.FailClosed},
	}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = l.Close(context.Background()) })
	f.Fuzz(func(t *testing.T, key string, n int) {
		ctx := context.Background()
		d, err := l.AllowN(ctx, "l", key, n)
		switch {
		case n < 1 || n > burst:
			if err == nil || d.Allowed {
				t.Fatalf("AllowN(%q, %d) = %+v, %v: want a non-admission and an error", key, n, d, err)
			}
			return
		case err != nil:
			t.Fatalf("AllowN(%q, %d): %v", key, n, err)
		}
		if d.Remaining < 0 || d.Remaining > burst {
			t.Fatalf("Remaining %d outside [0, %d]", d.Remaining, burst)
		}
		// At a rate of one token a million seconds, the key runs dry
		// within burst more decisions.
		for range burst + 1 {
			if d, _ = l.Allow(ctx, "l", key); !d.Allowed {
				return
			}
		}
		t.Fatalf("key %q admitted more than its burst", key)
	})
}
