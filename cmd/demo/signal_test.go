package main

import (
	"bufio"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runMainEnv, set in the environment of a copy of the test binary, makes
// TestNodeLeavesOnSIGTERM run main with the arguments after "--".
const runMainEnv = "HYBRIDLIMIT_DEMO_RUN_MAIN"

// TestNodeLeavesOnSIGTERM: a node stopped with SIGTERM, as process managers
// and Kubernetes stop a process, leaves the cluster cleanly and exits 0,
// as it does on Ctrl-C. The node runs in a copy of the test binary that
// calls main, so that main's signal handling is what is tested.
func TestNodeLeavesOnSIGTERM(t *testing.T) {
	if os.Getenv(runMainEnv) == "1" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"demo"}, os.Args[i+1:]...)
				main() // exits
			}
		}
		os.Exit(99)
	}
	if runtime.GOOS == "windows" {
		t.Skip("no SIGTERM to send on Windows")
	}
	r, err := startRedis("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^TestNodeLeavesOnSIGTERM$", "--", "node", "-redis", r.Addr(), "-name", "n1")
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() // if the test fails before the node exits

	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var stdout strings.Builder
	waitLine := func(prefix string) {
		t.Helper()
		timeout := time.After(20 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the node's output ended without %q:\n%s\nstderr:\n%s", prefix, stdout.String(), stderr.String())
				}
				stdout.WriteString(l + "\n")
				if strings.HasPrefix(l, prefix) {
					return
				}
			case <-timeout:
				t.Fatalf("no line %q from the node within 20s:\n%s\nstderr:\n%s", prefix, stdout.String(), stderr.String())
			}
		}
	}
	waitLine("node n1: gossip")

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitLine("node n1: leaving the cluster")
	for range lines { // drain, so that Wait can return
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the node stopped by SIGTERM: %v, want exit status 0; stderr:\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "membership: closed") || !strings.Contains(stderr.String(), "graceful=true") {
		t.Errorf("the node did not say it left gracefully; stderr:\n%s", stderr.String())
	}
}
