package cli

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/exiting"
)

// What run and hold share: the backend, the bounds on talking to it, and
// how the lock is taken.

// defaultTimeout bounds the connection to the backend and each attempt on
// it (--timeout): long enough for a slow network or a server under load,
// short enough that a cron job facing an outage fails instead of piling up.
const defaultTimeout = 10 * time.Second

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

// backendOpts are the flags of every subcommand that talks to a backend.
type backendOpts struct {
	url     string
	timeout time.Duration
}

func (b *backendOpts) flags(f *pflag.FlagSet, urlHelp string) {
	f.StringVar(&b.url, "url", "", urlHelp)
	f.DurationVar(&b.timeout, "timeout", defaultTimeout, "bound on connecting to the backend and on each attempt on it; past it locker fails with status 125")
}

func (b backendOpts) check() error {
	if b.timeout <= 0 {
		return fail(exitFailure, "--timeout %v must be positive", b.timeout)
	}
	return nil
}

// lockOpts are the flags of the subcommands that take a lock (run, hold).
type lockOpts struct {
	backendOpts
	ttl          time.Duration
	wait         waitFlag
	conflictCode int
	quiet        bool
	verbose      bool
	shared       bool      // the read lock of the key's reader-writer lock
	exclusive    bool      // the write lock of the key's reader-writer lock
	limit        limitFlag // a permit of the key's semaphore of limit.n
	owner        string    // the holder's description (ownerDescription), for status
	ownerFlag    ownerFlag // --owner, which replaces it
}

// limitFlag is --limit N: set says it was given (--limit 0 is an error,
// not "no limit").
type limitFlag struct {
	n   int
	set bool
}

func (l *limitFlag) String() string {
	if !l.set {
		return ""
	}
	return strconv.Itoa(l.n)
}

func (l *limitFlag) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("%q is not a whole number", s)
	}
	l.n, l.set = n, true
	return nil
}

func (l *limitFlag) Type() string { return "N" }

func (o *lockOpts) flags(f *pflag.FlagSet) {
	o.wait = waitFlag{forever: true}
	o.backendOpts.flags(f, "backend URL (default $LOCKER_URL, else the SQLite database above)")
	f.DurationVar(&o.ttl, "ttl", 0, "lease of the lock, renewed while it is held, within [1s, 24h] (default: locker.DefaultTTL, 30s)")
	f.Var(&o.wait, "wait", `how long to wait for the lock: a duration, 0 for one try (like flock -n), or "forever"`)
	f.IntVarP(&o.conflictCode, "conflict-exit-code", "E", 1, "exit status when the lock stays held elsewhere for --wait (like flock -E)")
	f.BoolVarP(&o.quiet, "quiet", "q", false, "say nothing when the lock is held elsewhere (the exit status tells)")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "say on stderr when locker starts waiting for the lock, and how long it took")
	f.BoolVarP(&o.shared, "shared", "s", false, "take the read lock of the key's reader-writer lock: any number of --shared holders at once (like flock -s)")
	f.BoolVarP(&o.exclusive, "exclusive", "x", false, "take the write lock of the key's reader-writer lock: no --shared or other --exclusive holder (like flock -x)")
	f.Var(&o.limit, "limit", "take one of the N permits of the key's semaphore: at most N holders at once, all with the same N (like consul lock -n)")
	f.Var(&o.ownerFlag, "owner", `describe the holder for "locker status" instead of host, pid, start time and command line (which anyone who can read the backend sees); "" records none`)
}

func (o lockOpts) check() error {
	switch {
	case o.conflictCode < 0 || o.conflictCode > 255:
		return fail(exitFailure, "--conflict-exit-code %d is not an exit status (0-255)", o.conflictCode)
	case o.ttl < 0:
		return fail(exitFailure, "--ttl %v is negative", o.ttl)
	case o.limit.set && o.limit.n < 1:
		return fail(exitFailure, "--limit %d: a semaphore needs at least 1 permit", o.limit.n)
	case o.ownerFlag.err != nil:
		return fail(exitFailure, "--owner: %v", o.ownerFlag.err)
	case btoi(o.shared)+btoi(o.exclusive)+btoi(o.limit.set) > 1:
		return fail(exitFailure, "--shared, --exclusive and --limit are three kinds of lock: give one at most")
	}
	return o.backendOpts.check()
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// family is the Locker whose Acquire and TryAcquire take the kind of lock
// the flags ask for: l itself (the mutex, which programs take with
// locker.Do), the read or write lock of the key's reader-writer lock, or a
// permit of its semaphore. These are four different locks of one key: a
// run without --shared or --exclusive does not wait for --shared runs.
func (o lockOpts) family(l locker.Locker) locker.Locker {
	switch {
	case o.shared:
		return locker.ReadLock(l)
	case o.exclusive:
		return locker.WriteLock(l)
	case o.limit.set:
		return locker.Semaphore(l, o.limit.n)
	}
	return l
}

func (o lockOpts) options() []locker.Option {
	var opts []locker.Option
	if o.ttl > 0 {
		opts = append(opts, locker.WithTTL(o.ttl))
	}
	if o.owner != "" {
		opts = append(opts, locker.WithOwner(o.owner))
	}
	return opts
}

// defaultURLHelp describes the default lock database for --help.
func DefaultURLHelp() string {
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
func BackendURL(flag string) (string, error) {
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

// passwordPlaceholder is what the password of a URL becomes in the
// LOCKER_URL that locker run gives its command (see childEnv).
const passwordPlaceholder = "xxxxx"

// redactedPassword reports whether the URL's password is the placeholder:
// the URL came from the environment of a command that locker run started,
// and logging in with it would fail with a misleading error.
func redactedPassword(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	if pw, ok := u.User.Password(); ok && pw == passwordPlaceholder {
		return true
	}
	for name, vs := range u.Query() {
		if strings.Contains(strings.ToLower(name), "password") {
			for _, v := range vs {
				if v == passwordPlaceholder {
					return true
				}
			}
		}
	}
	return false
}

// errTimeout is the cause of a call cut short by --timeout.
var errTimeout = errors.New("--timeout reached")

// conn is an open Locker with the URL it was opened from, as shown. Its
// Acquire and TryAcquire may be a lock family's (lockOpts.family); Close
// closes the Locker opened.
type conn struct {
	locker.Locker
	opened  locker.Locker // what locker.Open returned
	shown   string        // the URL with its password hidden
	timeout time.Duration
}

// Close closes the Locker opened (a family's view closes nothing). The
// command exits right after, so it tells the backends first: what the
// process's end frees they may leave to it (internal/exiting; the SQLite
// default then spares its exit four disk syncs).
func (b *conn) Close() error {
	exiting.Begin()
	return b.opened.Close()
}

// openBackend opens the backend, bounded by --timeout.
func openBackend(ctx context.Context, o backendOpts) (*conn, error) {
	u, err := BackendURL(o.url)
	if err != nil {
		return nil, fail(exitFailure, "%v", err)
	}
	if redactedPassword(u) {
		return nil, fail(exitFailure, "the password in %s is %q, the placeholder locker run puts in its command's LOCKER_URL: give this locker the URL itself (--url, or a LOCKER_URL of its own)", RedactURL(u), passwordPlaceholder)
	}
	if err := delegateURL(u); err != nil {
		return nil, err
	}
	b := &conn{shown: RedactURL(u), timeout: o.timeout}
	octx, cancel := context.WithTimeoutCause(ctx, o.timeout, errTimeout)
	defer cancel()
	l, err := locker.Open(octx, u)
	if err != nil {
		return nil, b.failure(ctx, octx, "connecting", err)
	}
	b.Locker, b.opened = l, l
	return b, nil
}

// failure is the exit of a call on the backend that failed with err under
// cctx, a context derived from ctx with --timeout: when --timeout cut it
// short, a line that says the backend did not answer.
func (b *conn) failure(ctx, cctx context.Context, what string, err error) error {
	if ctx.Err() == nil && errors.Is(context.Cause(cctx), errTimeout) {
		return fail(exitFailure, "the backend %s did not answer within --timeout %v (%s): %v", b.shown, b.timeout, what, err)
	}
	return fail(exitFailure, "%v", err)
}

// try makes one attempt on key, bounded by --timeout. It returns an error
// wrapping locker.ErrNotAcquired only when another holder has the key;
// every other failure is an *exitError with status 125.
func (b *conn) try(ctx context.Context, key string, opts []locker.Option) (locker.Handle, error) {
	tctx, cancel := context.WithTimeoutCause(ctx, b.timeout, errTimeout)
	defer cancel()
	h, err := b.TryAcquire(tctx, key, opts...)
	switch {
	case err == nil:
		return h, nil
	case errors.Is(err, locker.ErrNotAcquired) && tctx.Err() == nil:
		return nil, err
	default:
		return nil, b.failure(ctx, tctx, "trying the lock on "+fmt.Sprintf("%q", key), err)
	}
}

var errWaited = errors.New("--wait elapsed")

// acquire takes the lock as --wait says. A first try, bounded by
// --timeout, tells an outage (status 125) from a key held elsewhere; only
// then does it wait, and when the wait is over a last try (bounded by
// --timeout too) tells again: status --conflict-exit-code only when
// another holder was seen, never for a backend that stopped answering.
func (o lockOpts) acquire(ctx context.Context, b *conn, key string) (locker.Handle, error) {
	opts := o.options()
	start := time.Now()
	h, err := b.try(ctx, key, opts)
	if err == nil || !errors.Is(err, locker.ErrNotAcquired) {
		return h, err
	}
	if !o.wait.forever && o.wait.d == 0 {
		return nil, o.conflict(key)
	}
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if !o.wait.forever {
		wctx, cancel = context.WithDeadlineCause(ctx, start.Add(o.wait.d), errWaited)
	}
	defer cancel()
	h, err = b.Acquire(wctx, key, opts...)
	switch {
	case err == nil:
		return h, nil
	case ctx.Err() != nil:
		return nil, fail(exitFailure, "%v", err)
	case errors.Is(context.Cause(wctx), errWaited):
		h, err = b.try(ctx, key, opts)
		if errors.Is(err, locker.ErrNotAcquired) {
			return nil, o.conflict(key)
		}
		return h, err
	default:
		return nil, fail(exitFailure, "%v", err)
	}
}

// conflict is the exit of a run whose key stayed held elsewhere.
func (o lockOpts) conflict(key string) error {
	if o.quiet {
		return &exitError{code: o.conflictCode}
	}
	msg := fmt.Sprintf("the lock on %q is held elsewhere", key)
	if o.wait.d > 0 {
		msg += fmt.Sprintf(" (waited %v)", o.wait.d)
	}
	return &exitError{code: o.conflictCode, msg: msg}
}

// RedactURL is u with its password, and query parameters named like one,
// blanked out.
func RedactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		// Say no more than the scheme: the rest may hold a password.
		if i := strings.Index(u, ":"); i > 0 {
			return u[:i] + ":..."
		}
		return "the backend"
	}
	return backend.Redact(p.Redacted(), p)
}
