package locker

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"
)

// ErrNotAcquired reports that TryAcquire found the key held by another holder.
var ErrNotAcquired = errors.New("locker: not acquired")

// ErrLost reports that a lock was held but can no longer be trusted to be: its
// lease ran out before it could be renewed, the session or connection that
// carried it ended, or another holder owns the key now. Work that relied on the
// lock must stop; writes must be fenced with the token.
var ErrLost = errors.New("locker: lock lost")

// ErrReleased reports use of a handle after Release, or after the Close of
// its Locker released it (some backends report ErrLost for those).
var ErrReleased = errors.New("locker: lock released")

// ErrInvalidKey reports a key that no backend accepts: empty, longer than
// MaxKeyLen bytes, not valid UTF-8, or containing a NUL byte.
var ErrInvalidKey = errors.New("locker: invalid key")

// ErrInvalidOption reports an option value that no Locker accepts, such as a
// TTL outside the portable range [MinTTL, MaxTTL], a token base above
// MaxTokenBase, or a semaphore's limit below 1.
var ErrInvalidOption = errors.New("locker: invalid option")

// ErrUnsafeConfig reports a configuration the Locker refuses because it would
// break the contract: a Redis that may evict locks or their fence counters, a
// temporary SQL schema (every connection would see a table of its own), one
// Redlock server listed under two names (it would count twice towards a
// majority). The error names the setting or option at fault and how to fix
// it. Backends refuse such a configuration at construction when they can see
// it there, else at the first call that finds it; the same configuration is
// refused on every backend where it can arise, with an error wrapping this one.
var ErrUnsafeConfig = errors.New("locker: unsafe configuration")

// ErrClosed reports use of a Locker after Close.
var ErrClosed = errors.New("locker: closed")

// ErrReleasedByClose is the error of a Handle whose Locker was closed while it
// held the lock: it wraps both ErrReleased (Close gave the lock up) and
// ErrClosed (it was not the holder's own Release). Backends end such handles
// with it, so that callers can tell the two apart with errors.Is.
var ErrReleasedByClose = fmt.Errorf("%w by Close (%w)", ErrReleased, ErrClosed)

// ErrUnknownScheme reports a URL given to Open whose scheme no backend has
// registered, usually because the backend package was not imported.
var ErrUnknownScheme = errors.New("locker: unknown scheme")

// ErrInvalidURL reports a URL given to Open that its backend cannot use: a
// malformed URL, an unknown or malformed query parameter.
var ErrInvalidURL = errors.New("locker: invalid URL")

// Error records a failed operation on a key, in the manner of os.PathError.
// Backends return it so that every error names the key it concerns; Unwrap
// gives the cause, which is matched with errors.Is (ErrNotAcquired, ErrLost,
// context.Canceled, a client library's own error, ...).
type Error struct {
	Op  string // "acquire", "try-acquire", "release", "renew", ...
	Key string
	Err error
}

// maxKeyInError bounds how much of a key an error message quotes.
const maxKeyInError = 128

func (e *Error) Error() string {
	k := e.Key
	if len(k) > maxKeyInError {
		cut := maxKeyInError
		for cut > 0 && !utf8.RuneStart(k[cut]) {
			cut--
		}
		k = k[:cut] + "…"
	}
	return fmt.Sprintf("%s %q: %v", e.Op, k, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// keyError returns an *Error for op on key caused by err, or nil when err
// is nil (backend.KeyError is the same for backends).
func keyError(op, key string, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Op: op, Key: key, Err: err}
}

// contextError is the error of a call that ctx ended: ctx.Err(), and ctx's
// cause when it has another (context.WithCancelCause, WithDeadlineCause),
// so that errors.Is finds both. backend.ContextError is the same for
// backends.
func contextError(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, err) {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}
