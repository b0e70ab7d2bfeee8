package backend

import "github.com/go-locker/locker"

// KeyError returns a *locker.Error for op on key caused by err, or nil when
// err is nil: the error every backend returns from a call on a key, so that
// callers find the key and the operation with errors.As and the cause with
// errors.Is.
func KeyError(op, key string, err error) error {
	if err == nil {
		return nil
	}
	return &locker.Error{Op: op, Key: key, Err: err}
}

// ApplyOptions applies the per-call options of Acquire or TryAcquire in
// order to a zero locker.Options and returns the result, or the first
// option's error (wrapping locker.ErrInvalidOption). Nil options are
// ignored. A backend reads the TTL a call asks for from it.
func ApplyOptions(opts ...locker.Option) (locker.Options, error) {
	if len(opts) == 0 {
		// The usual call; o below escapes to the heap (the options are
		// functions the compiler cannot see into), on every call.
		return locker.Options{}, nil
	}
	var o locker.Options
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&o); err != nil {
			return locker.Options{}, err
		}
	}
	return o, nil
}

// Owner returns the holder's description that opts give with
// locker.WithOwner, or "" when they give none or are invalid (ApplyOptions
// reports that). A backend stores it with the lock where it can and
// returns it from Inspect in locker.LockInfo.Owner.
func Owner(opts []locker.Option) string {
	o, err := ApplyOptions(opts...)
	if err != nil {
		return ""
	}
	return o.Owner
}
