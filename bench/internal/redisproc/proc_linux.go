package redisproc

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel kill the server if the bench program dies
// without stopping it, so no redis-server outlives a crashed run.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
