package conformance

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/go-locker/locker"
)

// unsafeRefused: every configuration in Harness.Unsafe is refused with an
// error wrapping locker.ErrUnsafeConfig that names what is wrong, at
// construction or at the first TryAcquire; or, for an entry that says
// MadeSafe, a cut-off holder reports its loss before the next client holds.
func (s *suite) unsafeRefused(t *testing.T, ctx context.Context) {
	if len(s.h.Unsafe) == 0 {
		t.Skip("conformance: the harness lists no unsafe configurations (Harness.Unsafe)")
	}
	for _, u := range s.h.Unsafe {
		t.Run(u.Name, func(t *testing.T) {
			if u.New == nil {
				t.Fatalf("conformance: Harness.Unsafe entry %q has no New", u.Name)
			}
			if u.MadeSafe {
				s.needCut(t)
				a, b := s.newUnsafe(t, u), s.newUnsafe(t, u)
				if a == nil || b == nil {
					return
				}
				s.lossBeforeNext(t, ctx, a, b)
				return
			}
			l, err := u.New(t)
			if err == nil {
				if l == nil {
					t.Fatal("conformance: UnsafeConfig.New returned neither a Locker nor an error")
				}
				t.Cleanup(func() { _ = l.Close() })
				var h locker.Handle
				h, err = l.TryAcquire(ctx, key(t, ""))
				if err == nil {
					_ = h.Release(ctx)
					t.Fatalf("%s: accepted: a Locker was built and TryAcquire took a lock; it must be refused with an error wrapping locker.ErrUnsafeConfig", u.Name)
				}
			}
			checkUnsafeErr(t, u, err)
		})
	}
}

// newUnsafe builds one client of a MadeSafe configuration, closed when the
// test ends; nil (and the test failed) if it was refused after all.
func (s *suite) newUnsafe(t *testing.T, u UnsafeConfig) locker.Locker {
	t.Helper()
	l, err := u.New(t)
	if err != nil {
		t.Errorf("%s: the harness says it is made safe, but it was refused: %v", u.Name, err)
		return nil
	}
	if l == nil {
		t.Fatal("conformance: UnsafeConfig.New returned neither a Locker nor an error")
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func checkUnsafeErr(t *testing.T, u UnsafeConfig, err error) {
	t.Helper()
	switch {
	case errors.Is(err, locker.ErrNotAcquired):
		t.Errorf("%s: refused with %v; ErrNotAcquired means another holder has the key, a refused configuration must wrap locker.ErrUnsafeConfig", u.Name, err)
	case !errors.Is(err, locker.ErrUnsafeConfig):
		t.Errorf("%s: refused with %v, want an error wrapping locker.ErrUnsafeConfig", u.Name, err)
	case u.Mention != "" && !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(u.Mention)):
		t.Errorf("%s: refused with %q, which does not name %q", u.Name, err, u.Mention)
	default:
		t.Logf("%s: refused: %v", u.Name, err)
	}
}
