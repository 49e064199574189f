package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
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

// TestLimitNamesAreURLPaths: the demo serves each limit at /<name>, so it
// refuses names the library would take, with their line.
func TestLimitNamesAreURLPaths(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"a/b", `limits.yaml:2: limit "a/b": name "a/b": write a name of letters, digits, '-' and '_'`},
		{"a b", `limits.yaml:2: limit "a b": name "a b": write a name of letters`},
		{"metrics", `limits.yaml:2: limit "metrics": name "metrics": taken by the /metrics endpoint: choose another name`},
		{"healthz", `limits.yaml:2: limit "healthz": name "healthz": taken by the /healthz endpoint`},
	} {
		path := filepath.Join(t.TempDir(), "limits.yaml")
		file := "limits:\n  - {name: \"" + tc.name + "\", rate: 1, burst: 1, mode: local, on_outage: fail-open}\n"
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := loadLimits(path)
		if want := strings.Replace(tc.want, "limits.yaml", path, 1); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("name %q: %v; want %q", tc.name, err, want)
		}
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
