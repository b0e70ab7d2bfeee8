package locker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Multi is a set of locks taken together by AcquireAll or TryAcquireAll: all
// of its keys are held, or it has ended. Its Done closes as soon as any of
// its locks ends, released or lost; Release releases them all.
type Multi struct {
	handles []Handle // in the order the keys were taken: sorted
	done    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	err     error // why the Multi ended: the first lock's end, or ErrReleased
	watch   sync.WaitGroup
}

// AcquireAll takes the lock of every key in keys on l, all or nothing: it
// returns a Multi holding them all, or an error having released what it took.
// It waits as Acquire does, until every key is held or ctx is done.
//
// The keys are taken one at a time in one order, ascending byte order,
// whatever order the caller names them in: two callers that need the same
// keys wait for each other but never deadlock. (A caller that already holds
// one of the keys through l, outside the Multi, waits for itself: locks are
// not reentrant.) A key named twice, or no key at all, is refused with an
// error wrapping ErrInvalidKey. opts apply to every lock.
//
// l may be a family's view: AcquireAll(ctx, ReadLock(l), keys) takes the read
// locks of keys, AcquireAll(ctx, Semaphore(l, 3), keys) a permit of each.
func AcquireAll(ctx context.Context, l Locker, keys []string, opts ...Option) (*Multi, error) {
	return acquireAll(ctx, l, keys, true, opts)
}

// TryAcquireAll is AcquireAll with one attempt per key: when another holder
// has any of the keys it returns an error wrapping ErrNotAcquired (naming
// that key), having released the keys it took before it.
func TryAcquireAll(ctx context.Context, l Locker, keys []string, opts ...Option) (*Multi, error) {
	return acquireAll(ctx, l, keys, false, opts)
}

func acquireAll(ctx context.Context, l Locker, keys []string, wait bool, opts []Option) (*Multi, error) {
	op := "try-acquire-all"
	if wait {
		op = "acquire-all"
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	if len(sorted) == 0 {
		return nil, &Error{Op: op, Err: fmt.Errorf("%w: no keys", ErrInvalidKey)}
	}
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return nil, &Error{Op: op, Key: sorted[i], Err: fmt.Errorf("%w: key named twice", ErrInvalidKey)}
		}
	}
	for _, k := range sorted {
		if err := ValidateKey(k); err != nil {
			return nil, &Error{Op: op, Key: k, Err: err}
		}
	}
	m := &Multi{handles: make([]Handle, 0, len(sorted)), done: make(chan struct{})}
	for _, k := range sorted {
		var h Handle
		var err error
		if wait {
			h, err = l.Acquire(ctx, k, opts...)
		} else {
			h, err = l.TryAcquire(ctx, k, opts...)
		}
		if err != nil {
			if rerr := m.giveBack(ctx); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return nil, err
		}
		m.handles = append(m.handles, h)
	}
	for _, h := range m.handles {
		m.watch.Add(1)
		go m.watchOne(h)
	}
	return m, nil
}

// DoAll is Do over a set of keys: it takes them all with AcquireAll, runs
// fn while holding them, and releases them afterwards whatever fn returns.
// The context passed to fn is cancelled as soon as any of the locks ends
// (context.Cause is the Multi's Err); fn reads each key's token from m.
func DoAll(ctx context.Context, l Locker, keys []string, fn func(ctx context.Context, m *Multi) error, opts ...Option) error {
	m, err := AcquireAll(ctx, l, keys, opts...)
	if err != nil {
		return err
	}
	return hold(ctx, m, fn)
}

// TryDoAll is DoAll with TryAcquireAll: when another holder has any of the
// keys it returns an error wrapping ErrNotAcquired without calling fn.
func TryDoAll(ctx context.Context, l Locker, keys []string, fn func(ctx context.Context, m *Multi) error, opts ...Option) error {
	m, err := TryAcquireAll(ctx, l, keys, opts...)
	if err != nil {
		return err
	}
	return hold(ctx, m, fn)
}

// giveBack releases the locks taken so far by an AcquireAll that failed,
// each with a bounded Release of its own (ctx may be what ended the wait).
func (m *Multi) giveBack(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ReleaseTimeout)
	defer cancel()
	var errs []error
	for i := len(m.handles) - 1; i >= 0; i-- {
		if err := m.handles[i].Release(rctx); err != nil && !errors.Is(err, ErrLost) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// watchOne ends the Multi when h's lock ends, or returns once the Multi
// has ended.
func (m *Multi) watchOne(h Handle) {
	defer m.watch.Done()
	select {
	case <-h.Done():
		m.end(h.Err())
	case <-m.done:
	}
}

// end ends the Multi with err, the first time only.
func (m *Multi) end(err error) {
	m.once.Do(func() {
		m.mu.Lock()
		m.err = err
		m.mu.Unlock()
		close(m.done)
	})
}

// Keys returns the keys held, in ascending byte order.
func (m *Multi) Keys() []string {
	keys := make([]string, len(m.handles))
	for i, h := range m.handles {
		keys[i] = h.Key()
	}
	return keys
}

// Handles returns the Handle of each lock, in the order of Keys: each
// with its own key and fencing token, to send with the writes to the
// resource that key protects.
func (m *Multi) Handles() []Handle { return slices.Clone(m.handles) }

// Token returns the fencing token of key's lock, or 0 if key is not one of
// the Multi's keys.
func (m *Multi) Token(key string) int64 {
	for _, h := range m.handles {
		if h.Key() == key {
			return h.Token()
		}
	}
	return 0
}

// Done is closed as soon as any of the Multi's locks ends: when it is
// released, or when one of them is lost.
func (m *Multi) Done() <-chan struct{} { return m.done }

// Err is nil while every lock is held. Then it is the error of the first
// lock that ended (wrapping ErrLost, and naming its key, when it was lost),
// or ErrReleased after Release.
func (m *Multi) Err() error {
	select {
	case <-m.done:
	default:
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Release releases every lock of the Multi, in the reverse of the order
// they were taken, and reports the errors of those it could not release
// (joined): a lock that was lost reports an error wrapping ErrLost, as its
// Handle's Release does. Every lock is released whatever the others do. A
// second Release returns an error wrapping ErrReleased.
func (m *Multi) Release(ctx context.Context) error {
	first := false
	m.once.Do(func() {
		first = true
		m.mu.Lock()
		m.err = ErrReleased
		m.mu.Unlock()
		close(m.done)
	})
	if !first {
		m.mu.Lock()
		err := m.err
		m.mu.Unlock()
		if errors.Is(err, ErrReleased) {
			return err
		}
		// A lock ended first (lost, or released through its Handle): the
		// others are still held and must be released now.
		m.mu.Lock()
		m.err = errors.Join(err, ErrReleased)
		m.mu.Unlock()
	}
	m.watch.Wait()
	var errs []error
	for i := len(m.handles) - 1; i >= 0; i-- {
		if err := m.handles[i].Release(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
