package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/go-locker/locker"
)

// waitFlag is --wait: a duration, or "forever" (the default).
type waitFlag struct {
	d       time.Duration
	forever bool
}

func (w *waitFlag) String() string {
	if w.forever {
		return "forever"
	}
	return w.d.String()
}

func (w *waitFlag) Set(s string) error {
	if s == "forever" {
		*w = waitFlag{forever: true}
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is neither a duration (0, 30s, 5m) nor \"forever\"", s)
	}
	if d < 0 {
		return fmt.Errorf("%v is negative; use 0 for one try, or \"forever\"", d)
	}
	*w = waitFlag{d: d}
	return nil
}

func (w *waitFlag) Type() string { return "duration" }

type runOpts struct {
	url          string
	ttl          time.Duration
	wait         waitFlag
	conflictCode int
	shell        string
	killAfter    time.Duration
	quiet        bool
	verbose      bool
}

func newRunCmd() *cobra.Command {
	o := runOpts{wait: waitFlag{forever: true}}
	cmd := &cobra.Command{
		Use:   "run [flags] KEY -- COMMAND [ARGS...]",
		Short: "Run a command while holding the lock on KEY",
		Long: `Run takes the lock on KEY, runs COMMAND while holding it (renewing its lease
as long as the command runs), and releases it when the command exits. Two
"locker run" on one KEY, on any hosts that share the backend, never run their
commands at the same time.

The command gets LOCKER_KEY and LOCKER_TOKEN in its environment. LOCKER_TOKEN
is the lock's fencing token: it grows with every new holder of KEY, so a
resource that remembers the highest token it has seen can refuse the writes of
a holder that lost the lock without knowing (paused, cut off).

stdin, stdout and stderr are the command's. SIGINT, SIGTERM and SIGHUP sent to
locker are passed on to the command's process group. If the lock is lost while
the command runs (the backend unreachable for longer than the lease, the lock
deleted on the server), locker says so on stderr, sends the command SIGTERM,
then SIGKILL after --kill-after, and exits with status 124.

Exit status: the command's own; 128+N if a signal N ended it;
--conflict-exit-code (default 1) if KEY stayed held elsewhere for --wait;
124 if the lock was lost while the command ran; 125 if locker itself failed
(bad flags, URL or key, unreachable backend); 126 if the command could not be
started; 127 if it was not found.

Without --url and $LOCKER_URL, locks live in ` + defaultURLHelp() + `
which excludes the processes of this user on this host, with no server.`,
		Example: `  # One backup at a time across the cluster; skip if one is running.
  locker run --url redis://redis:6379 --wait 0 backup -- /usr/local/bin/backup --full

  # Wait up to 5 minutes for the lock, then give up with status 3.
  locker run --wait 5m --conflict-exit-code 3 nightly-report -- ./report.sh

  # A shell command line, with the fencing token.
  locker run demo -c 'echo "holding $LOCKER_KEY with token $LOCKER_TOKEN"'`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 0:
				return errors.New("missing KEY")
			case o.shell != "" && len(args) > 1:
				return fmt.Errorf("both -c %q and a command (%s) given; use one", o.shell, strings.Join(args[1:], " "))
			case o.shell == "" && len(args) == 1:
				return errors.New("missing COMMAND: locker run KEY -- COMMAND [ARGS...], or locker run KEY -c 'SHELL COMMAND'")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runLocked(cmd.Context(), o, args[0], args[1:])
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.url, "url", "", "backend URL (default $LOCKER_URL, else the SQLite database above)")
	f.DurationVar(&o.ttl, "ttl", 0, "lease of the lock, renewed while the command runs, within [1s, 24h] (default: locker.DefaultTTL, 30s)")
	f.Var(&o.wait, "wait", `how long to wait for the lock: a duration, 0 for one try (like flock -n), or "forever"`)
	f.IntVarP(&o.conflictCode, "conflict-exit-code", "E", 1, "exit status when the lock stays held elsewhere for --wait (like flock -E)")
	f.StringVarP(&o.shell, "shell", "c", "", "run this shell command line (with /bin/sh -c) instead of COMMAND")
	f.DurationVar(&o.killAfter, "kill-after", 10*time.Second, "after the lock is lost, SIGKILL the command this long after SIGTERM")
	f.BoolVarP(&o.quiet, "quiet", "q", false, "say nothing when the lock is held elsewhere (the exit status tells)")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "say on stderr when locker starts waiting for the lock, and how long it took")
	return cmd
}

// defaultURLHelp describes the default lock database for --help.
func defaultURLHelp() string {
	u, err := defaultURL()
	if err != nil {
		return "an SQLite database in the user's cache directory (" + err.Error() + ")"
	}
	return u + ","
}

// defaultURL is the SQLite database in the user's cache directory.
func defaultURL() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory: %w", err)
	}
	return "sqlite://" + filepath.ToSlash(filepath.Join(dir, "locker", "locks.db")), nil
}

// backendURL is the URL to open: --url, else $LOCKER_URL, else the default,
// whose directory it creates.
func backendURL(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if env := os.Getenv("LOCKER_URL"); env != "" {
		return env, nil
	}
	u, err := defaultURL()
	if err != nil {
		return "", err
	}
	dir, _ := os.UserCacheDir()
	if err := os.MkdirAll(filepath.Join(dir, "locker"), 0o700); err != nil {
		return "", fmt.Errorf("creating the default lock database's directory: %w", err)
	}
	return u, nil
}

func openLocker(ctx context.Context, flag string) (locker.Locker, error) {
	u, err := backendURL(flag)
	if err != nil {
		return nil, fail(exitFailure, "%v", err)
	}
	l, err := locker.Open(ctx, u)
	if err != nil {
		return nil, fail(exitFailure, "%v", err)
	}
	return l, nil
}

var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

// check refuses flag values no run can use.
func (o runOpts) check() error {
	switch {
	case o.conflictCode < 0 || o.conflictCode > 255:
		return fail(exitFailure, "--conflict-exit-code %d is not an exit status (0-255)", o.conflictCode)
	case o.ttl < 0:
		return fail(exitFailure, "--ttl %v is negative", o.ttl)
	case o.killAfter <= 0:
		return fail(exitFailure, "--kill-after %v must be positive", o.killAfter)
	}
	return nil
}

// runLocked takes the lock on key, runs argv while it is held, and gives it
// back: signals end the wait before the lock is granted and go to the
// command after; a lost lock stops the command (supervise).
func runLocked(ctx context.Context, o runOpts, key string, argv []string) (err error) {
	if err := o.check(); err != nil {
		return err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	// Signals are caught from the start: one that comes while locker waits
	// for the lock ends the wait (leaving nothing behind) instead of killing
	// locker mid-call.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	wctx, stopWait := context.WithCancelCause(ctx)
	defer stopWait(nil)
	endWatch := watchSignals(sigs, stopWait)
	defer endWatch()

	l, err := openLocker(wctx, o.url)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := l.Close(); cerr != nil && err == nil {
			fmt.Fprintf(os.Stderr, "locker: closing the backend: %v\n", cerr)
		}
	}()

	var opts []locker.Option
	if o.ttl > 0 {
		opts = append(opts, locker.WithTTL(o.ttl))
	}
	if o.verbose {
		fmt.Fprintf(os.Stderr, "locker: acquiring the lock on %q (wait: %v)\n", key, &o.wait)
	}
	start := time.Now()
	stopNotice := waitNotice(wctx, os.Stderr, l, key, o)
	h, err := acquire(wctx, l, key, o, opts)
	stopNotice()
	if o.verbose && err == nil {
		fmt.Fprintf(os.Stderr, "locker: holding the lock on %q after %v, token %d, lease %v\n", key, time.Since(start).Round(time.Millisecond), h.Token(), h.TTL())
	}
	// From here on signals go to the command; one that came while the lock
	// was being granted means the user wants nothing run.
	if s, ok := endWatch().(syscall.Signal); ok {
		if err == nil {
			releaseQuietly(h)
		}
		return &exitError{code: 128 + int(s), msg: fmt.Sprintf("%v while waiting for the lock on %q; nothing was run", s, key)}
	}
	if err != nil {
		return err
	}

	child := command(o.shell, argv)
	child.Env = append(os.Environ(), "LOCKER_KEY="+key, "LOCKER_TOKEN="+strconv.FormatInt(h.Token(), 10))
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	setProcessGroup(child)
	if err := child.Start(); err != nil {
		releaseQuietly(h)
		name := "/bin/sh"
		if o.shell == "" {
			name = argv[0]
		}
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return fail(exitNotFound, "%s: command not found", name)
		}
		return fail(exitCannotStart, "%s: %v", name, err)
	}

	if lost := supervise(child, h, sigs, key, o.killAfter); lost != nil {
		return &exitError{code: exitLost}
	}
	rctx, cancel := context.WithTimeout(context.Background(), locker.ReleaseTimeout)
	defer cancel()
	if rerr := h.Release(rctx); rerr != nil {
		if errors.Is(rerr, locker.ErrLost) {
			return fail(exitLost, "the lock on %q was lost before the command's end: %v", key, rerr)
		}
		fmt.Fprintf(os.Stderr, "locker: releasing the lock on %q: %v\n", key, rerr)
	}
	return childStatus(child)
}

// watchSignals ends the wait (stop) when a signal comes on sigs before
// the returned end is called; end stops watching (it may be called again)
// and returns the signal that came, if any.
func watchSignals(sigs <-chan os.Signal, stop context.CancelCauseFunc) (end func() os.Signal) {
	stopWatch, watchExited := make(chan struct{}), make(chan struct{})
	var waitSig os.Signal // set by the watcher; read once it has exited
	go func() {
		defer close(watchExited)
		select {
		case s := <-sigs:
			waitSig = s
			stop(fmt.Errorf("interrupted by %v", s))
		case <-stopWatch:
		}
	}()
	return func() os.Signal {
		select {
		case <-stopWatch:
		default:
			close(stopWatch)
		}
		<-watchExited
		return waitSig
	}
}

// supervise waits for the started child to exit, passing it the signals
// that come meanwhile; when the lock is lost first it sends the child
// SIGTERM, then SIGKILL after killAfter, and returns the loss.
func supervise(child *exec.Cmd, h locker.Handle, sigs <-chan os.Signal, key string, killAfter time.Duration) (lost error) {
	exited := make(chan struct{})
	go func() {
		_ = child.Wait()
		close(exited)
	}()
	var kill <-chan time.Time
	done := h.Done()
	for {
		select {
		case <-exited:
			return lost
		case s := <-sigs:
			signalGroup(child, s)
		case <-done:
			done = nil
			lost = h.Err()
			fmt.Fprintf(os.Stderr, "locker: lost the lock on %q while the command ran (%v); sending it SIGTERM, SIGKILL in %v\n", key, lost, killAfter)
			signalGroup(child, syscall.SIGTERM)
			kill = time.After(killAfter)
		case <-kill:
			fmt.Fprintf(os.Stderr, "locker: the command did not exit within %v of SIGTERM; sending SIGKILL\n", killAfter)
			signalGroup(child, syscall.SIGKILL)
		}
	}
}

// waitNoticeAfter is how long a waiting run stays silent before it says
// what it waits for.
var waitNoticeAfter = 10 * time.Second

// waitNotice says once on w (stderr), when the lock has not come within
// waitNoticeAfter, why locker is still waiting: who holds the lock, when the
// backend can tell (locker.Inspector), or that the backend does not answer
// (some clients, etcd's among them, wait for an unreachable server instead
// of failing). Not with --quiet, nor for a single try. The returned
// function stops it.
func waitNotice(ctx context.Context, w io.Writer, l locker.Locker, key string, o runOpts) (stop func()) {
	if o.quiet || (!o.wait.forever && o.wait.d <= waitNoticeAfter) {
		return func() {}
	}
	nctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	t := time.AfterFunc(waitNoticeAfter, func() {
		defer close(done)
		msg := fmt.Sprintf("locker: still waiting for the lock on %q after %v", key, waitNoticeAfter)
		if in, ok := l.(locker.Inspector); ok {
			ictx, icancel := context.WithTimeout(nctx, 2*time.Second)
			info, err := in.Inspect(ictx, key)
			icancel()
			switch {
			case nctx.Err() != nil:
				return // the wait ended meanwhile
			case err != nil:
				msg += fmt.Sprintf(": the backend does not answer (%v)", err)
			case info.Held:
				msg += fmt.Sprintf(": held by another holder (token %d", info.Token)
				if info.TTL > 0 {
					msg += fmt.Sprintf(", lease %v left", info.TTL.Round(time.Millisecond))
				}
				msg += ")"
			}
		} else {
			msg += ": another holder has it, or the backend does not answer"
		}
		if nctx.Err() == nil {
			fmt.Fprintln(w, msg)
		}
	})
	return func() {
		cancel()
		if !t.Stop() {
			<-done
		}
	}
}

// acquire takes the lock as --wait says.
func acquire(ctx context.Context, l locker.Locker, key string, o runOpts, opts []locker.Option) (locker.Handle, error) {
	var h locker.Handle
	var err error
	switch {
	case o.wait.forever:
		h, err = l.Acquire(ctx, key, opts...)
	case o.wait.d == 0:
		h, err = l.TryAcquire(ctx, key, opts...)
	default:
		wctx, cancel := context.WithTimeoutCause(ctx, o.wait.d, errWaited)
		defer cancel()
		h, err = l.Acquire(wctx, key, opts...)
		if err != nil && errors.Is(context.Cause(wctx), errWaited) && ctx.Err() == nil {
			err = fmt.Errorf("%w: %w", locker.ErrNotAcquired, err)
		}
	}
	switch {
	case err == nil:
		return h, nil
	case errors.Is(err, locker.ErrNotAcquired) && ctx.Err() == nil:
		msg := fmt.Sprintf("the lock on %q is held elsewhere", key)
		if o.wait.d > 0 {
			msg += fmt.Sprintf(" (waited %v)", o.wait.d)
		}
		if o.quiet {
			msg = ""
		}
		return nil, &exitError{code: o.conflictCode, msg: msg}
	default:
		return nil, fail(exitFailure, "%v", err)
	}
}

var errWaited = errors.New("--wait elapsed")

// command builds the command to run: argv, or the shell command line.
func command(shell string, argv []string) *exec.Cmd {
	if shell != "" {
		return exec.Command("/bin/sh", "-c", shell)
	}
	return exec.Command(argv[0], argv[1:]...)
}

// childStatus is locker's exit for a command that has exited: its status, or
// 128+N when signal N ended it.
func childStatus(c *exec.Cmd) error {
	st := c.ProcessState
	if code := st.ExitCode(); code >= 0 {
		if code == 0 {
			return nil
		}
		return &exitError{code: code}
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return &exitError{code: 128 + int(ws.Signal())}
	}
	return &exitError{code: exitFailure, msg: "the command ended with status " + st.String()}
}

func releaseQuietly(h locker.Handle) {
	ctx, cancel := context.WithTimeout(context.Background(), locker.ReleaseTimeout)
	defer cancel()
	_ = h.Release(ctx)
}
