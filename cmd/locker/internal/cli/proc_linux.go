package cli

import (
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// becomeSubreaper makes locker the parent of the command's orphans
// (PR_SET_CHILD_SUBREAPER): a grandchild whose parent exits is reparented
// to locker rather than to init, so that locker reaps it once it has
// killed the command's group, and knows it is gone.
func becomeSubreaper() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }

// setDeathSignal has the kernel SIGKILL the command if locker itself dies
// (SIGKILL, a crash), at once; the guard then kills the rest of its group.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

// raise sends sig to the calling thread, which handles it before the call
// returns: for a stop signal, the call returns once locker is continued.
func raise(sig syscall.Signal) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), sig)
}
