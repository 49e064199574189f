package limitsfile_test

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hybridlimit/hybridlimit/hybrid"
	"github.com/hybridlimit/hybridlimit/hybrid/limitsfile"
)

func TestParse(t *testing.T) {
	got, err := limitsfile.Parse("limits.yaml", []byte(`
- name: API
  rate: 1e3
  burst: 1_000
  mode: Global
  on_outage: FAIL_OPEN
- {name: l, rate: 0.5, burst: 1, mode: local, on_outage: fail-local, shadow: true}
- {name: q, rate: 1, burst: 1, mode: " Hybrid ", on_outage: "Fail_Closed ", shadow: false}
- {name: per-minute, rate: 6000/min, burst: 10, mode: hybrid, on_outage: fail-local}
- {name: exact, rate: 10, burst: 5, mode: hybrid, on_outage: fail-local}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []hybrid.Limit{
		{Name: "API", Rate: 1000, Burst: 1000, Mode: hybrid.Global, OnOutage: hybrid.FailOpen},
		{Name: "l", Rate: 0.5, Burst: 1, Mode: hybrid.Local, OnOutage: hybrid.FailLocal, Shadow: true},
		{Name: "q", Rate: 1, Burst: 1, Mode: hybrid.Hybrid, OnOutage: hybrid.FailClosed},
		{Name: "per-minute", Rate: 100, Burst: 10, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal},
		{Name: "exact", Rate: 10, Burst: 5, Mode: hybrid.Hybrid, OnOutage: hybrid.FailLocal},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

// TestParseRate: a rate is a number of tokens per second, or a number per
// unit of time.
func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		rate string
		want float64
	}{
		{"100", 100},
		{"2.5", 2.5},
		{"1_000", 1000},
		{"1e3", 1000},
		{"10/s", 10},
		{"10/sec", 10},
		{"10 / second", 10},
		{"10/seconds", 10},
		{"6000/min", 100},
		{"6000/m", 100},
		{"6000/Minute", 100},
		{"6000/minutes", 100},
		{"7200/h", 2},
		{"7200/hr", 2},
		{"7200/HOUR", 2},
		{"7200/hours", 2},
		{"1/day", hybrid.PerDay(1)},
		{"86_400/d", 1},
		{"172800/days", 2},
		{"0.5/min", hybrid.PerMinute(0.5)},
	} {
		got, err := limitsfile.Parse("f", []byte("- {name: a, rate: "+tc.rate+", burst: 1, mode: local, on_outage: fail-open}\n"))
		if err != nil {
			t.Errorf("rate: %s: %v", tc.rate, err)
			continue
		}
		if r := got[0].Rate; math.Abs(r-tc.want) > 1e-12*tc.want {
			t.Errorf("rate: %s = %v tokens/s, want %v", tc.rate, r, tc.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
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
		file: strings.Replace(good, "on_outage:", "on_outgae:", 1),
		want: []string{
			`limits.yaml:6: limit "api": unknown field "on_outgae": write on_outage instead`,
			`limits.yaml:2: limit "api": on_outage is missing`,
		},
	}, {
		name: "unknown field",
		file: strings.Replace(good, "    mode:", "    region: eu\n    mode:", 1),
		want: []string{`limits.yaml:5: limit "api": unknown field "region": remove it (a limit has name, rate, burst, mode, on_outage, shadow)`},
	}, {
		name: "exact_bursts, a field of placement version 2",
		file: strings.Replace(good, "    mode:", "    exact_bursts: true\n    mode:", 1),
		want: []string{`limits.yaml:5: limit "api": exact_bursts is gone: a hybrid limit now always admits a client's burst whole, wherever it lands; remove the line`},
	}, {
		name: "negative rate",
		file: strings.Replace(good, "rate: 300", "rate: -300", 1),
		want: []string{`limits.yaml:3: limit "api": rate is -300: write a positive number of requests per second, or per min, h or day, for example rate: 300`},
	}, {
		name: "zero rate",
		file: strings.Replace(good, "rate: 300", "rate: 0", 1),
		want: []string{`limits.yaml:3: limit "api": rate is 0: write a positive number of requests per second, or per min, h or day, for example rate: 100`},
	}, {
		name: "negative rate per minute",
		file: strings.Replace(good, "rate: 300", "rate: -5/min", 1),
		want: []string{`limits.yaml:3: limit "api": rate is -5/min: write a positive number of requests per second, or per min, h or day, for example rate: 5/min`},
	}, {
		name: "rate not a number",
		file: strings.Replace(good, "rate: 300", "rate: lots", 1),
		want: []string{`limits.yaml:3: limit "api": rate is "lots", not a rate`},
	}, {
		name: "rate per an unknown unit",
		file: strings.Replace(good, "rate: 300", "rate: 5/week", 1),
		want: []string{`limits.yaml:3: limit "api": rate is "5/week": "week" is not a unit of time: write a number per s, min, h or day, for example rate: 5/min`},
	}, {
		name: "rate per nothing",
		file: strings.Replace(good, "rate: 300", "rate: 5/", 1),
		want: []string{`limits.yaml:3: limit "api": rate is "5/": "" is not a unit of time`},
	}, {
		name: "rate too small",
		file: strings.Replace(good, "rate: 300", "rate: 1e-320/day", 1),
		want: []string{`limits.yaml:3: limit "api": rate is 1e-320/day: too small to count`},
	}, {
		name: "rate infinite",
		file: strings.Replace(good, "rate: 300", "rate: .inf", 1),
		want: []string{`limits.yaml:3: limit "api": rate is ".inf", not a rate`},
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
		// The suggestion is the valid value nearest to what was typed:
		// fail-close is one letter from fail-closed, not fail-local.
		name: "misspelled mode and policy",
		file: strings.Replace(strings.Replace(good, "mode: hybrid", "mode: Globl", 1), "fail-local", "fail-close", 1),
		want: []string{
			`limits.yaml:5: limit "api": mode "Globl" is not a mode: write mode: global (or hybrid, local)`,
			`limits.yaml:6: limit "api": on_outage "fail-close" is not a policy: write on_outage: fail-closed (or fail-local, fail-open)`,
		},
	}, {
		name: "policy without its prefix",
		file: strings.Replace(good, "fail-local", "open", 1),
		want: []string{
			`limits.yaml:6: limit "api": on_outage "open" is not a policy: write on_outage: fail-open (or fail-local, fail-closed)`,
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
		name: "shadow not a bool",
		file: good + "    shadow: maybe\n",
		want: []string{`limits.yaml:7: limit "api": shadow is "maybe", not true or false`},
	}, {
		name: "missing name",
		file: strings.Replace(good, "name: api", "nme: api", 1),
		want: []string{
			`limits.yaml:2: limit #1: unknown field "nme": write name instead`,
			`limits.yaml:2: limit #1: name is missing: write name: api`,
		},
	}, {
		name: "name with a colon",
		file: strings.Replace(good, "name: api", `name: "a:b"`, 1),
		want: []string{`limits.yaml:2: limit "a:b": name "a:b": a limit's name is part of its Redis keys and may not hold ':', '{' or '}'`},
	}, {
		name: "empty name",
		file: strings.Replace(good, "name: api", `name: ""`, 1),
		want: []string{`limits.yaml:2: limit #1: name is empty`},
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
		want: []string{`limits.yaml:2: limit #1: expected a limit with fields name, rate, burst, mode, on_outage, shadow`},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := limitsfile.Parse("limits.yaml", []byte(tc.file))
			if err == nil {
				t.Fatalf("no error for\n%s", tc.file)
			}
			if !errors.Is(err, limitsfile.ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
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

// TestErrorValues: each problem is an *Error with its line, and the joined
// error wraps ErrInvalid.
func TestErrorValues(t *testing.T) {
	_, err := limitsfile.Parse("f.yaml", []byte("- {name: a, rate: -1, burst: 1, mode: local, on_outage: fail-open}\n- {name: b, rate: 1, burst: 0, mode: local, on_outage: fail-open}\n"))
	var e *limitsfile.Error
	if !errors.As(err, &e) || e.File != "f.yaml" || e.Line != 1 || !strings.HasPrefix(e.Msg, `limit "a": rate is -1`) {
		t.Fatalf("errors.As: %+v from %v; want the first problem, on line 1", e, err)
	}
	if n := len(err.(interface{ Unwrap() []error }).Unwrap()); n != 2 {
		t.Errorf("%d problems, want 2", n)
	}
	if e := (&limitsfile.Error{File: "f", Msg: "m"}); e.Error() != "f: m" || !errors.Is(e, limitsfile.ErrInvalid) {
		t.Errorf("Error without a line: %q", e.Error())
	}
}

func TestCheckName(t *testing.T) {
	onlyLetters := limitsfile.CheckName(func(name string) error {
		if strings.Trim(name, "abcdefghijklmnopqrstuvwxyz") != "" {
			return errors.New("write letters only")
		}
		return nil
	})
	file := []byte("- {name: api, rate: 1, burst: 1, mode: local, on_outage: fail-open}\n- {name: a-b, rate: 1, burst: 1, mode: local, on_outage: fail-open}\n")
	_, err := limitsfile.Parse("f", file, onlyLetters)
	if want := `f:2: limit "a-b": name "a-b": write letters only`; err == nil || err.Error() != want {
		t.Errorf("Parse with CheckName: %v, want %q", err, want)
	}
	if _, err := limitsfile.Parse("f", file); err != nil {
		t.Errorf("Parse without CheckName: %v", err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	if _, err := limitsfile.Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, fs.ErrNotExist) || errors.Is(err, limitsfile.ErrInvalid) {
		t.Errorf("Load of a missing file: %v, want fs.ErrNotExist and not ErrInvalid", err)
	}
	path := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(path, []byte("limits:\n  - {name: api, rate: 5000/h, burst: 1, mode: local, on_outage: fail-open, extra: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := limitsfile.Load(path); err == nil || !strings.HasPrefix(err.Error(), path+`:2: limit "api": unknown field "extra"`) {
		t.Errorf("Load: %v, want the path and line in the message", err)
	}
}
