package limitsfile_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/hybrid/limitsfile"
)

func ExampleParse() {
	limits, err := limitsfile.Parse("limits.yaml", []byte(`
limits:
  - name: api
    rate: 300
    burst: 30
    mode: hybrid
    on_outage: fail-local
  - name: signup
    rate: 20/h
    burst: 5
    mode: global
    on_outage: fail-closed
    shadow: true
`))
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range limits {
		fmt.Printf("%s: %.4g/s burst %d, %s, %s, shadow %v\n", l.Name, l.Rate, l.Burst, l.Mode, l.OnOutage, l.Shadow)
	}

	// Every problem, each with its line and what to write instead.
	_, err = limitsfile.Parse("limits.yaml", []byte(`
limits:
  - name: api
    rate: 300/week
    burst: 30
    mode: hybrid
`))
	fmt.Println(errors.Is(err, limitsfile.ErrInvalid))
	fmt.Println(err)
	// Output:
	// api: 300/s burst 30, hybrid, fail-local, shadow false
	// signup: 0.005556/s burst 5, global, fail-closed, shadow true
	// true
	// limits.yaml:4: limit "api": rate is "300/week": "week" is not a unit of time: write a number per s, min, h or day, for example rate: 300/min
	// limits.yaml:3: limit "api": on_outage is missing: write on_outage: fail-local (or fail-open, fail-closed): what the limit does while Redis is down
}

func ExampleLoad() {
	dir, err := os.MkdirTemp("", "limits")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "limits.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			log.Fatal(err)
		}
	}
	write("limits:\n  - {name: api, rate: 100, burst: 10, mode: local, on_outage: fail-open}\n")

	limits, err := limitsfile.Load(path)
	if err != nil {
		log.Fatal(err)
	}
	l, err := hybrid.New(hybrid.Config{Limits: limits})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	// Later, say on SIGHUP: load the file again and put it in force. A bad
	// file keeps the limits in force.
	write("limits:\n  - {name: api, rate: 6000/min, burst: 10, mode: local, on_outage: fail-opn}\n")
	if limits, err := limitsfile.Load(path); err != nil {
		fmt.Println("kept the old limits:", strings.TrimPrefix(err.Error(), path))
	} else if err := l.SetLimits(limits); err != nil {
		fmt.Println("kept the old limits:", err)
	}
	write("limits:\n  - {name: api, rate: 6000/min, burst: 20, mode: local, on_outage: fail-open}\n")
	if limits, err := limitsfile.Load(path); err != nil {
		fmt.Println("kept the old limits:", err)
	} else if err := l.SetLimits(limits); err != nil {
		fmt.Println("kept the old limits:", err)
	}
	fmt.Printf("%+v\n", l.Limits())
	// Output:
	// kept the old limits: :2: limit "api": on_outage "fail-opn" is not a policy: write on_outage: fail-open (or fail-local, fail-closed)
	// [{Name:api Rate:100 Burst:20 Mode:local OnOutage:fail-open Shadow:false}]
}

func ExampleCheckName() {
	// Limits served at /<name>: names must be URL path segments.
	urlSafe := limitsfile.CheckName(func(name string) error {
		if strings.ContainsAny(name, "/?#% ") {
			return errors.New("write a name without '/', '?', '#', '%' or spaces: it is the limit's URL path")
		}
		return nil
	})
	_, err := limitsfile.Parse("limits.yaml", []byte("- {name: a/b, rate: 1, burst: 1, mode: local, on_outage: fail-open}\n"), urlSafe)
	fmt.Println(err)
	// Output:
	// limits.yaml:1: limit "a/b": name "a/b": write a name without '/', '?', '#', '%' or spaces: it is the limit's URL path
}
