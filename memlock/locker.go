package memlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// errUnreachable is what a Locker cut off from its Store (by the test hook
// cut) gets from every call that needs the store.
var errUnreachable = errors.New("memlock: store unreachable (connection cut)")

// Option configures a Locker. WithDefaultTTL is the name every backend
// gives this setting (see backend.Settings).
type Option func(*config) error

// config is the shared settings (backend.Settings: memlock honours the
// default TTL and the token base) and every invalid option.
type config struct {
	backend.Settings
	err error
}

// WithDefaultTTL sets the lease used when a call has no locker.WithTTL
// (default locker.DefaultTTL; URL parameter ttl). It must be within [locker.MinTTL,
// locker.MaxTTL], like every TTL. NewLocker returns no error, so a bad value is
// reported by every Acquire and TryAcquire of the Locker instead, with an
// error wrapping locker.ErrInvalidOption.
func WithDefaultTTL(ttl time.Duration) Option {
	return func(c *config) error {
		if err := checkTTL(ttl); err != nil {
			return fmt.Errorf("memlock: WithDefaultTTL: %w", err)
		}
		c.TTL = ttl
		return nil
	}
}

// WithTokenBase adds n to every token the Locker hands out (URL parameter
// token_base): Handle.Token and LockInfo.Token are n plus the Store's
// token. n must be within [0, locker.MaxTokenBase]; give every Locker of a
// deployment the same n (see locker.MaxTokenBase and README's "Changing
// backends"). NewLocker returns no error, so a bad value is reported by
// every Acquire and TryAcquire of the Locker instead.
func WithTokenBase(n int64) Option {
	return func(c *config) error {
		if err := backend.SetTokenBase(n)(&c.Settings); err != nil {
			return fmt.Errorf("memlock: %w", err)
		}
		return nil
	}
}

// WithLogger sets where the Locker logs its events (no URL form): a
// renewal that failed (only while cut off by a test hook), the lock at
// risk and cleared, a loss found at renewal. Nil, the default, logs
// nothing.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { return backend.SetLogger(l)(&c.Settings) }
}

// log is the Locker's logger (WithLogger).
func (l *Locker) log() backend.Log { return backend.Log{L: l.cfg.Logger} }

func checkTTL(ttl time.Duration) error { return backend.CheckTTL("memlock", ttl) }

// Locker is one client of a Store: what a process is to a lock server. It is
// safe for concurrent use. Its locks are kept alive by a watchdog goroutine
// that Close stops.
//
// Its lifecycle (admission of calls, their contexts tied to Close, the
// handles Close releases, the watchdog Close waits for) is a backend.Life:
// what follows is only what is memlock's own.
type Locker struct {
	store *Store
	cfg   config
	life  *backend.Life[*handle]

	// mu guards the client state below. Lock order: Locker.mu, then
	// Store.mu (the client calls the server, never the reverse).
	mu      sync.Mutex
	crashed bool                 // by the test hook crash
	isCut   bool                 // by the test hook cut, until healed
	waiters map[*waiter]struct{} // this Locker's blocked Acquires
	held    renewQueue           // this Locker's handles, by next renewal
	alarm   time.Time            // when the watchdog's timer fires; zero when unarmed

	wake chan struct{} // tells the watchdog to rearm for an earlier renewal
}

var _ locker.Locker = (*Locker)(nil)

// NewLocker returns a new client of s. It starts the Locker's watchdog
// goroutine, which runs until Close: always Close a Locker.
func (s *Store) NewLocker(opts ...Option) *Locker {
	cfg := config{Settings: backend.Settings{TTL: locker.DefaultTTL}}
	cfg.err = backend.Apply(&cfg, opts)
	l := &Locker{
		store:   s,
		cfg:     cfg,
		life:    backend.NewLife[*handle](cfg.err),
		waiters: make(map[*waiter]struct{}),
		wake:    make(chan struct{}, 1),
	}
	l.life.Go(l.watchdog)
	return l
}

var defaultStore = NewStore()

// New returns a new client of the process-wide default Store, the one that the
// URL mem:// opens.
func New(opts ...Option) *Locker { return defaultStore.NewLocker(opts...) }

// Acquire waits until key is held, ctx is done, or the Locker is closed.
// Callers waiting for one key get it in the order they started waiting, the
// moment it is released or its lease expires.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.acquire(ctx, "acquire", key, mutexMode, true, opts)
}

// TryAcquire takes key if it is free and fails with an error wrapping
// locker.ErrNotAcquired if it is held, without waiting.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	return l.acquire(ctx, "try-acquire", key, mutexMode, false, opts)
}

func (l *Locker) acquire(ctx context.Context, op, key string, m mode, wait bool, opts []locker.Option) (locker.Handle, error) {
	// Enter checks the key, the Locker's options, Close and ctx, and gives
	// a ctx that also ends when Close begins.
	ctx, done, err := l.life.Enter(ctx, op, key)
	if err != nil {
		return nil, err
	}
	defer done()
	ttl, owner, err := l.options(opts)
	if err != nil {
		return nil, backend.KeyError(op, key, err)
	}

	l.mu.Lock()
	if l.isCut {
		l.mu.Unlock()
		return nil, backend.KeyError(op, key, errUnreachable)
	}
	g, w, err := l.store.acquire(key, m, ttl, owner, wait)
	if err != nil {
		l.mu.Unlock()
		return nil, backend.KeyError(op, key, err)
	}
	if g != nil {
		h, err := l.holdLocked(g)
		l.mu.Unlock()
		if err != nil {
			return nil, backend.KeyError(op, key, err)
		}
		return h, nil
	}
	// Queued: remember the waiter so that Close, crash and cut can end it.
	l.waiters[w] = struct{}{}
	l.mu.Unlock()

	h, err := l.await(ctx, w)
	if err != nil {
		return nil, backend.KeyError(op, key, err)
	}
	return h, nil
}

// await waits for the store's answer to w, or for ctx (which Close ends)
// to end, and returns the key's new handle.
func (l *Locker) await(ctx context.Context, w *waiter) (*handle, error) {
	var r reply
	select {
	case r = <-w.ready:
	case <-ctx.Done():
		why := l.life.Why(ctx, nil)
		l.store.cancelWait(w, why)
		if r = <-w.ready; r.g != nil {
			// The key was handed to us as ctx ended: give it straight back,
			// so that the abandoned wait leaves nothing behind.
			l.store.release(r.g, locker.ErrReleased)
			r = reply{err: why}
		}
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.waiters, w)
	if r.err != nil {
		return nil, r.err
	}
	return l.holdLocked(r.g)
}

// options returns the lease and the owner description a call asks for.
func (l *Locker) options(opts []locker.Option) (time.Duration, string, error) {
	o, err := backend.ApplyOptions(opts...)
	if err != nil {
		return 0, "", err
	}
	if o.TTL == 0 {
		return l.cfg.TTL, o.Owner, nil
	}
	return o.TTL, o.Owner, nil // locker.WithTTL checked it
}

// Close releases every lock the Locker holds, so that waiters elsewhere get
// them at once, ends its blocked Acquires with an error wrapping
// locker.ErrClosed, and stops its watchdog. The handles it held end with
// locker.ErrReleasedByClose, which wraps both locker.ErrReleased and
// locker.ErrClosed. Close is idempotent.
//
// Close is bounded: releasing never blocks here, and Close then waits at
// most backend.CloseGrace for calls and the watchdog to end (they end at
// once); nothing of the Locker outlives it.
//
// A Locker cut off from its store cannot release: its locks stay until their
// leases run out, and Close says so in its error.
func (l *Locker) Close() error {
	return l.life.Close(backend.Closer[*handle]{Release: l.releaseAll})
}

// releaseAll is Close's release of the locks held when it began; the
// blocked Acquires have given up already (Life ended their contexts), and a
// grant that reaches one of them now is given back, as Life.Hold refuses it.
func (l *Locker) releaseAll(held []*handle) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Waiters first, so that the releases below cannot hand a key to one
	// of our own waiters.
	l.endWaitersLocked(locker.ErrClosed)
	// Released by Close; or, when cut off, given up in our own view while
	// the store keeps the lease until it runs out: then the handle says
	// lost, and Close returns an error.
	unreleased := fmt.Errorf("%w: %w: the backend could not be reached to release it", locker.ErrLost, locker.ErrClosed)
	left := 0 // locks a cut-off Locker leaves in the store
	for _, h := range held {
		l.forgetLocked(h)
		if !l.isCut {
			l.store.release(h.g, locker.ErrReleasedByClose)
		} else if h.g.state.End(unreleased) {
			left++
		}
	}
	if left > 0 {
		return fmt.Errorf("memlock: close: %w: %d lock(s) left to expire", errUnreachable, left)
	}
	return nil
}

// endWaitersLocked ends every blocked Acquire of l with err.
func (l *Locker) endWaitersLocked(err error) {
	for w := range l.waiters {
		// If the key was granted to w already, cancelWait does nothing: its
		// Acquire gets the grant and, refused by Life.Hold after Close, gives
		// it back (or, after cut, keeps it: the answer arrived just before
		// the cut).
		l.store.cancelWait(w, err)
		delete(l.waiters, w)
	}
}

// Err returns the error of an invalid option given to NewLocker or New
// (wrapping locker.ErrInvalidOption), which every Acquire and TryAcquire
// also returns, or nil: a way to fail at start-up rather than at the first
// lock.
func (l *Locker) Err() error { return l.cfg.err }
