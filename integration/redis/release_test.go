package redis_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
)

// replayReleases is a go-redis hook that sends every release request twice
// and keeps the second reply, as go-redis does when the reply to the first
// was lost (a connection reset, a read timeout) after the server had run it.
type replayReleases struct{ replayed atomic.Int32 }

func (r *replayReleases) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (r *replayReleases) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func (r *replayReleases) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if !isRelease(cmd) {
			return next(ctx, cmd)
		}
		if err := next(ctx, cmd); err != nil {
			return err // not run (NOSCRIPT, a failed connection): nothing to replay
		}
		r.replayed.Add(1)
		return next(ctx, cmd)
	}
}

// isRelease reports whether cmd runs the release script, which names the
// key's record prefix (":released-by:"; see package releases).
func isRelease(cmd goredis.Cmder) bool {
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && strings.HasSuffix(s, ":released-by:") {
			return true
		}
	}
	return false
}

// TestReleaseRetriedByClient: a release that the client sends again after
// losing the first reply (the first attempt released the lock) reports
// success, not a lost lock; and it still never touches a lock someone else
// has taken since.
func TestReleaseRetriedByClient(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	c := testClient(t, srv.Addr(), true)
	replay := &replayReleases{}
	c.AddHook(replay)
	l := redis.New(c)
	t.Cleanup(func() { _ = l.Close() })
	other := newTestLocker(t, srv.Addr())
	key := uniqueKey(t)

	h := mustGet(t, ctx, l, key)
	if err := h.Release(ctx); err != nil {
		t.Errorf("Release whose request the client sent twice: %v, want nil (the first attempt released the lock)", err)
	}
	if replay.replayed.Load() == 0 {
		t.Fatal("the hook replayed no release request")
	}
	if err := h.Err(); !errors.Is(err, locker.ErrReleased) || errors.Is(err, locker.ErrLost) {
		t.Errorf("Err() after a replayed release = %v, want ErrReleased", err)
	}

	// The record names the releasing owner only: a robbed holder's release
	// (its lock deleted on the server, another holder in) still reports the
	// loss and leaves the new holder alone, replayed or not.
	robbed := mustGet(t, ctx, l, key)
	lock, _, _ := l.KeyNames(key)
	if err := c.Del(ctx, lock).Err(); err != nil {
		t.Fatal(err)
	}
	next := mustGet(t, ctx, other, key)
	if err := robbed.Release(ctx); !errors.Is(err, locker.ErrLost) {
		t.Errorf("replayed Release by a robbed holder: %v, want ErrLost", err)
	}
	if _, err := l.TryAcquire(ctx, key); !errors.Is(err, locker.ErrNotAcquired) {
		t.Errorf("TryAcquire after the robbed holder's Release: %v, want ErrNotAcquired (the new holder keeps the key)", err)
	}
	mustRelease(t, ctx, next)
}

// TestFenceExpiry: with WithFenceExpiry the fence counter carries the idle
// expiry after each acquisition, and once it is gone (expired) tokens keep
// increasing, from the clock floor.
func TestFenceExpiry(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	idle := redis.MinFenceExpiry
	l := newTestLocker(t, srv.Addr(), redis.WithClockTokens(true), redis.WithFenceExpiry(idle))
	key := uniqueKey(t)
	_, fence, _ := l.KeyNames(key)

	h := mustGet(t, ctx, l, key)
	pttl, err := admin.PTTL(ctx, fence).Result()
	if err != nil {
		t.Fatal(err)
	}
	if pttl <= 0 || pttl > idle {
		t.Errorf("fence counter's expiry after an acquisition = %v, want in (0, %v]", pttl, idle)
	}
	mustRelease(t, ctx, h)
	last := h.Token()
	for range 2 {
		// As if the key had been idle for longer than the expiry.
		if err := admin.Del(ctx, fence).Err(); err != nil {
			t.Fatal(err)
		}
		h := mustGet(t, ctx, l, key)
		if h.Token() <= last {
			t.Errorf("token %d after the fence counter expired is not above the previous %d", h.Token(), last)
		}
		last = h.Token()
		mustRelease(t, ctx, h)
	}
	// Without it the counter never expires.
	plain := newTestLocker(t, srv.Addr(), redis.WithClockTokens(true))
	key2 := uniqueKey(t)
	mustRelease(t, ctx, mustGet(t, ctx, plain, key2))
	_, fence2, _ := plain.KeyNames(key2)
	if pttl := admin.PTTL(ctx, fence2).Val(); pttl != -1 {
		t.Errorf("fence counter's expiry without WithFenceExpiry = %v, want none (-1)", pttl)
	}
}

// TestScriptsFlushed: a server that has lost the Locker's scripts
// (restarted, or SCRIPT FLUSH) is sent them again (EVAL after the EVALSHA
// it refused with NOSCRIPT), by the acquire and by the release alike, on
// the Locker's own command path (see evalsha in package redis).
func TestScriptsFlushed(t *testing.T) {
	srv := testserver.Redis(t)
	ctx := testCtx(t)
	c := testClient(t, srv.Addr(), true)
	l := redis.New(c)
	t.Cleanup(func() { _ = l.Close() })
	key := "flushed/" + t.Name()
	for round := range 3 {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		h, err := l.Acquire(ctx, key)
		if err != nil {
			t.Fatalf("round %d: Acquire after SCRIPT FLUSH: %v", round, err)
		}
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := h.Release(ctx); err != nil {
			t.Fatalf("round %d: Release after SCRIPT FLUSH: %v", round, err)
		}
		lock, _, _ := l.KeyNames(key)
		if n, err := c.Exists(ctx, lock).Result(); err != nil || n != 0 {
			t.Fatalf("round %d: the lock key %s is still there after Release (%d, %v)", round, lock, n, err)
		}
	}
}
