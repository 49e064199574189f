package main

import (
	"context"
	"strings"
	"testing"

	"github.com/hybridlimit/hybridlimit/hybrid"
)

// FuzzParseLimits: any bytes give either limits that hybrid.New accepts or
// an error that names the file and a line, never a panic. The seed corpus
// (testdata/fuzz/FuzzParseLimits and the seeds below) runs with the normal
// tests; `go test -fuzz FuzzParseLimits ./cmd/demo` explores further.
func FuzzParseLimits(f *testing.F) {
	f.Add([]byte("- {name: api, rate: 300, burst: 30, mode: hybrid, on_outage: fail-local}\n"))
	f.Add([]byte("- name: login\n  rate: 20\n  burst: 10\n  mode: hybrid\n"))
	f.Add([]byte("- name: x\n  rate: -1\n  burst: 0\n  mode: nope\n  on_outage: fail-open\n  extra: 1\n"))
	f.Add([]byte("{}"))
	f.Add([]byte("- [1, 2]\n- \"\\xff\"\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		limits, err := parseLimits("limits.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "limits.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		l, err := hybrid.New(hybrid.Config{Limits: localOnly(limits)})
		if err != nil {
			t.Fatalf("parsed limits %+v rejected by hybrid.New: %v", limits, err)
		}
		_ = l.Close(context.Background())
	})
}

// localOnly turns every limit Local, so that hybrid.New needs no Redis to
// validate the rest.
func localOnly(limits []hybrid.Limit) []hybrid.Limit {
	out := make([]hybrid.Limit, len(limits))
	for i, l := range limits {
		l.Mode = hybrid.Local
		out[i] = l
	}
	return out
}
