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
