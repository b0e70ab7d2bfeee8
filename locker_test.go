package locker_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/memlock"
)

func TestValidateKey(t *testing.T) {
	tests := []struct {
		name    string
		key     string
		wantErr string // substring of the message; "" means valid
	}{
		{"Empty", "", "empty"},
		{"MaxLen", strings.Repeat("a", locker.MaxKeyLen), ""},
		{"MaxLenPlusOne", strings.Repeat("a", locker.MaxKeyLen+1), "1025 bytes"},
		{"MaxLenMultibyte", strings.Repeat("🔒", locker.MaxKeyLen/4), ""},
		{"MultibyteOverMax", strings.Repeat("a", locker.MaxKeyLen-1) + "é", "1025 bytes"},
		{"InvalidUTF8", "a\xffb", "UTF-8"},
		{"TruncatedRune", "\xe2\x82", "UTF-8"},
		{"NUL", "a\x00b", "NUL byte at offset 1"},
		{"OnlyNUL", "\x00", "NUL"},
		{"Slash", "/", ""},
		{"DotDot", "..", ""},
		{"Path", "a/b/../c", ""},
		{"Spaces", "  a b  ", ""},
		{"Quotes", `"'` + "`", ""},
		{"Glob", "*", ""},
		{"HashTag", "{tag}", ""},
		{"PercentEncoded", "a%2Fb", ""},
		{"ControlChars", "\t\n\r\x7f", ""},
		{"Unicode", "ключ/鍵/🔒", ""},
		{"Backslash", `a\b`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := locker.ValidateKey(tt.key)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("ValidateKey(%q) = %v, want nil", tt.key, err)
				}
				return
			}
			if !errors.Is(err, locker.ErrInvalidKey) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ValidateKey(%.40q) = %v, want ErrInvalidKey saying %q", tt.key, err, tt.wantErr)
			}
		})
	}
}

func nopOpener(context.Context, *url.URL) (locker.Locker, error) { return nil, errors.New("nop") }

// registerDup registers the scheme that TestRegisterPanics registers again,
// once per process (tests may run more than once with -count).
var registerDup = sync.OnceFunc(func() { locker.Register("locker-test-dup", nopOpener) })

func TestRegisterPanics(t *testing.T) {
	registerDup()
	tests := []struct {
		name   string
		scheme string
		opener locker.Opener
		want   string
	}{
		{"NilOpener", "locker-test-nil", nil, "nil opener"},
		{"Empty", "", nopOpener, "empty scheme"},
		{"Duplicate", "locker-test-dup", nopOpener, "twice"},
		{"DuplicateOtherCase", "LOCKER-TEST-DUP", nopOpener, "twice"},
		{"DuplicateOfMemlock", "mem", nopOpener, "twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil {
					t.Fatal("Register did not panic")
				}
				if msg := fmt.Sprint(r); !strings.Contains(msg, tt.want) {
					t.Fatalf("panic %q, want it to say %q", msg, tt.want)
				}
			}()
			locker.Register(tt.scheme, tt.opener)
		})
	}
	for _, s := range []string{"", "locker-test-nil"} {
		for _, have := range locker.Schemes() {
			if have == s {
				t.Errorf("a panicking Register still registered %q", s)
			}
		}
	}
}

func TestOpenUnknownScheme(t *testing.T) {
	for _, u := range []string{"x://host", "X://host", "x:"} {
		_, err := locker.Open(t.Context(), u)
		if want := `locker: unknown scheme "x" (forgotten import?)`; err == nil || err.Error() != want {
			t.Errorf("Open(%q) = %v, want %q", u, err, want)
		}
		if !errors.Is(err, locker.ErrUnknownScheme) {
			t.Errorf("Open(%q) = %v, want it to wrap ErrUnknownScheme", u, err)
		}
	}
}

// A bare host:port is the commonest mistake with Open; it must say so rather
// than report an unknown scheme "localhost" or a parse error.
func TestOpenHostPortWithoutScheme(t *testing.T) {
	for _, u := range []string{"localhost:6379", "127.0.0.1:6379", "redis-host:6379/0", "[::1]:5432"} {
		_, err := locker.Open(t.Context(), u)
		if !errors.Is(err, locker.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, want an error wrapping ErrInvalidURL", u, err)
			continue
		}
		if !strings.Contains(err.Error(), "without a scheme") || !strings.Contains(err.Error(), "redis://") {
			t.Errorf("Open(%q) = %v, want it to say the scheme is missing and suggest redis://", u, err)
		}
	}
}

func TestOpenNeverEchoesPassword(t *testing.T) {
	const secret = "s3cret-pw"
	tests := []struct {
		url  string
		want error
	}{
		{"x://user:" + secret + "@host", locker.ErrUnknownScheme},
		{"mem://user:" + secret + "@store", locker.ErrInvalidURL},
		{"mem://user:" + secret + "@store?bogus=1", locker.ErrInvalidURL},
		{"mem://user:" + secret + "@[::1", locker.ErrInvalidURL},      // unparsable host
		{"mem://user:" + secret + "@host:port", locker.ErrInvalidURL}, // bad port
		{"://user:" + secret + "@host", locker.ErrInvalidURL},         // no scheme, unparsable
		{"//user:" + secret + "@host/db", locker.ErrInvalidURL},       // no scheme
		{"mem://user:" + secret + "%zz@store", locker.ErrInvalidURL},  // bad escape
		{"mem://user:" + secret + "/x@store", locker.ErrInvalidURL},   // unescaped '/' ends the host early
		{"mem://user:" + secret + "?x@store", locker.ErrInvalidURL},   // ... and '?'
		{"mem://user:" + secret + "#x@store", locker.ErrInvalidURL},   // ... and '#'
	}
	for _, tt := range tests {
		l, err := locker.Open(t.Context(), tt.url)
		if err == nil {
			l.Close()
			t.Errorf("Open(%q) succeeded", tt.url)
			continue
		}
		if !errors.Is(err, tt.want) {
			t.Errorf("Open(%q) = %v, want it to wrap %v", tt.url, err, tt.want)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q) error echoes the password: %v", tt.url, err)
		}
	}
}

func TestApplyOptions(t *testing.T) {
	tests := []struct {
		name    string
		opts    []locker.Option
		wantTTL time.Duration
		wantErr bool
	}{
		{"None", nil, 0, false},
		{"Nil", []locker.Option{nil}, 0, false},
		{"TTL", []locker.Option{locker.WithTTL(time.Second)}, time.Second, false},
		{"LastWins", []locker.Option{locker.WithTTL(time.Second), nil, locker.WithTTL(time.Minute)}, time.Minute, false},
		{"Smallest", []locker.Option{locker.WithTTL(locker.MinTTL)}, locker.MinTTL, false},
		{"Largest", []locker.Option{locker.WithTTL(locker.MaxTTL)}, locker.MaxTTL, false},
		{"BelowRange", []locker.Option{locker.WithTTL(locker.MinTTL - time.Nanosecond)}, 0, true},
		{"AboveRange", []locker.Option{locker.WithTTL(locker.MaxTTL + time.Nanosecond)}, 0, true},
		{"Zero", []locker.Option{locker.WithTTL(0)}, 0, true},
		{"Negative", []locker.Option{locker.WithTTL(-time.Second)}, 0, true},
		{"ErrorThenValid", []locker.Option{locker.WithTTL(-1), locker.WithTTL(time.Second)}, 0, true},
		{"ValidThenError", []locker.Option{locker.WithTTL(time.Second), locker.WithTTL(0)}, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := backend.ApplyOptions(tt.opts...)
			if tt.wantErr {
				if !errors.Is(err, locker.ErrInvalidOption) {
					t.Fatalf("err = %v, want ErrInvalidOption", err)
				}
				if o != (locker.Options{}) {
					t.Fatalf("options %+v returned with an error", o)
				}
				return
			}
			if err != nil || o.TTL != tt.wantTTL {
				t.Fatalf("ApplyOptions = %+v, %v; want TTL %v", o, err, tt.wantTTL)
			}
		})
	}
}

// newStoreLockers returns n Lockers on one fresh memlock store, closed when
// the test ends.
func newStoreLockers(t *testing.T, n int) []*memlock.Locker {
	s := memlock.NewStore()
	ls := make([]*memlock.Locker, n)
	for i := range ls {
		ls[i] = s.NewLocker()
		t.Cleanup(func() { _ = ls[i].Close() })
	}
	return ls
}

// mustBeFree checks that key can be taken at once, and frees it again.
func mustBeFree(t *testing.T, l locker.Locker, key string) {
	t.Helper()
	h, err := l.TryAcquire(t.Context(), key)
	if err != nil {
		t.Fatalf("%q not released: %v", key, err)
	}
	if err := h.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestDo(t *testing.T) {
	t.Run("ReturnsFnErrorAndReleases", func(t *testing.T) {
		ls := newStoreLockers(t, 2)
		errFn := errors.New("fn failed")
		err := locker.Do(t.Context(), ls[0], "k", func(ctx context.Context, _ locker.Handle) error {
			if _, err := ls[1].TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrNotAcquired) {
				t.Errorf("lock not held during fn: %v", err)
			}
			return errFn
		})
		if !errors.Is(err, errFn) {
			t.Fatalf("Do = %v, want fn's error", err)
		}
		mustBeFree(t, ls[1], "k")
	})

	t.Run("AcquireError", func(t *testing.T) {
		ls := newStoreLockers(t, 1)
		called := false
		err := locker.Do(t.Context(), ls[0], "", func(context.Context, locker.Handle) error { called = true; return nil })
		if !errors.Is(err, locker.ErrInvalidKey) || called {
			t.Fatalf("Do with an invalid key = %v (fn called: %v)", err, called)
		}
	})

	t.Run("CancelledWhileWaiting", func(t *testing.T) {
		ls := newStoreLockers(t, 2)
		h, err := ls[0].Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		defer h.Release(t.Context())
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
		defer cancel()
		err = locker.Do(ctx, ls[1], "k", func(context.Context, locker.Handle) error {
			t.Error("fn ran without the lock")
			return nil
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Do = %v, want DeadlineExceeded", err)
		}
	})

	// A real loss (lease expiry) needs a fault hook; the postgres and redis
	// backends test Do under one. Here the lock ends by Close of its Locker,
	// which fn must hear of the same way.
	t.Run("FnGetsHandleAndMayRelease", func(t *testing.T) {
		ls := newStoreLockers(t, 2)
		var token int64
		err := locker.Do(t.Context(), ls[0], "k", func(ctx context.Context, h locker.Handle) error {
			if h.Key() != "k" || h.Token() <= 0 || h.Err() != nil {
				t.Errorf("fn's handle: key %q token %d err %v", h.Key(), h.Token(), h.Err())
			}
			token = h.Token()
			return h.Release(ctx) // early, by fn itself: Do must not report its own second Release
		})
		if err != nil {
			t.Fatalf("Do = %v, want nil after fn released the lock itself", err)
		}
		mustBeFree(t, ls[1], "k")
		if token == 0 {
			t.Fatal("fn did not run")
		}
	})

	t.Run("EndCancelsFnContext", func(t *testing.T) {
		ls := newStoreLockers(t, 2)
		err := locker.Do(t.Context(), ls[0], "k", func(ctx context.Context, _ locker.Handle) error {
			if err := ls[0].Close(); err != nil {
				t.Error(err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("fn's context not cancelled after the lock ended")
			}
			if cause := context.Cause(ctx); !errors.Is(cause, locker.ErrClosed) {
				t.Errorf("context.Cause = %v, want ErrReleasedByClose", cause)
			}
			return nil
		})
		if !errors.Is(err, locker.ErrClosed) {
			t.Fatalf("Do = %v, want an error wrapping ErrClosed although fn returned nil", err)
		}
		mustBeFree(t, ls[1], "k")
	})

	t.Run("ParentCancelStopsFn", func(t *testing.T) {
		ls := newStoreLockers(t, 2)
		ctx, cancel := context.WithCancel(t.Context())
		err := locker.Do(ctx, ls[0], "k", func(ctx context.Context, _ locker.Handle) error {
			cancel()
			<-ctx.Done()
			return ctx.Err()
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Do = %v, want Canceled", err)
		}
		mustBeFree(t, ls[1], "k") // released with its own deadline despite ctx
	})

	t.Run("ReleasesAfterPanic", func(t *testing.T) {
		ls := newStoreLockers(t, 2)
		func() {
			defer func() {
				if r := recover(); r != "boom" {
					t.Fatalf("recovered %v, want the panic to propagate", r)
				}
			}()
			_ = locker.Do(t.Context(), ls[0], "k", func(context.Context, locker.Handle) error { panic("boom") })
		}()
		mustBeFree(t, ls[1], "k")
	})
}

func TestErrorFormatting(t *testing.T) {
	long := strings.Repeat("a", 127) + "é" + strings.Repeat("b", 100) // "é" straddles byte 128
	tests := []struct {
		name string
		err  *locker.Error
		want string
	}{
		{"Plain", &locker.Error{Op: "acquire", Key: "jobs/1", Err: locker.ErrNotAcquired}, `acquire "jobs/1": locker: not acquired`},
		{"QuotesKey", &locker.Error{Op: "release", Key: "a \"b\"\n", Err: locker.ErrReleased}, `release "a \"b\"\n": locker: lock released`},
		{"LongKeyCutAtRune", &locker.Error{Op: "renew", Key: long, Err: locker.ErrLost}, `renew "` + strings.Repeat("a", 127) + `…": locker: lock lost`},
		{"KeyAtLimit", &locker.Error{Op: "acquire", Key: strings.Repeat("k", 128), Err: context.Canceled}, `acquire "` + strings.Repeat("k", 128) + `": context canceled`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Fatalf("Error() = %s\nwant       %s", got, tt.want)
			}
			if !errors.Is(tt.err, tt.err.Err) {
				t.Fatal("does not unwrap to its cause")
			}
		})
	}

	if err := backend.KeyError("acquire", "k", nil); err != nil {
		t.Fatalf("KeyError with a nil cause = %v, want nil", err)
	}
	wrapped := fmt.Errorf("outer: %w", backend.KeyError("try-acquire", "k", locker.ErrNotAcquired))
	var e *locker.Error
	if !errors.As(wrapped, &e) || e.Op != "try-acquire" || e.Key != "k" || !errors.Is(wrapped, locker.ErrNotAcquired) {
		t.Fatalf("errors.As/Is through a wrapped KeyError: %#v", e)
	}
}

func TestWithOwner(t *testing.T) {
	ok := []string{"", "host=web-3 pid=4182 cmd=backup.sh --full", "ünïcode ✓", strings.Repeat("x", locker.MaxOwnerLen)}
	for _, s := range ok {
		o, err := backend.ApplyOptions(locker.WithOwner(s))
		if err != nil || o.Owner != s {
			t.Errorf("WithOwner(%q) = %+v, %v; want Owner %q", s, o, err, s)
		}
	}
	bad := map[string]string{
		strings.Repeat("x", locker.MaxOwnerLen+1): "257 bytes long",
		"a\nb":     "control character",
		"a\tb":     "control character",
		"\x00":     "control character",
		"a\u0085b": "control character", // NEL, a C1 control
		"\xff":     "not valid UTF-8",
	}
	for s, want := range bad {
		_, err := backend.ApplyOptions(locker.WithTTL(time.Second), locker.WithOwner(s))
		if !errors.Is(err, locker.ErrInvalidOption) || !strings.Contains(err.Error(), want) {
			t.Errorf("WithOwner(%q) = %v; want ErrInvalidOption saying %q", s, err, want)
		}
	}
}
