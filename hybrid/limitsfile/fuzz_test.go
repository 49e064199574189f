package limitsfile_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/hybrid/limitsfile"
)

// FuzzParse: any bytes give either limits that hybrid.New accepts or an
// error that wraps ErrInvalid and whose every line names the file, never a
// panic. The seed corpus (testdata/fuzz/FuzzParse and the seeds below) runs
// with the normal tests; `go test -fuzz FuzzParse ./hybrid/limitsfile`
// explores further.
func FuzzParse(f *testing.F) {
	f.Add([]byte("- {name: api, rate: 300, burst: 30, mode: hybrid, on_outage: fail-local}\n"))
	f.Add([]byte("- {name: api, rate: 1/day, burst: 30, mode: hybrid, on_outage: fail-local, shadow: true}\n"))
	f.Add([]byte("- {name: api, rate: 5_000 / Hours, burst: 30, mode: hybrid, on_outage: fail-local, shadow: yes}\n"))
	f.Add([]byte("- name: login\n  rate: 20\n  burst: 10\n  mode: hybrid\n"))
	f.Add([]byte("- name: x\n  rate: -1/min\n  burst: 0\n  mode: nope\n  on_outage: fail-open\n  extra: 1\n"))
	f.Add([]byte("- {name: \"a:{b}\", rate: 1e-320/d, burst: 1, mode: local, on_outage: fail-open}\n"))
	f.Add([]byte("{}"))
	f.Add([]byte("- [1, 2]\n- \"\\xff\"\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		limits, err := limitsfile.Parse("limits.yaml", data)
		if err != nil {
			if !errors.Is(err, limitsfile.ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				if !strings.HasPrefix(e.Error(), "limits.yaml") {
					t.Fatalf("error does not name the file: %v", e)
				}
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
// check the rest.
func localOnly(limits []hybrid.Limit) []hybrid.Limit {
	out := make([]hybrid.Limit, len(limits))
	for i, l := range limits {
		l.Mode = hybrid.Local
		out[i] = l
	}
	return out
}
