package redisproc

import (
	"os/exec"
	"syscall"
)

// SetDeathSignal makes the kernel kill cmd's process if its parent dies
// without stopping it, so that no redis-server outlives a crashed run.
func SetDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
