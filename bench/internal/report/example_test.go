package report_test

import (
	"fmt"

	"github.com/hybridlimit/hybridlimit/bench/internal/report"
)

// A strategy that failed open through an outage admitted more in one second
// than a limit of 1000/s with a burst of 100 allows.
func ExampleWindow_Over() {
	w := report.Window{WidthNS: 1e9, Admitted: 1430, Reference: 1099, Bound: 1000 + 100}
	fmt.Println(w.Over())
	// Output: true
}

// An instance left and another joined during a run of 4 instances on one key
// of 1000/s with a burst of 100: invariant 1 allows one lease's worth (a
// fair share) more per instance per change, 2 x 4 x (1000/4 + 100/4) = 2200
// in a 1 s window.
func ExampleWindow_OverAllowance() {
	w := report.Window{WidthNS: 1e9, Admitted: 1500, Bound: 1000 + 100, Allowance: 2200}
	fmt.Println(w.Over(), w.OverAllowance())
	// Output: true false
}
