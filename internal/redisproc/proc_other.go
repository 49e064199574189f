//go:build !linux

package redisproc

import "os/exec"

// SetDeathSignal does nothing where the kernel has no parent-death signal.
func SetDeathSignal(*exec.Cmd) {}
