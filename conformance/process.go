package conformance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// The Process cases hold a key in another OS process: the test binary run
// again, selecting with -test.run the very test that called Run. There Run
// sees childKeyEnv, takes the key with a Locker from Harness.NewLocker,
// prints its token and holds the key until its standard input closes (then
// it releases) or it is killed. A backend that locks only within its
// process, or whose tokens are per process, fails these cases.
//
// The child builds its Locker the way the parent's test does, so the harness
// must reach the same server from a fresh process: a server named by an
// environment variable is inherited, and a test-server provider that starts
// containers should publish their addresses into the environment of the
// process (os.Setenv) for children to find.

const (
	childKeyEnv  = "LOCKER_CONFORMANCE_CHILD_KEY"
	childTTLEnv  = "LOCKER_CONFORMANCE_CHILD_TTL"
	childRunEnv  = "LOCKER_CONFORMANCE_CHILD_RUN"
	childTokenAt = "locker-conformance-child: holds token="
	childFailAt  = "locker-conformance-child: failed: "
	// The parent writes childWatch to the child's standard input before it
	// pauses the child (Process/PausedHolder); the child answers
	// childWatching, and once it resumes, childResumed with what its handle
	// said at the first look.
	childWatch    = "watch-pause"
	childWatching = "locker-conformance-child: watching for a pause"
	childResumed  = "locker-conformance-child: resumed: "
)

// runChild is Run in a child process: hold the key it was given.
func runChild(t *testing.T, h Harness) {
	k := os.Getenv(childKeyEnv)
	ttl, err := time.ParseDuration(os.Getenv(childTTLEnv))
	if err != nil {
		fmt.Printf("%s%v\n", childFailAt, err)
		t.Fatalf("conformance child: bad %s: %v", childTTLEnv, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l := h.NewLocker(t)
	defer l.Close()
	hd, err := l.TryAcquire(ctx, k, locker.WithTTL(ttl))
	if err != nil {
		fmt.Printf("%s%v\n", childFailAt, strings.ReplaceAll(err.Error(), "\n", " "))
		t.Fatalf("conformance child: TryAcquire: %v", err)
	}
	fmt.Printf("%s%d\n", childTokenAt, hd.Token())
	// Hold until the parent closes stdin (or kills this process).
	paused := false
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == childWatch && !paused {
			paused = true
			watchPause(hd, ttl)
		}
	}
	if err := hd.Release(ctx); err != nil && !(paused && errors.Is(err, locker.ErrLost)) {
		t.Errorf("conformance child: Release: %v", err)
	}
}

// watchPause looks at hd the moment this process resumes from a pause of
// more than ttl/2: a goroutine reads the clock in a loop, with no call that
// would let the runtime's timers run first, and on the first gap reads Err
// and Done. A backend whose handle answers from a timer that has not fired
// yet says "held" then, although its lease has run out.
func watchPause(hd locker.Handle, ttl time.Duration) {
	started := make(chan struct{})
	go func() {
		// The clock is read before the parent hears "watching": read
		// after, it could fall after the pause (this goroutine descheduled
		// between the two on a loaded machine), and no gap would be seen.
		last := time.Now()
		close(started)
		for {
			now := time.Now()
			if gap := now.Sub(last); gap > ttl/2 {
				err, done := hd.Err(), isClosed(hd.Done())
				fmt.Printf("%slost=%t done=%t gap=%v err=%v\n", childResumed, errors.Is(err, locker.ErrLost), done, gap.Round(time.Millisecond), err)
				return
			}
			last = now
		}
	}()
	<-started
	fmt.Println(childWatching)
}

// childHolder is a child process that holds a key.
type childHolder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	token int64
	exit  chan error
	lines chan string // what the child prints after its token
}

// startChild runs the test binary again to hold k, and waits until it holds
// it (or says why it could not).
func (s *suite) startChild(t *testing.T, k string) *childHolder {
	t.Helper()
	if s.runName == "" {
		t.Fatal("conformance: suite bug: the name of the test that called Run is unknown")
	}
	var pat []string
	for _, part := range strings.Split(s.runName, "/") {
		pat = append(pat, "^"+regexp.QuoteMeta(part)+"$")
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(pat, "/"), "-test.count=1", "-test.timeout=3m")
	cmd.Env = append(os.Environ(), childKeyEnv+"="+k, childTTLEnv+"="+s.h.TTL.String(), childRunEnv+"="+s.runName)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("conformance: start a child process to hold a key: %v", err)
	}
	c := &childHolder{cmd: cmd, stdin: stdin, exit: make(chan error, 1), lines: make(chan string, 16)}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.exit
	})
	got := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sent := false
		var out strings.Builder
		for sc.Scan() {
			line := sc.Text()
			if !sent && (strings.HasPrefix(line, childTokenAt) || strings.HasPrefix(line, childFailAt)) {
				got <- line
				sent = true
			} else if sent && strings.HasPrefix(line, "locker-conformance-child: ") {
				select {
				case c.lines <- line:
				default:
				}
			}
			if out.Len() < 4000 {
				out.WriteString(line + "\n")
			}
		}
		if !sent {
			got <- "exited before holding the key; its output:\n" + out.String()
		}
		c.exit <- cmd.Wait()
	}()
	select {
	case line := <-got:
		tok, ok := strings.CutPrefix(line, childTokenAt)
		if !ok {
			t.Fatalf("child process could not take a free key: %s", strings.TrimPrefix(line, childFailAt))
		}
		c.token, err = strconv.ParseInt(tok, 10, 64)
		if err != nil {
			t.Fatalf("child process printed a bad token %q", tok)
		}
	case <-time.After(time.Minute):
		t.Fatal("child process did not take a free key within a minute")
	}
	return c
}

// release asks the child to release its key and exit, and waits for it.
func (c *childHolder) release(t *testing.T) {
	t.Helper()
	_ = c.stdin.Close()
	select {
	case err := <-c.exit:
		c.exit <- err // for the cleanup
		if err != nil {
			t.Errorf("child process that held the key ended with %v (see its output above)", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("child process did not release and exit within a minute")
	}
}

// kill kills the child with SIGKILL and waits until it is gone.
func (c *childHolder) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill the child process: %v", err)
	}
	err := <-c.exit
	c.exit <- err
}

func (s *suite) needProcesses(t *testing.T) {
	if s.h.InProcess {
		t.Skip("conformance: the backend locks within one process by design (Harness.InProcess)")
	}
	if testing.Short() {
		t.Skip("conformance: -short: the Process cases start child processes")
	}
}

// processExclusion: while a child process holds a key, this process cannot
// take it; once the child releases, this process gets it with a higher token.
func (s *suite) processExclusion(t *testing.T, ctx context.Context) {
	s.needProcesses(t)
	l := s.newLocker(t)
	k := key(t, "")
	child := s.startChild(t, k)
	mustNotTry(t, ctx, l, k, "a child process holds it")
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if h, err := l.Acquire(wctx, k); err == nil {
		_ = h.Release(ctx)
		t.Fatal("Acquire succeeded while a child process held the key")
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire while a child process holds the key: %v, want an error wrapping context.DeadlineExceeded", err)
	}
	ch := goAcquire(ctx, l, k)
	released := time.Now()
	child.release(t)
	r := await(t, ch, s.h.HandoffBound+prompt, "Acquire after the child process released")
	if r.err != nil {
		t.Fatalf("Acquire after the child process released: %v", r.err)
	}
	t.Logf("key held here %v after the child process was told to release", r.at.Sub(released))
	if r.h.Token() <= child.token {
		t.Errorf("token %d here is not greater than the child process's %d", r.h.Token(), child.token)
	}
	mustRelease(t, ctx, r.h)
}

// processKilled: a child process that holds a key is killed with SIGKILL;
// this process gets the key within ExpiryBound, with a higher token.
func (s *suite) processKilled(t *testing.T, ctx context.Context) {
	s.needProcesses(t)
	l := s.newLocker(t)
	k := key(t, "")
	child := s.startChild(t, k)
	mustNotTry(t, ctx, l, k, "a child process holds it")
	child.kill(t)
	killed := time.Now()
	mustRelease(t, ctx, s.awaitAfterFault(t, goAcquire(ctx, l, k), killed, tokenOnly(child.token), "the child process that held it was killed"))
}

// tokenOnly is a stand-in Handle for a holder in another process, of which
// the suite knows only the token.
type tokenOnly int64

func (tokenOnly) Key() string                   { return "" }
func (t tokenOnly) Token() int64                { return int64(t) }
func (tokenOnly) Done() <-chan struct{}         { return nil }
func (tokenOnly) Err() error                    { return nil }
func (tokenOnly) TTL() time.Duration            { return 0 }
func (tokenOnly) Release(context.Context) error { return nil }
