//go:build unix && !linux

package cli

import (
	"os"
	"syscall"
)

// On Unix systems other than Linux there is no child subreaper and no
// parent-death signal: the command's orphans are init's, not locker's, so
// locker cannot wait for them to be gone, and when locker is killed only
// the guard ends the command's group (a process that left the group runs
// on). The group kill itself works as on Linux.

func becomeSubreaper() {}

func setDeathSignal(*syscall.SysProcAttr) {}

// raise sends sig to locker.
func raise(sig syscall.Signal) { _ = syscall.Kill(os.Getpid(), sig) }
