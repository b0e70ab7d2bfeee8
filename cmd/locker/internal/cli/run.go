package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/go-locker/locker"
)

type runOpts struct {
	lockOpts
	shell     string
	killAfter time.Duration
}

func newRunCmd() *cobra.Command {
	var o runOpts
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
a holder that lost the lock without knowing (paused, cut off). A LOCKER_URL
with a password reaches the command with the password replaced by xxxxx.

The command runs in a process group of its own, which locker ends as a whole
(SIGKILL) when the command exits (what it left running in the background), when
the lock is lost, and when locker itself dies, even by SIGKILL: no process of
the command runs on without the lock. Under a terminal the command's group is
the terminal's foreground job (it reads the keyboard, Ctrl-C reaches it), and
Ctrl-Z stops the command and locker together, as one job of your shell.

stdin, stdout and stderr are the command's. SIGINT, SIGTERM, SIGHUP and SIGQUIT
sent to locker are passed on to the command's process group, SIGTSTP too (locker
then stops with the command). If the lock is lost while the command runs (the
backend unreachable for longer than the lease, the lock deleted on the server),
locker says so on stderr, sends the command's group SIGKILL (with --kill-after,
SIGTERM first and SIGKILL that long after) and exits with status 124.

--timeout bounds connecting to the backend and each attempt on it: a backend
that does not answer makes locker fail with status 125 and a line that says so,
never the conflict status. --wait counts from the start; when it is over, a
last try tells a key still held elsewhere from a backend that stopped answering.

Exit status: the command's own; 128+N if a signal N ended it;
--conflict-exit-code (default 1) if KEY stayed held elsewhere for --wait;
124 if the lock was lost while the command ran; 125 if locker itself failed
(bad flags, URL or key, a backend that did not answer within --timeout); 126
if the command could not be started; 127 if it was not found.

Without --url and $LOCKER_URL, locks live in ` + DefaultURLHelp() + `
which excludes the processes of this user on this host, with no server.`,
		Example: `  # One backup at a time across the cluster; skip if one is running.
  locker run --url redis://redis:6379 --wait 0 backup -- /usr/local/bin/backup --full

  # Wait up to 5 minutes for the lock, then give up with status 3.
  locker run --wait 5m --conflict-exit-code 3 nightly-report -- ./report.sh

  # A shell command line, with the fencing token.
  locker run demo -c 'echo "holding $LOCKER_KEY with token $LOCKER_TOKEN"'`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 0 || cmd.ArgsLenAtDash() == 0:
				return errors.New("missing KEY: locker run KEY -- COMMAND [ARGS...], or locker run KEY -c 'SHELL COMMAND'")
			case o.shell != "" && len(args) > 1:
				return fmt.Errorf("both -c %q and a command (%s) given; use one", o.shell, strings.Join(args[1:], " "))
			case o.shell == "" && len(args) == 1:
				return errors.New("missing COMMAND: locker run KEY -- COMMAND [ARGS...], or locker run KEY -c 'SHELL COMMAND'")
			case cmd.ArgsLenAtDash() > 1:
				return fmt.Errorf("%d arguments before --, want one KEY: locker run KEY -- COMMAND [ARGS...]", cmd.ArgsLenAtDash())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runLocked(cmd.Context(), o, args[0], args[1:])
		},
	}
	f := cmd.Flags()
	o.lockOpts.flags(f)
	f.StringVarP(&o.shell, "shell", "c", "", "run this shell command line (with /bin/sh -c) instead of COMMAND")
	f.DurationVar(&o.killAfter, "kill-after", 0, "after the lock is lost, send the command SIGTERM and SIGKILL it this long after (default 0: SIGKILL at once, before another holder can have the lock)")
	return cmd
}

func (o runOpts) check() error {
	if o.killAfter < 0 {
		return fail(exitFailure, "--kill-after %v is negative", o.killAfter)
	}
	return o.lockOpts.check()
}

// forwarded are the signals locker passes on to the command: while it
// waits for the lock, they end the wait instead.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// runLocked takes the lock on key, runs argv while it is held, and gives it
// back: signals end the wait before the lock is granted and go to the
// command after; a lost lock ends the command (job.supervise).
func runLocked(ctx context.Context, o runOpts, key string, argv []string) (err error) {
	if err := o.check(); err != nil {
		return err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	cmdline := argv
	if o.shell != "" {
		cmdline = []string{"sh", "-c", o.shell}
	}
	o.owner = o.description(cmdline)
	guard := startGuardAsync()
	h, b, sigs, err := takeLock(ctx, o.lockOpts, key, jobSignals)
	if err != nil {
		guard.cancel()
		return err
	}
	defer signal.Stop(sigs)
	defer closeBackend(b, &err)

	child := command(o.shell, argv)
	child.Env = childEnv(os.Environ(), key, h.Token())
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	j, err := startJob(child, sigs, guard)
	if err != nil {
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
	ws, lost := j.supervise(h, key, o.killAfter)
	if lost {
		releaseQuietly(h) // in case the lock was not lost on the server
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
	return exitStatus(ws)
}

// takeLock opens the backend and takes the lock on key as o says, with
// signals caught from the start: one that comes while locker waits for the
// lock ends the wait (leaving nothing behind) instead of killing locker
// mid-call, and one that comes while the lock is being granted gives it
// back. The returned channel gets the signals that come after: it has been
// registered for forwarded and extra.
func takeLock(ctx context.Context, o lockOpts, key string, extra []os.Signal) (locker.Handle, *conn, chan os.Signal, error) {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	wctx, stopWait := context.WithCancelCause(ctx)
	defer stopWait(nil)
	endWatch := watchSignals(sigs, stopWait)
	h, b, err := func() (locker.Handle, *conn, error) {
		b, err := openBackend(wctx, o.backendOpts)
		if err != nil {
			return nil, nil, err
		}
		b.Locker = o.family(b.opened)
		if o.verbose {
			fmt.Fprintf(os.Stderr, "locker: acquiring the lock on %q (wait: %v)\n", key, &o.wait)
		}
		start := time.Now()
		stopNotice := waitNotice(wctx, os.Stderr, b, key, o)
		h, err := o.acquire(wctx, b, key)
		stopNotice()
		if err != nil {
			return nil, b, err
		}
		if o.verbose {
			fmt.Fprintf(os.Stderr, "locker: holding the lock on %q after %v, token %d, lease %v\n", key, time.Since(start).Round(time.Millisecond), h.Token(), h.TTL())
		}
		return h, b, nil
	}()
	// From here on signals are the caller's; one that came while the lock
	// was being granted means the user wants nothing done.
	s, _ := endWatch().(syscall.Signal)
	if s != 0 {
		if err == nil {
			releaseQuietly(h)
		}
		err = &exitError{code: 128 + int(s), msg: fmt.Sprintf("%v while waiting for the lock on %q; nothing was run", s, key)}
	}
	if err != nil {
		signal.Stop(sigs)
		if b != nil {
			_ = b.Close()
		}
		return nil, nil, nil, err
	}
	if len(extra) > 0 {
		signal.Notify(sigs, extra...)
	}
	return h, b, sigs, nil
}

// closeBackend closes b and reports its error on stderr when the run had
// none of its own.
func closeBackend(b *conn, err *error) {
	if cerr := b.Close(); cerr != nil && *err == nil {
		fmt.Fprintf(os.Stderr, "locker: closing the backend: %v\n", cerr)
	}
}

// childEnv is the command's environment: env with LOCKER_KEY and
// LOCKER_TOKEN, and a LOCKER_URL with a password replaced by its redacted
// form (the password as xxxxx). The command learns which backend holds its
// lock, and a locker it runs in turn fails saying why (see
// redactedPassword) rather than locking on another backend, which dropping
// LOCKER_URL would do silently.
func childEnv(env []string, key string, token int64) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		if u, ok := strings.CutPrefix(kv, "LOCKER_URL="); ok {
			if u, ok = childURL(u); !ok {
				continue
			}
			kv = "LOCKER_URL=" + u
		}
		if strings.HasPrefix(kv, "LOCKER_KEY=") || strings.HasPrefix(kv, "LOCKER_TOKEN=") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "LOCKER_KEY="+key, "LOCKER_TOKEN="+strconv.FormatInt(token, 10))
}

// childURL is the LOCKER_URL the command gets for raw: raw itself unless
// it has a password, else raw with the password as xxxxx; nothing (false)
// for a URL that does not parse, which may hide one anywhere.
func childURL(raw string) (string, bool) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", false
	}
	secret := false
	if _, ok := u.User.Password(); ok {
		secret = true
	}
	for name := range u.Query() {
		if strings.Contains(strings.ToLower(name), "password") {
			secret = true
		}
	}
	if !secret {
		return raw, true
	}
	return RedactURL(raw), true
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

// waitNoticeAfter is how long a waiting run stays silent before it says
// what it waits for.
var waitNoticeAfter = 10 * time.Second

// waitNotice says once on w (stderr), when the lock has not come within
// waitNoticeAfter, why locker is still waiting: who holds the lock, when the
// backend can tell (locker.Inspector), or that the backend does not answer
// (some clients, etcd's among them, wait for an unreachable server instead
// of failing). Not with --quiet, nor for a single try. The returned
// function stops it.
func waitNotice(ctx context.Context, w io.Writer, l locker.Locker, key string, o lockOpts) (stop func()) {
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

// command builds the command to run: argv, or the shell command line.
func command(shell string, argv []string) *exec.Cmd {
	if shell != "" {
		return exec.Command("/bin/sh", "-c", shell)
	}
	return exec.Command(argv[0], argv[1:]...)
}

// exitStatus is locker's exit for a command that ended with ws: its
// status, or 128+N when signal N ended it.
func exitStatus(ws syscall.WaitStatus) error {
	switch {
	case ws.Exited() && ws.ExitStatus() == 0:
		return nil
	case ws.Exited():
		return &exitError{code: ws.ExitStatus()}
	case ws.Signaled():
		return &exitError{code: 128 + int(ws.Signal())}
	}
	return &exitError{code: exitFailure, msg: fmt.Sprintf("the command ended with wait status %v", ws)}
}

func releaseQuietly(h locker.Handle) {
	ctx, cancel := context.WithTimeout(context.Background(), locker.ReleaseTimeout)
	defer cancel()
	_ = h.Release(ctx)
}
