package redisproc

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel kill cmd's process if its parent dies
// without stopping it, so that no redis-server outlives a crashed run.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
