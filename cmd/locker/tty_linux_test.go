package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
)

// A terminal for the tests: a pseudo-terminal whose slave is the
// controlling terminal of a new session, as a login shell's is.

type ptyTerm struct {
	t    *testing.T
	ptmx *os.File
	cmd  *exec.Cmd

	mu   sync.Mutex
	out  bytes.Buffer // everything the terminal showed
	seen int          // out up to here was matched by expect
	more chan struct{}
	eof  chan struct{}
}

// startTerm starts c in a new session whose controlling terminal is a new
// pseudo-terminal, c's stdin, stdout and stderr.
func startTerm(t *testing.T, c *exec.Cmd) *ptyTerm {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	c.Stdin, c.Stdout, c.Stderr = tty, tty, tty
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	tm := &ptyTerm{t: t, ptmx: ptmx, cmd: c, more: make(chan struct{}, 1), eof: make(chan struct{})}
	go func() {
		defer close(tm.eof)
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			tm.mu.Lock()
			tm.out.Write(buf[:n])
			tm.mu.Unlock()
			select {
			case tm.more <- struct{}{}:
			default:
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = c.Process.Kill()
		ptmx.Close() // ends the reader, whoever still has the terminal open
		<-tm.eof
		_ = c.Wait()
	})
	return tm
}

func (tm *ptyTerm) send(s string) {
	tm.t.Helper()
	if _, err := io.WriteString(tm.ptmx, s); err != nil {
		tm.t.Fatalf("writing %q to the terminal: %v", s, err)
	}
}

// expect waits until the terminal shows what matches re after what the
// last expect matched, and returns the submatches.
func (tm *ptyTerm) expect(re string, within time.Duration) []string {
	tm.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.After(within)
	for {
		tm.mu.Lock()
		rest := tm.out.String()[tm.seen:]
		if loc := rx.FindStringSubmatchIndex(rest); loc != nil {
			m := rx.FindStringSubmatch(rest)
			tm.seen += loc[1]
			tm.mu.Unlock()
			return m
		}
		tm.mu.Unlock()
		select {
		case <-tm.more:
		case <-tm.eof:
			tm.mu.Lock()
			defer tm.mu.Unlock()
			if loc := rx.FindStringIndex(tm.out.String()[tm.seen:]); loc == nil {
				tm.t.Fatalf("the terminal closed without showing %q; it showed:\n%s", re, tm.out.String())
			}
			return nil
		case <-deadline:
			tm.mu.Lock()
			defer tm.mu.Unlock()
			tm.t.Fatalf("the terminal did not show %q within %v; it showed:\n%s", re, within, tm.out.String())
			return nil
		}
	}
}

// TestInteractiveCommand: under a terminal, the command is the terminal's
// foreground job: it reads what is typed and exits (a command left in a
// background process group is stopped by SIGTTIN at its first read while
// locker keeps the lock).
func TestInteractiveCommand(t *testing.T) {
	e := newEnv(t)
	tm := startTerm(t, e.cmd("run", "tty", "--", "sh", "-c", `read x; echo "got:$x"`))
	tm.send("hello\n")
	tm.expect(`got:hello`, 10*time.Second)
	if err := waitExit(tm.cmd, 10*time.Second); err != nil {
		t.Errorf("locker run under a terminal: %v, want status 0", err)
	}
	// The terminal is locker's shell's again: the key is free.
	e.run("run", "--wait", "0", "tty", "--", "true").want(t, 0, "--wait 0 after the interactive run")
}

// TestJobControl: Ctrl-Z in a job-control shell stops the command and
// locker together (the shell gets its prompt back, the lock stays held, and
// nothing runs); fg continues both, with the terminal the command's again.
func TestJobControl(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash for a job-control shell")
	}
	e := newEnv(t)
	sh := exec.Command(bash, "--norc", "--noprofile", "-i")
	sh.Env = append(e.cmd().Env, "PS1=$ ", "TERM=dumb")
	tm := startTerm(t, sh)
	tm.expect(`\$ `, 10*time.Second)
	tm.send(binary + ` run jc -- sh -c 'echo "pids:$$:$PPID"; read x; echo "got:$x"; read y; echo "got:$y"'` + "\n")
	m := tm.expect(`pids:(\d+):(\d+)`, 20*time.Second)
	cmdPid, lockerPid := m[1], m[2]
	for _, p := range []string{cmdPid, lockerPid} {
		pid, _ := strconv.Atoi(p)
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	}
	tm.send("one\n")
	tm.expect(`got:one`, 10*time.Second)

	tm.send("\x1a") // Ctrl-Z
	tm.expect(`Stopped`, 10*time.Second)
	tm.expect(`\$ `, 10*time.Second)
	for _, p := range []struct{ what, pid string }{{"the command", cmdPid}, {"locker", lockerPid}} {
		if st := procState(t, p.pid); st != "T" {
			t.Errorf("after Ctrl-Z, %s (pid %s) is in state %q, want T (stopped)", p.what, p.pid, st)
		}
	}
	e.run("run", "--wait", "0", "jc", "--", "true").want(t, 1, "--wait 0 while the job is stopped")

	tm.send("fg\n")
	tm.send("two\n")
	tm.expect(`got:two`, 10*time.Second)
	tm.send(`echo "rc:$?"` + "\n")
	tm.expect(`rc:0`, 10*time.Second)
	e.run("run", "--wait", "0", "jc", "--", "true").want(t, 0, "--wait 0 after the job ended")
	tm.send("exit\n")
}

// procState is the state letter of process pid (R, S, T, Z, ...), or ""
// when it is gone.
func procState(t *testing.T, pid string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		t.Fatalf("/proc/%s/stat: %q", pid, s)
	}
	return s[i+2 : i+3]
}

// waitExit waits for c to exit within d and returns its error.
func waitExit(c *exec.Cmd, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		_ = c.Process.Kill()
		<-done
		return errors.New("did not exit within " + d.String())
	}
}
