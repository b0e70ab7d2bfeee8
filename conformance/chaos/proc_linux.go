package chaos

import (
	"os/exec"
	"syscall"
)

// killWithParent has the kernel kill the worker when the test process dies
// (a panic, -timeout), which no cleanup of ours survives; a worker stopped
// by the nemesis would otherwise stay stopped for good, with its
// connections open.
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
