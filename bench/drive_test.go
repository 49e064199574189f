package main

import (
	"slices"
	"testing"

	"github.com/hybridlimit/hybridlimit/bench/internal/report"
	"github.com/hybridlimit/hybridlimit/bench/internal/workload"
)

func TestKeyBands(t *testing.T) {
	// 12 keys: key k has k+1 arrivals, but key 11 none; each admits one
	// less than the reference.
	arrivals, refAdmitted, allowed := make([]int, 12), make([]int, 12), make([]int64, 12)
	for k := range 11 {
		arrivals[k], refAdmitted[k], allowed[k] = k+1, k+1, int64(k)
	}
	for _, tc := range []struct {
		name  string
		zipfS float64
		want  []report.KeyBand
	}{
		// Zipf keys are ranked by index, all of them.
		{"zipf", 1.1, []report.KeyBand{
			{First: 1, Last: 10, Arrivals: 55, ReferenceAllowed: 55, Allowed: 45},
			{First: 11, Last: 12, Arrivals: 11, ReferenceAllowed: 11, Allowed: 10},
		}},
		// Others by their arrivals, the keys without any left out.
		{"by arrivals", 0, []report.KeyBand{
			{First: 1, Last: 10, Arrivals: 65, ReferenceAllowed: 65, Allowed: 55},
			{First: 11, Last: 11, Arrivals: 1, ReferenceAllowed: 1, Allowed: 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := openLoop{sc: workload.Scenario{Keys: 12, ZipfS: tc.zipfS},
				ref: workload.Reference{KeyArrivals: arrivals, KeyAdmitted: refAdmitted}}
			got := o.keyBands(allowed)
			for i := range got {
				got[i].Accuracy = 0
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
