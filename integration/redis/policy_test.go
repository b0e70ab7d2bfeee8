package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
)

// evictingPolicies are the maxmemory-policy values of Redis 7 other than
// noeviction: each lets the server delete held locks (volatile-*: keys with
// an expiry), the allkeys-* ones also fence counters.
var evictingPolicies = []string{
	"volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl",
	"allkeys-lru", "allkeys-lfu", "allkeys-random",
}

// setPolicy sets the maxmemory-policy of the server admin talks to.
func setPolicy(t *testing.T, ctx context.Context, admin *goredis.Client, policy string) {
	t.Helper()
	if err := admin.ConfigSet(ctx, "maxmemory-policy", policy).Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory-policy %s: %v", policy, err)
	}
}

// mustRefuse checks that TryAcquire and Acquire on l refuse key because of
// the eviction policy: an error naming the key, wrapping
// redis.ErrEvictionPolicy, that names the policy and the remedy, and no lock
// left on the server.
func mustRefuse(t *testing.T, ctx context.Context, l *redis.Locker, admin *goredis.Client, key, policy string) {
	t.Helper()
	for _, call := range []struct {
		name string
		fn   func(context.Context, string, ...locker.Option) (locker.Handle, error)
	}{{"TryAcquire", l.TryAcquire}, {"Acquire", l.Acquire}} {
		h, err := call.fn(ctx, key)
		if err == nil {
			_ = h.Release(ctx)
			t.Errorf("policy %s: %s succeeded; a server that may evict locks must be refused", policy, call.name)
			continue
		}
		var le *locker.Error
		switch {
		case !errors.Is(err, redis.ErrEvictionPolicy):
			t.Errorf("policy %s: %s: %v, want an error wrapping redis.ErrEvictionPolicy", policy, call.name, err)
		case !errors.Is(err, locker.ErrUnsafeConfig):
			t.Errorf("policy %s: %s: %v, want an error wrapping locker.ErrUnsafeConfig", policy, call.name, err)
		case !errors.As(err, &le) || le.Key != key:
			t.Errorf("policy %s: %s: %v, want a *locker.Error naming the key", policy, call.name, err)
		case !strings.Contains(err.Error(), `"`+policy+`"`) || !strings.Contains(err.Error(), "noeviction"):
			t.Errorf("policy %s: %s: %q must name the policy and say to set noeviction", policy, call.name, err)
		case errors.Is(err, locker.ErrNotAcquired):
			t.Errorf("policy %s: %s: %v must not wrap ErrNotAcquired: nobody holds the key", policy, call.name, err)
		}
	}
	lock, _, _ := l.KeyNames(key)
	if n, err := admin.Exists(ctx, lock).Result(); err != nil || n != 0 {
		t.Errorf("policy %s: lock key after a refusal: EXISTS = %d, %v; want 0", policy, n, err)
	}
}

// TestEvictionPolicyRefused: on a server whose maxmemory-policy may evict
// keys, every Locker refuses to take locks, for each such policy; with
// noeviction it takes them; a Locker that refused takes locks as soon as the
// policy is fixed; WithAllowEviction (and allow_eviction=true in a URL)
// turns the check off.
func TestEvictionPolicyRefused(t *testing.T) {
	srv := testserver.NewRedis(t) // private: its configuration changes
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	key := uniqueKey(t)
	for _, policy := range evictingPolicies {
		setPolicy(t, ctx, admin, policy)
		l := newTestLocker(t, srv.Addr())
		mustRefuse(t, ctx, l, admin, key, policy)
		if policy == "allkeys-lru" {
			// Fixing the server is enough: a refusal is not remembered.
			setPolicy(t, ctx, admin, "noeviction")
			h, err := l.TryAcquire(ctx, key)
			if err != nil {
				t.Fatalf("TryAcquire by a Locker that was refused, after the policy became noeviction: %v", err)
			}
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	setPolicy(t, ctx, admin, "allkeys-lru")
	allowed := newTestLocker(t, srv.Addr(), redis.WithAllowEviction(true), redis.WithClockTokens(true))
	h, err := allowed.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire with WithAllowEviction under allkeys-lru: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	u := "redis://" + srv.Addr() + "/0?allow_eviction=true&clock_tokens=true"
	lu, err := locker.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer lu.Close()
	if h, err := lu.TryAcquire(ctx, key); err != nil {
		t.Errorf("TryAcquire through %s under allkeys-lru: %v", u, err)
	} else {
		_ = h.Release(ctx)
	}
	lr, err := locker.Open(ctx, "redis://"+srv.Addr()+"/0")
	if err != nil {
		t.Fatal(err)
	}
	defer lr.Close()
	if _, err := lr.TryAcquire(ctx, key); !errors.Is(err, redis.ErrEvictionPolicy) {
		t.Errorf("TryAcquire through a URL without allow_eviction under allkeys-lru: %v, want ErrEvictionPolicy", err)
	}

	setPolicy(t, ctx, admin, "noeviction")
	l := newTestLocker(t, srv.Addr())
	mustRelease(t, ctx, mustGet(t, ctx, l, key))
}

func mustRelease(t testing.TB, ctx context.Context, h locker.Handle) {
	t.Helper()
	if err := h.Release(ctx); err != nil {
		t.Fatalf("Release(%q): %v", h.Key(), err)
	}
}

// TestEvictionPolicyWithoutConfig: where CONFIG is not allowed (an ACL user
// without it, as on managed services) the Locker reads the policy from INFO
// memory and still refuses; where neither CONFIG nor INFO is allowed it
// cannot tell, and takes locks (as the package documentation says).
func TestEvictionPolicyWithoutConfig(t *testing.T) {
	srv := testserver.NewRedis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	setPolicy(t, ctx, admin, "volatile-lru")
	base := []string{"~*", "&*", "+evalsha", "+eval", "+get", "+set", "+incr", "+pttl", "+del", "+exists", "+pexpire", "+time",
		"+zadd", "+zrem", "+zrange", "+zrangebyscore", "+zscore", "+zrank", "+zremrangebyrank",
		"+publish", "+subscribe", "+unsubscribe", "+ping", "+hello", "+client"}
	for _, tc := range []struct {
		name   string
		extra  []string
		refuse bool
	}{
		{"info", []string{"+info"}, true},
		{"config", []string{"+config|get"}, true},
		{"neither", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user, pass := "locker-policy-"+tc.name, "pw-"+randomID()
			args := []any{"ACL", "SETUSER", user, "reset", "on", ">" + pass}
			for _, a := range append(base, tc.extra...) {
				args = append(args, a)
			}
			if err := admin.Do(ctx, args...).Err(); err != nil {
				t.Fatalf("ACL SETUSER: %v", err)
			}
			c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), Username: user, Password: pass, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			l := redis.New(c)
			t.Cleanup(func() { _ = l.Close() })
			key := uniqueKey(t)
			if tc.refuse {
				mustRefuse(t, ctx, l, admin, key, "volatile-lru")
				return
			}
			mustRelease(t, ctx, mustGet(t, ctx, l, key))
		})
	}
}

// TestEvictionPolicyRenamedConfig: with CONFIG renamed away (a common
// hardening, and what several managed services do), the policy comes from
// INFO memory.
func TestEvictionPolicyRenamedConfig(t *testing.T) {
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	_, port, _ := strings.Cut(addr, ":")
	startLocalRedis(t, addr, "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no", "--dir", dir,
		"--maxmemory-policy", "allkeys-lfu", "--rename-command", "CONFIG", "")
	ctx := testCtx(t)
	admin := testClient(t, addr, true)
	if err := admin.ConfigGet(ctx, "maxmemory-policy").Err(); err == nil {
		t.Fatal("CONFIG GET works on a server started with CONFIG renamed away")
	}
	mustRefuse(t, ctx, newTestLocker(t, addr), admin, uniqueKey(t), "allkeys-lfu")
}

// TestFullServerUnderNoeviction: what noeviction does instead of evicting.
// On a server past its maxmemory a held lock stays held (its holder keeps
// it, others get ErrNotAcquired), an acquire of a free key fails with the
// server's OOM error (not ErrNotAcquired: nobody holds it), and Release
// still works, since it frees memory.
func TestFullServerUnderNoeviction(t *testing.T) {
	srv := testserver.NewRedis(t)
	ctx := testCtx(t)
	admin := testClient(t, srv.Addr(), true)
	key := uniqueKey(t)
	holder := newTestLocker(t, srv.Addr())
	other := newTestLocker(t, srv.Addr())
	h := mustGet(t, ctx, holder, key, locker.WithTTL(5*time.Second))
	mustRelease(t, ctx, mustGet(t, ctx, other, key+"/other")) // other has checked the policy

	for i := range 200 {
		if err := admin.Set(ctx, fmt.Sprintf("filler/%d", i), strings.Repeat("x", 10_000), time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	info, err := admin.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	var used int64
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			_, _ = fmt.Sscan(v, &used)
		}
	}
	if used == 0 {
		t.Fatalf("no used_memory in INFO memory: %q", info)
	}
	t.Cleanup(func() { _ = admin.ConfigSet(context.Background(), "maxmemory", "0").Err() })
	if err := admin.ConfigSet(ctx, "maxmemory", fmt.Sprint(used/2)).Err(); err != nil {
		t.Fatal(err)
	}

	_, err = other.TryAcquire(ctx, uniqueKey(t))
	if err == nil || errors.Is(err, locker.ErrNotAcquired) || !strings.Contains(err.Error(), "OOM") {
		t.Errorf("TryAcquire of a free key on a full server: %v, want the server's OOM error", err)
	}
	if _, err := other.TryAcquire(ctx, key); !errors.Is(err, locker.ErrNotAcquired) {
		t.Errorf("TryAcquire of a held key on a full server: %v, want ErrNotAcquired", err)
	}
	time.Sleep(2 * time.Second) // the watchdog renews (PEXPIRE does not grow memory)
	if err := h.Err(); err != nil {
		t.Errorf("holder's Err() on a full server = %v, want nil", err)
	}
	mustRelease(t, ctx, h)
	lock, _, _ := holder.KeyNames(key)
	if n, err := admin.Exists(ctx, lock).Result(); err != nil || n != 0 {
		t.Errorf("lock key after Release on a full server: EXISTS = %d, %v; want 0", n, err)
	}
	// The release record too was written (the release script's SET comes
	// after its DEL, and Redis refuses a write only as a script's first).
	record := strings.TrimSuffix(lock, ":lock") + ":released-by:" + h.Owner()
	if n, err := admin.Exists(ctx, record).Result(); err != nil || n != 1 {
		t.Errorf("release record %s after Release on a full server: EXISTS = %d, %v; want 1", record, n, err)
	}
}

// TestEvictionPolicyClusterPerMaster: on Cluster each master is checked on
// its own: keys on a master that may evict are refused (the error names the
// master), keys on the others are taken.
func TestEvictionPolicyClusterPerMaster(t *testing.T) {
	c := clusterClient(t)
	ctx := testCtx(t)
	l := redis.New(c)
	t.Cleanup(func() { _ = l.Close() })
	bad := uniqueKey(t)
	lock, _, _ := l.KeyNames(bad)
	m, err := c.MasterForKey(ctx, lock)
	if err != nil {
		t.Fatal(err)
	}
	// A key on another master.
	var good string
	for i := 0; good == ""; i++ {
		k := fmt.Sprintf("%s/%d", bad, i)
		gl, _, _ := l.KeyNames(k)
		if o, err := c.MasterForKey(ctx, gl); err == nil && o.Options().Addr != m.Options().Addr {
			good = k
		}
	}
	// The shared cluster: put the policy back whatever happens.
	t.Cleanup(func() { _ = m.ConfigSet(context.Background(), "maxmemory-policy", "noeviction").Err() })
	setPolicy(t, ctx, m, "allkeys-lru")

	_, err = l.TryAcquire(ctx, bad)
	if !errors.Is(err, redis.ErrEvictionPolicy) || !strings.Contains(err.Error(), m.Options().Addr) {
		t.Errorf("TryAcquire of a key on a master under allkeys-lru: %v, want ErrEvictionPolicy naming %s", err, m.Options().Addr)
	}
	mustRelease(t, ctx, mustGet(t, ctx, l, good))
}
