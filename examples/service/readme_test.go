package main

import (
	"os"
	"strings"
	"testing"
)

// The README quotes this program whole: the two must not drift apart.
func TestREADMEQuotesTheProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	prog, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```go\n"+string(prog)+"```\n") {
		t.Error("README.md does not quote examples/service/main.go as it is: copy the file into its embedding section")
	}
}
