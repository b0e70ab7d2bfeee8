package conformance

import (
	"errors"
	"testing"

	"github.com/go-locker/locker"
)

// checkKeyError checks that err, an error the contract says names a key, is
// (or wraps) a *locker.Error for k.
func checkKeyError(t *testing.T, err error, k, what string) {
	t.Helper()
	var ke *locker.Error
	if !errors.As(err, &ke) {
		t.Errorf("%s: error %v is not a *locker.Error (errors.As); backends return backend.KeyError(op, key, cause) so that every error names its key", what, err)
		return
	}
	if ke.Key != k {
		t.Errorf("%s: *locker.Error names key %q, want %q", what, truncate(ke.Key), truncate(k))
	}
}
