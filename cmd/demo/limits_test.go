package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hybridlimit/hybridlimit/hybrid"
)

func TestShippedLimitsFileIsTheDefault(t *testing.T) {
	got, err := loadLimits("limits.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if want := defaultLimits(); !reflect.DeepEqual(got, want) {
		t.Errorf("limits.yaml = %+v\nwant the built-in limits %+v", got, want)
	}
}

func TestParseLimits(t *testing.T) {
	got, err := parseLimits("limits.yaml", []byte(`
- name: API
  rate: 1e3
  burst: 1_000
  mode: Global
  on_outage: FAIL_OPEN
- {name: l, rate: 0.5, burst: 1, mode: local, on_outage: fail-local}
- {name: q, rate: 1, burst: 1, mode: " Hybrid ", on_outage: "Fail_Closed "}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []hybrid.Limit{
		{Name: "API", Rate: 1000, Burst: 1000, Mode: hybrid.Global, OnOutage: hybrid.FailOpen},
		{Name: "l", Rate: 0.5, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailLocal},
		{Name: "q", Rate: 1, Burst: 1, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

func TestLimitsFileErrors(t *testing.T) {
	const good = `limits:
  - name: api
    rate: 300
    burst: 30
    mode: hybrid
    on_outage: fail-local
`
	for _, tc := range []struct {
		name string
		file string
		want []string // each a line of the error, in order
	}{{
		name: "missing on_outage",
		file: good + `  - name: login
    rate: 20
    burst: 10
    mode: hybrid
`,
		want: []string{`limits.yaml:7: limit "login": on_outage is missing: write on_outage: fail-closed (or fail-local, fail-open)`},
	}, {
		name: "missing on_outage, not a login limit",
		file: `limits:
  - {name: search, rate: 20, burst: 10, mode: hybrid}
`,
		want: []string{`limits.yaml:2: limit "search": on_outage is missing: write on_outage: fail-local (or fail-open, fail-closed)`},
	}, {
		name: "unknown field, close to a known one",
		file: `limits:
  - name: api
    rate: 300
    burst: 30
    mode: hybrid
    on_outgae: fail-local
`,
		want: []string{
			`limits.yaml:6: limit "api": unknown field "on_outgae": write on_outage instead`,
			`limits.yaml:2: limit "api": on_outage is missing`,
		},
	}, {
		name: "unknown field",
		file: strings.Replace(good, "    mode:", "    region: eu\n    mode:", 1),
		want: []string{`limits.yaml:5: limit "api": unknown field "region": remove it (a limit has name, rate, burst, mode, on_outage)`},
	}, {
		name: "negative rate",
		file: strings.Replace(good, "rate: 300", "rate: -300", 1),
		want: []string{`limits.yaml:3: limit "api": rate is -300: write a positive number of requests per second, for example rate: 300`},
	}, {
		name: "zero rate",
		file: strings.Replace(good, "rate: 300", "rate: 0", 1),
		want: []string{`limits.yaml:3: limit "api": rate is 0: write a positive number of requests per second, for example rate: 100`},
	}, {
		name: "rate not a number",
		file: strings.Replace(good, "rate: 300", "rate: lots", 1),
		want: []string{`limits.yaml:3: limit "api": rate is "lots", not a number`},
	}, {
		name: "rate infinite",
		file: strings.Replace(good, "rate: 300", "rate: .inf", 1),
		want: []string{`limits.yaml:3: limit "api": rate is ".inf", not a number`},
	}, {
		name: "burst below 1",
		file: strings.Replace(good, "burst: 30", "burst: 0", 1),
		want: []string{`limits.yaml:4: limit "api": burst is 0: write a whole number of at least 1, for example burst: 10`},
	}, {
		name: "burst fractional",
		file: strings.Replace(good, "burst: 30", "burst: 2.5", 1),
		want: []string{`limits.yaml:4: limit "api": burst is "2.5", not a whole number`},
	}, {
		name: "unknown mode and policy",
		file: strings.Replace(strings.Replace(good, "mode: hybrid", "mode: leased", 1), "fail-local", "fail-soft", 1),
		want: []string{
			`limits.yaml:5: limit "api": mode "leased" is not a mode: write mode: hybrid (or local, global)`,
			`limits.yaml:6: limit "api": on_outage "fail-soft" is not a policy: write on_outage: fail-local (or fail-open, fail-closed)`,
		},
	}, {
		name: "quoted empty mode and policy",
		file: strings.Replace(strings.Replace(good, "mode: hybrid", `mode: ""`, 1), "fail-local", `" "`, 1),
		want: []string{
			`limits.yaml:5: limit "api": mode "" is not a mode: write mode: hybrid (or local, global)`,
			`limits.yaml:6: limit "api": on_outage " " is not a policy: write on_outage: fail-local (or fail-open, fail-closed)`,
		},
	}, {
		name: "empty on_outage",
		file: strings.Replace(good, "on_outage: fail-local", "on_outage:", 1),
		want: []string{`limits.yaml:6: limit "api": on_outage is missing`},
	}, {
		name: "missing name",
		file: strings.Replace(good, "name: api", "nme: api", 1),
		want: []string{
			`limits.yaml:2: limit #1: unknown field "nme": write name instead`,
			`limits.yaml:2: limit #1: name is missing: write name: api`,
		},
	}, {
		name: "bad name",
		file: strings.Replace(good, "name: api", "name: a/b", 1),
		want: []string{`limits.yaml:2: limit "a/b": name "a/b": write a name of letters, digits, '-' and '_'`},
	}, {
		name: "reserved name",
		file: strings.Replace(good, "name: api", "name: metrics", 1),
		want: []string{`limits.yaml:2: limit "metrics": name "metrics" is taken by the /metrics endpoint: choose another name`},
	}, {
		name: "field given twice",
		file: strings.Replace(good, "burst: 30", "burst: 30\n    rate: 5", 1),
		want: []string{`limits.yaml:5: limit "api": rate is given twice (first on line 3): keep one`},
	}, {
		name: "limit defined twice",
		file: good + strings.TrimPrefix(good, "limits:\n"),
		want: []string{`limits.yaml:7: limit "api" is defined twice (first on line 2): give each limit its own name`},
	}, {
		name: "unknown top-level field",
		file: good + "timeout: 5s\n",
		want: []string{`limits.yaml:7: unknown field "timeout" at the top: the file has one field, limits`},
	}, {
		name: "empty file",
		file: "",
		want: []string{`limits.yaml: the file is empty: write a list of limits, for example`},
	}, {
		name: "empty list",
		file: "limits: []\n",
		want: []string{`limits.yaml:1: the list of limits is empty`},
	}, {
		name: "not YAML",
		file: "limits:\n\t- name: api\n",
		want: []string{`limits.yaml:2: not valid YAML: found character that cannot start any token (YAML indents with spaces, not tabs)`},
	}, {
		name: "limit not a mapping",
		file: "limits:\n  - api\n",
		want: []string{`limits.yaml:2: limit #1: expected a limit with fields name, rate, burst, mode, on_outage`},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseLimits("limits.yaml", []byte(tc.file))
			if err == nil {
				t.Fatalf("no error for\n%s", tc.file)
			}
			lines := strings.Split(err.Error(), "\n")
			i := 0
			for _, want := range tc.want {
				for i < len(lines) && !strings.HasPrefix(lines[i], want) {
					i++
				}
				if i == len(lines) {
					t.Fatalf("error\n%v\nhas no line starting %q (after the previous ones)", err, want)
				}
				i++
			}
		})
	}
}

func TestBadLimitsFileFailsAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(path, []byte("limits:\n  - {name: api, rate: -1, burst: 1, mode: hybrid, on_outage: fail-open}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-config", path},
		{"node", "-redis", "127.0.0.1:1", "-config", path},
	} {
		var stdout, stderr syncBuffer
		if code := run(t.Context(), args, &stdout, &stderr); code != exitUsage {
			t.Errorf("run %q = %d, want %d", args, code, exitUsage)
		}
		if want := path + `:2: limit "api": rate is -1: write a positive number`; !strings.Contains(stderr.String(), want) {
			t.Errorf("run %q: stderr %q does not say %q", args, stderr.String(), want)
		}
	}
}
