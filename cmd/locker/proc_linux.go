//go:build linux

package main

import "syscall"

// setDeathSignal has the kernel SIGKILL the command if locker itself dies
// (SIGKILL, a crash): the command must not run on without the lock that
// locker no longer renews.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
