package main

import (
	"errors"
	"fmt"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/hybrid/limitsfile"
)

// defaultLimits are the limits used without -config: one per outage policy.
// They are the ones in limits.yaml beside this file.
func defaultLimits() []hybrid.Limit {
	return []hybrid.Limit{
		{Name: "api", Rate: 300, Burst: 30, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal},
		{Name: "login", Rate: 20, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed},
		{Name: "search", Rate: 200, Burst: 20, Mode: hybrid.Hybrid, OnOutage: hybrid.FailOpen},
	}
}

// loadLimits reads and checks the limits file at path. Its messages name
// the file and line of every problem (package limitsfile); the demo adds
// its own rule for names, which are URL paths here.
func loadLimits(path string) ([]hybrid.Limit, error) {
	return limitsfile.Load(path, limitsfile.CheckName(servable))
}

// servable says what is wrong with name as the URL path of a limit, or
// returns nil.
func servable(name string) error {
	if name == "metrics" || name == "healthz" {
		return fmt.Errorf("taken by the /%s endpoint: choose another name", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return errors.New("write a name of letters, digits, '-' and '_' (it is the limit's URL path and part of its Redis keys)")
		}
	}
	return nil
}
