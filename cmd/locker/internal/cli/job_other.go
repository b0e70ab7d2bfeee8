//go:build !unix

package cli

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/go-locker/locker"
)

// Without Unix process groups and signals, locker runs the command as a
// plain child: it is killed when the lock is lost, but what it started runs
// on, locker's death does not end it, and there is no job control.

var jobSignals []os.Signal

type job struct {
	cmd   *exec.Cmd
	sigs  chan os.Signal
	waits chan error
}

// guardStart is the Unix guard's place: there is none here.
type guardStart struct{}

func startGuardAsync() *guardStart { return nil }

func (*guardStart) cancel() {}

func startJob(c *exec.Cmd, sigs chan os.Signal, _ *guardStart) (*job, error) {
	if err := c.Start(); err != nil {
		return nil, err
	}
	j := &job{cmd: c, sigs: sigs, waits: make(chan error, 1)}
	go func() { j.waits <- c.Wait() }()
	return j, nil
}

func (j *job) supervise(h locker.Handle, key string, killAfter time.Duration) (syscall.WaitStatus, bool) {
	done := h.Done()
	lost := false
	for {
		select {
		case <-j.waits:
			code := j.cmd.ProcessState.ExitCode()
			if code < 0 {
				code = exitFailure
			}
			return syscall.WaitStatus{ExitCode: uint32(code)}, lost
		case <-j.sigs:
			_ = j.cmd.Process.Kill()
		case <-done:
			lost, done = true, nil
			fmt.Fprintf(os.Stderr, "locker: lost the lock on %q while the command ran (%v); killing the command\n", key, h.Err())
			_ = j.cmd.Process.Kill()
		}
	}
}
