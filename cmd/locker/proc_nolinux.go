//go:build unix && !linux

package main

import "syscall"

// setDeathSignal does nothing where the kernel has no parent-death signal:
// there, a command whose locker was killed runs on until it ends, while the
// lock expires with its lease.
func setDeathSignal(*syscall.SysProcAttr) {}
