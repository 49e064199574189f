//go:build !unix

package hybrid_test

import "time"

// cpuTime reports that the CPU time the process has used cannot be told
// here.
func cpuTime() (time.Duration, bool) { return 0, false }
