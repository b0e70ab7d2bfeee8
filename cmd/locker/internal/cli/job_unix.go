//go:build unix

package cli

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/go-locker/locker"
)

// The command runs as a job: a process group of its own that locker ends
// as a whole, with the terminal when locker has it, stopping and going on
// with locker.
//
// Why a group of its own rather than locker's: the group is what locker
// kills when the lock is lost or the command exits, and killing locker's
// group would kill locker and whatever shares its group (the rest of a
// pipeline, a make that runs locker). So under a terminal locker hands the
// terminal to the command's group while the command runs (it reads the
// keyboard, and Ctrl-C, Ctrl-\ and Ctrl-Z reach it and not locker, so a
// signal arrives once) and takes it back after.
//
// The group's leader is a guard: /bin/sh, ignoring the signals of a
// terminal, blocked reading a pipe whose other end only locker holds. When
// locker dies, even by SIGKILL, the kernel closes that end, the read
// returns and the guard kills its whole group: the command and everything
// it started that stayed in the group, before the lease runs out and
// another holder starts. The guard also keeps the group's id from being
// reused while locker may still signal it.

// jobSignals are the signals locker catches, besides forwarded, while the
// command runs: SIGTSTP is passed on to the command's group, and locker
// stops with the command.
var jobSignals = []os.Signal{syscall.SIGTSTP}

// guardScript is the guard's program: fd 3 is the read end of the pipe.
const guardScript = `trap '' INT TERM HUP QUIT TSTP TTIN TTOU; read x <&3; kill -KILL 0`

type job struct {
	cmd   *exec.Cmd
	pid   int      // the command's
	pgid  int      // its process group's: the guard's pid, or the command's without a guard
	guard bool     // the group has a guard
	dead  *os.File // locker's end of the guard's pipe
	tty   *os.File // the controlling terminal, when the job has (had) its foreground
	sigs  chan os.Signal
	waits chan waitEvent
}

type waitEvent struct {
	ws  syscall.WaitStatus
	err error
}

// startJob starts c as a job, in the group of g's guard (g is consumed).
func startJob(c *exec.Cmd, sigs chan os.Signal, g *guardStart) (*job, error) {
	becomeSubreaper()
	j := &job{cmd: c, sigs: sigs, waits: make(chan waitEvent, 4)}
	attr := &syscall.SysProcAttr{Setpgid: true}
	setDeathSignal(attr)
	if gpid, dead, err := g.wait(); err == nil {
		j.guard, j.pgid, j.dead = true, gpid, dead
		attr.Pgid = gpid
	}
	if tty := foregroundTTY(); tty != nil {
		// The child makes its group the foreground one before it execs
		// the command, so that its first read of the terminal finds it
		// in the foreground.
		j.tty = tty
		attr.Foreground, attr.Ctty = true, int(tty.Fd())
	}
	c.SysProcAttr = attr
	if err := c.Start(); err != nil {
		j.end()
		return nil, err
	}
	j.pid = c.Process.Pid
	if !j.guard {
		j.pgid = j.pid
	}
	go j.reap()
	return j, nil
}

// guardStart is a guard being started while the lock is taken: starting
// it (a fork and an exec of /bin/sh) overlaps with the backend's round
// trips instead of adding to the time before the command starts.
type guardStart struct {
	done chan struct{}
	pid  int
	dead *os.File
	err  error
}

// startGuardAsync starts a guard in the background.
func startGuardAsync() *guardStart {
	g := &guardStart{done: make(chan struct{})}
	go func() {
		defer close(g.done)
		g.pid, g.dead, g.err = startGuard()
	}()
	return g
}

// wait returns the guard's pid and locker's end of its pipe once it has
// started.
func (g *guardStart) wait() (int, *os.File, error) {
	<-g.done
	return g.pid, g.dead, g.err
}

// cancel ends a guard that no command will join (the lock was not taken)
// and reaps it.
func (g *guardStart) cancel() {
	pid, dead, err := g.wait()
	if err != nil {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	dead.Close()
	for {
		_, err := syscall.Wait4(pid, nil, 0, nil)
		if !errors.Is(err, syscall.EINTR) {
			return
		}
	}
}

// startGuard starts the guard as the leader of a new process group and
// returns its pid and locker's end of its pipe.
func startGuard() (int, *os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	defer r.Close()
	g := exec.Command("/bin/sh", "-c", guardScript)
	g.ExtraFiles = []*os.File{r}
	g.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := g.Start(); err != nil {
		w.Close()
		return 0, nil, err
	}
	pid := g.Process.Pid
	_ = g.Process.Release() // reaped with the group (end)
	return pid, w, nil
}

// reap reports the command's changes of state (stopped, continued,
// exited) on j.waits, until it has exited.
func (j *job) reap() {
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(j.pid, &ws, syscall.WUNTRACED|syscall.WCONTINUED, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		j.waits <- waitEvent{ws, err}
		if err != nil || ws.Exited() || ws.Signaled() {
			return
		}
	}
}

// signal sends s to the command's process group.
func (j *job) signal(s os.Signal) {
	if sig, ok := s.(syscall.Signal); ok {
		_ = syscall.Kill(-j.pgid, sig)
	}
}

// supervise waits for the command to exit, passing it the signals that
// come meanwhile and stopping with it; when the lock is lost first, it
// ends the command's group (SIGKILL, or SIGTERM and SIGKILL killAfter
// later) and reports the loss. It returns the command's wait status.
func (j *job) supervise(h locker.Handle, key string, killAfter time.Duration) (syscall.WaitStatus, bool) {
	done := h.Done()
	var kill <-chan time.Time
	lost := false
	lose := func(why string) {
		lost, done = true, nil
		if killAfter == 0 {
			fmt.Fprintf(os.Stderr, "locker: lost the lock on %q while the command ran (%s); killing the command (SIGKILL)\n", key, why)
			j.signal(syscall.SIGKILL)
			return
		}
		fmt.Fprintf(os.Stderr, "locker: lost the lock on %q while the command ran (%s); sending it SIGTERM, SIGKILL in %v\n", key, why, killAfter)
		j.signal(syscall.SIGTERM)
		j.signal(syscall.SIGCONT) // a stopped command gets SIGTERM when continued
		kill = time.After(killAfter)
	}
	for {
		select {
		case ev := <-j.waits:
			switch {
			case ev.err != nil:
				j.end()
				return syscall.WaitStatus(exitFailure << 8), lost
			case ev.ws.Stopped():
				if lost {
					continue
				}
				stopped := j.stopWithCommand()
				switch {
				case h.Err() != nil:
					lose(h.Err().Error())
				case stopped > h.TTL()/2:
					lose(fmt.Sprintf("stopped for %v, more than half the lease of %v: another holder may have had it meanwhile", stopped.Round(time.Millisecond), h.TTL()))
				default:
					j.resume()
				}
			case ev.ws.Continued():
			default:
				j.end()
				return ev.ws, lost
			}
		case s := <-j.sigs:
			j.signal(s)
		case <-done:
			lose(h.Err().Error())
		case <-kill:
			fmt.Fprintf(os.Stderr, "locker: the command did not exit within %v of SIGTERM; sending SIGKILL\n", killAfter)
			j.signal(syscall.SIGKILL)
		}
	}
}

// stopWithCommand stops locker because the command was stopped, so that
// the shell sees the job stopped and gives its prompt back, and returns,
// when locker is continued (fg, bg, SIGCONT), how long it was stopped. The
// lease is not renewed meanwhile. Locker stops with SIGSTOP: SIGTSTP,
// once caught for passing on, stays caught in a Go program, and SIGTTIN
// and SIGTTOU are discarded in an orphaned process group, which would leave
// locker running on with the command stopped.
func (j *job) stopWithCommand() time.Duration {
	if j.tty != nil && foreground(j.tty) == j.pgid {
		_ = setForeground(j.tty, syscall.Getpgrp())
	}
	start := time.Now()
	raise(syscall.SIGSTOP)
	return time.Since(start)
}

// resume continues the command, in the foreground if locker is.
func (j *job) resume() {
	if j.tty != nil && foreground(j.tty) == syscall.Getpgrp() {
		_ = setForeground(j.tty, j.pgid)
	}
	j.signal(syscall.SIGCONT)
}

// end kills what is left of the job's group (the guard, and what the
// command left running in it), reaps it, and gives the terminal back.
func (j *job) end() {
	if j.pgid != 0 {
		_ = syscall.Kill(-j.pgid, syscall.SIGKILL)
		reapGroup(j.pgid)
	}
	if j.dead != nil {
		j.dead.Close()
	}
	if j.tty != nil {
		if fg := foreground(j.tty); fg == j.pgid || fg == j.pid {
			_ = setForeground(j.tty, syscall.Getpgrp())
		}
		j.tty.Close()
	}
	if j.cmd.Process != nil {
		_ = j.cmd.Process.Release()
	}
}

// reapGroup reaps the children of locker in process group pgid, all of
// them killed, until none is left (with the subreaper, on Linux, that
// includes the command's orphans that stayed in the group).
func reapGroup(pgid int) {
	for {
		_, err := syscall.Wait4(-pgid, nil, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return
		}
	}
}

// foregroundTTY is locker's controlling terminal when locker's process
// group is its foreground group, else nil.
func foregroundTTY() *os.File {
	tty, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return nil
	}
	if foreground(tty) != syscall.Getpgrp() {
		tty.Close()
		return nil
	}
	return tty
}

// foreground is the terminal's foreground process group, or -1.
func foreground(tty *os.File) int {
	pg, err := unix.IoctlGetInt(int(tty.Fd()), unix.TIOCGPGRP)
	if err != nil {
		return -1
	}
	return pg
}

// setForeground makes pgid the terminal's foreground process group. From
// a background group that takes SIGTTOU ignored, as a shell does, or the
// kernel would stop locker instead. It stays ignored (a Go program cannot
// set it back to its default): it is called once the command has started,
// so no child inherits it.
func setForeground(tty *os.File, pgid int) error {
	signal.Ignore(syscall.SIGTTOU)
	return unix.IoctlSetPointerInt(int(tty.Fd()), unix.TIOCSPGRP, pgid)
}
