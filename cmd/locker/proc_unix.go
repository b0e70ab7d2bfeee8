//go:build unix

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// setProcessGroup starts the command in a process group of its own, so that
// a signal locker passes on reaches the command and its children exactly
// once, and the whole group can be ended when the lock is lost.
func setProcessGroup(c *exec.Cmd) {
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	setDeathSignal(c.SysProcAttr)
}

// signalGroup sends s to the command's process group.
func signalGroup(c *exec.Cmd, s os.Signal) {
	if c.Process == nil {
		return
	}
	sig, ok := s.(syscall.Signal)
	if !ok {
		_ = c.Process.Signal(s)
		return
	}
	if err := syscall.Kill(-c.Process.Pid, sig); err != nil {
		_ = c.Process.Signal(s)
	}
}
