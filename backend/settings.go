package backend

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"time"

	"github.com/go-locker/locker"
)

// Settings are the Locker settings that have one option name and one URL
// parameter on every backend: a backend's configuration embeds Settings, its
// exported options for them are one line over the Setting functions below
// (WithDefaultTTL over SetDefaultTTL, and so on), and its URL opener reads
// them with Query.Shared. The zero value of a field means "the backend's
// default"; a backend fills in its defaults before applying options and
// checks its own ranges after (see Apply).
//
// The shared names, Go option and URL parameter:
//
//	WithDefaultTTL(d)     ttl=30s            the lease of a lock taken without locker.WithTTL
//	WithDriftMargin(d)    drift_margin=200ms how long before its lease may have run out a holder gives the lock up
//	WithPrefix(s)         prefix=app1        the keyspace: Lockers exclude each other only with the same prefix
//	WithRetryInterval(d)  retry_interval=1s  the longest a waiter sleeps when no wake-up comes
//	WithoutDDL()          ddl=false          create no tables, sequences or other schema objects
//	WithoutWatchdog()     watchdog=false     no automatic renewal: a lock ends after its TTL
//	WithTokenBase(n)      token_base=n       every token is n + the backend's own token (see locker.MaxTokenBase)
//	WithLogger(l)         (none)             where the backend logs its events (nil: nowhere)
//
// A backend offers the Go options it can honour. Its URL opener accepts
// every shared parameter: one that cannot change anything there (ddl=false
// on a backend that creates no schema, retry_interval where the server
// wakes every waiter) is checked and has no effect; one whose request it
// cannot honour and must not ignore (watchdog=false where locks are always
// renewed, a prefix where the keyspace is named another way) is refused
// with an error that names it and says why.
type Settings struct {
	TTL           time.Duration // the default lease (WithDefaultTTL, ttl)
	DriftMargin   time.Duration // WithDriftMargin, drift_margin; 0: derived from the TTL
	Prefix        string        // WithPrefix, prefix
	RetryInterval time.Duration // WithRetryInterval, retry_interval
	NoDDL         bool          // WithoutDDL, ddl=false
	NoWatchdog    bool          // WithoutWatchdog, watchdog=false
	TokenBase     int64         // WithTokenBase, token_base: added to every token (Token)
	Logger        *slog.Logger  // WithLogger: renewal failures, at risk and cleared, reconnects, losses; nil: none
}

// A Setting sets one field of Settings, or reports an invalid value as an
// error wrapping locker.ErrInvalidOption that names the option. A
// backend's Option for a shared setting applies a Setting to the Settings
// its configuration embeds.
type Setting func(*Settings) error

// The URL parameters of the shared settings.
const (
	ParamTTL           = "ttl"
	ParamDriftMargin   = "drift_margin"
	ParamPrefix        = "prefix"
	ParamRetryInterval = "retry_interval"
	ParamDDL           = "ddl"
	ParamWatchdog      = "watchdog"
	ParamTokenBase     = "token_base"
)

// SharedParams are the URL parameters of the shared settings, in the order
// Query.Shared reads them.
var SharedParams = []string{ParamTTL, ParamDriftMargin, ParamPrefix, ParamRetryInterval, ParamDDL, ParamWatchdog, ParamTokenBase}

func positive(option string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: %s: must be positive, got %v", locker.ErrInvalidOption, option, d)
	}
	return nil
}

// SetDefaultTTL is WithDefaultTTL: the lease of a lock taken without a
// per-call locker.WithTTL. It must be within the portable range
// [locker.MinTTL, locker.MaxTTL], as every TTL is (CheckTTL).
func SetDefaultTTL(d time.Duration) Setting {
	return func(s *Settings) error {
		if err := CheckTTL("WithDefaultTTL", d); err != nil {
			return err
		}
		s.TTL = d
		return nil
	}
}

// SetDriftMargin is WithDriftMargin. It must be positive; the backend
// checks it against the TTL.
func SetDriftMargin(d time.Duration) Setting {
	return func(s *Settings) error {
		if err := positive("WithDriftMargin", d); err != nil {
			return err
		}
		s.DriftMargin = d
		return nil
	}
}

// SetPrefix is WithPrefix. The backend checks the form it needs.
func SetPrefix(p string) Setting {
	return func(s *Settings) error {
		s.Prefix = p
		return nil
	}
}

// SetRetryInterval is WithRetryInterval. It must be at least a
// millisecond.
func SetRetryInterval(d time.Duration) Setting {
	return func(s *Settings) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: WithRetryInterval: must be at least 1ms, got %v", locker.ErrInvalidOption, d)
		}
		s.RetryInterval = d
		return nil
	}
}

// SetNoDDL is WithoutDDL.
func SetNoDDL() Setting {
	return func(s *Settings) error {
		s.NoDDL = true
		return nil
	}
}

// SetNoWatchdog is WithoutWatchdog.
func SetNoWatchdog() Setting {
	return func(s *Settings) error {
		s.NoWatchdog = true
		return nil
	}
}

// SetLogger is WithLogger: where the backend logs its events (a renewal
// failed, a lock at risk and cleared, a connection replaced, a lock lost
// and why; backend.Log). A nil logger, the default, logs nothing. It has
// no URL parameter: a logger is not text.
func SetLogger(l *slog.Logger) Setting {
	return func(s *Settings) error {
		s.Logger = l
		return nil
	}
}

// SetTokenBase is WithTokenBase: every token the Locker hands out (Handle.Token,
// LockInfo.Token) is n plus the backend's own token (the rule and why it
// is an offset: locker.MaxTokenBase). n must be within [0,
// locker.MaxTokenBase].
func SetTokenBase(n int64) Setting {
	return func(s *Settings) error {
		if err := checkTokenBase(n); err != nil {
			return fmt.Errorf("WithTokenBase: %w", err)
		}
		s.TokenBase = n
		return nil
	}
}

func checkTokenBase(n int64) error {
	if n < 0 || n > locker.MaxTokenBase {
		return fmt.Errorf("%w: token base %d is outside [0, %d] (locker.MaxTokenBase, 2^62)", locker.ErrInvalidOption, n, locker.MaxTokenBase)
	}
	return nil
}

// Token returns the token a Locker with these settings hands out for the
// backend's own token native: TokenBase + native. A backend calls it for
// every token it reports (Handle.Token, LockInfo.Token, a transaction
// lock's token) and keeps native for its own use (the server's guards).
//
// It refuses, with an error wrapping locker.ErrInvalidOption that names
// token_base, a native token that is not positive or that the base would
// carry past the int64 range. Neither happens to a token the backend issues
// in its own range (below 2^62 on every backend, and the base is at most
// 2^62): the backend must then refuse the acquisition (giving the lock
// back) rather than hand out a wrapped-around token.
func (s *Settings) Token(native int64) (int64, error) {
	return BaseToken(s.TokenBase, native)
}

// BaseToken is Settings.Token for the base given.
func BaseToken(base, native int64) (int64, error) {
	switch {
	case native <= 0:
		return 0, fmt.Errorf("%w: %s: the backend's own token %d is not positive (was its counter overwritten?)", locker.ErrInvalidOption, ParamTokenBase, native)
	case native > math.MaxInt64-base:
		return 0, fmt.Errorf("%w: %s %d plus the backend's own token %d is beyond the int64 range (the backend's tokens stay below 2^62 unless a counter was written by hand)", locker.ErrInvalidOption, ParamTokenBase, base, native)
	}
	return base + native, nil
}

// Apply applies opts in order to cfg, skipping nil ones, and returns every
// error they reported, joined (so that a user sees all bad options at
// once). It is the one apply loop of every backend's options: each backend's
// Option type is a func(*config) error over its own configuration.
func Apply[C any, O ~func(*C) error](cfg *C, opts []O) error {
	var errs []error
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(cfg); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Shared reads the shared parameters (SharedParams) from q and returns
// the Settings they set, in that order, for the backend to apply as its
// options. A parameter given a value that refuse maps to a reason is
// reported, naming it, with that reason: for watchdog and ddl only the
// value false is refused (true is every backend's default); for the others
// any value is. A malformed value is recorded in q as its getters do.
func (q *Query) Shared(refuse map[string]string) []Setting {
	var out []Setting
	refused := func(name string, nonDefault bool) bool {
		if why, ok := refuse[name]; ok && nonDefault {
			q.fail(name, "not supported by this backend: %s", why)
			return true
		}
		return false
	}
	var d time.Duration
	if q.Has(ParamTTL) {
		d = 0
		q.Duration(ParamTTL, &d)
		if d > 0 && !refused(ParamTTL, true) {
			out = append(out, SetDefaultTTL(d))
		}
	}
	if q.Has(ParamDriftMargin) {
		d = 0
		q.Duration(ParamDriftMargin, &d)
		if d > 0 && !refused(ParamDriftMargin, true) {
			out = append(out, SetDriftMargin(d))
		}
	}
	if p, ok := q.Take(ParamPrefix); ok && !refused(ParamPrefix, true) {
		out = append(out, SetPrefix(p))
	}
	if q.Has(ParamRetryInterval) {
		d = 0
		q.Duration(ParamRetryInterval, &d)
		if d > 0 && !refused(ParamRetryInterval, true) {
			out = append(out, SetRetryInterval(d))
		}
	}
	ddl, watchdog := true, true
	if q.Has(ParamDDL) {
		q.Bool(ParamDDL, &ddl)
		if !ddl && !refused(ParamDDL, true) {
			out = append(out, SetNoDDL())
		}
	}
	if q.Has(ParamWatchdog) {
		q.Bool(ParamWatchdog, &watchdog)
		if !watchdog && !refused(ParamWatchdog, true) {
			out = append(out, SetNoWatchdog())
		}
	}
	if v, ok := q.Take(ParamTokenBase); ok {
		n, err := strconv.ParseInt(v, 10, 64)
		switch {
		case err != nil:
			q.fail(ParamTokenBase, "%q is not a decimal integer from 0 to %d (2^62)", v, locker.MaxTokenBase)
		case checkTokenBase(n) != nil:
			q.fail(ParamTokenBase, "%d is outside [0, %d] (2^62)", n, locker.MaxTokenBase)
		case n > 0 && !refused(ParamTokenBase, true):
			out = append(out, SetTokenBase(n))
		}
	}
	return out
}
