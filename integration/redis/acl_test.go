package redis_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/redis"
)

// aclRule returns the least-privilege ACL rule that redis/doc.go documents
// ("ACL SETUSER app on >password ..."), for user, password and prefix, as
// the arguments of ACL SETUSER after the user name: the test runs what the
// documentation says, not a copy of it.
func aclRule(t testing.TB, password, prefix string) []any {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "redis", "doc.go"))
	if err != nil {
		t.Fatalf("reading redis/doc.go: %v", err)
	}
	var rule []string
	for _, line := range strings.Split(string(b), "\n") {
		if r, ok := strings.CutPrefix(line, "//\tACL SETUSER app "); ok {
			if rule != nil {
				t.Fatal("redis/doc.go documents more than one ACL SETUSER rule")
			}
			rule = strings.Fields(r)
		}
	}
	if rule == nil {
		t.Fatal("redis/doc.go documents no rule (a line \"//\\tACL SETUSER app ...\")")
	}
	args := make([]any, len(rule))
	for i, f := range rule {
		switch f {
		case ">password":
			f = ">" + password
		case "~app:*":
			f = "~" + prefix + "*"
		case "&app:*":
			f = "&" + prefix + "*"
		default:
			if strings.Contains(f, "app:") || strings.Contains(f, "password") {
				t.Fatalf("rule word %q: the test does not know how to substitute it", f)
			}
		}
		args[i] = f
	}
	return args
}

// envLPUserMade tells the child processes of the Process cases that the
// parent test made the user already (and removes it at its end; a child
// must not).
const envLPUserMade = "LOCKER_TEST_REDIS_LP_USER_MADE"

// setUser makes (or remakes) user with the documented rule, changed by
// edit (nil: as documented), and removes it at the end of the test.
func setUser(t testing.TB, admin *goredis.Client, user, password, prefix string, edit func([]any) []any) {
	t.Helper()
	if os.Getenv(envLPUserMade) == user {
		return
	}
	rule := aclRule(t, password, prefix)
	if edit != nil {
		rule = edit(rule)
	}
	ctx := context.Background()
	if err := admin.Do(ctx, append([]any{"ACL", "SETUSER", user, "reset"}, rule...)...).Err(); err != nil {
		t.Fatalf("ACL SETUSER %s %v: %v", user, rule[1:], err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), "ACL", "DELUSER", user) })
}

func aclClient(t testing.TB, addr, user, password string) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: addr, Username: user, Password: password,
		ContextTimeoutEnabled: true, DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// The least-privilege user of the tests; fixed names, so that the child
// processes of the Process cases (the test binary run again) make the same.
const (
	lpUser     = "locker-least-privilege"
	lpPassword = "pw-Rd5-least-privilege"
	lpPrefix   = "lp-app:"
)

// TestACLLeastPrivilegeConformance runs the conformance suite as a user
// with exactly the ACL rule redis/doc.go documents.
func TestACLLeastPrivilegeConformance(t *testing.T) {
	srv := testserver.Redis(t)
	admin := testClient(t, srv.Addr(), true)
	setUser(t, admin, lpUser, lpPassword, lpPrefix, nil)
	t.Setenv(envLPUserMade, lpUser)
	namer := redis.New(admin, redis.WithPrefix(lpPrefix))
	var proxies testserver.Registry[*testserver.Proxy]
	conformance.Run(t, conformance.Harness{
		Only:             testserver.SecurityCases, // all with LOCKER_CONFORMANCE_FULL=1
		IgnoreGoroutines: testserver.ProxyGoroutines,
		NewLocker: func(t *testing.T) locker.Locker {
			px := testserver.NewProxy(t, srv.Addr())
			l := redis.New(aclClient(t, px.Addr(), lpUser, lpPassword), redis.WithPrefix(lpPrefix))
			t.Cleanup(func() { _ = l.Close() })
			proxies.Put(l, px)
			return l
		},
		Crash: func(t *testing.T, l locker.Locker) { proxies.Get(t, l, "Crash").Crash(t) },
		Reset: func(t *testing.T, l locker.Locker) { proxies.Get(t, l, "Reset").ResetAll(t) },
		Cut: func(t *testing.T, l locker.Locker) func() {
			px := proxies.Get(t, l, "Cut")
			px.Blackhole(t)
			return func() { px.Heal(t) }
		},
		Steal: func(t *testing.T, h locker.Handle) {
			lock, _, _ := namer.KeyNames(h.Key())
			if err := admin.Del(context.Background(), lock).Err(); err != nil {
				t.Fatalf("Steal: DEL %s: %v", lock, err)
			}
		},
		URL: (&url.URL{Scheme: "redis", User: url.UserPassword(lpUser, lpPassword), Host: srv.Addr(), Path: "/0",
			RawQuery: url.Values{"prefix": {lpPrefix}}.Encode()}).String(),
		TTL:            2 * time.Second,
		NoInspectLease: "a Redis lock key keeps its remaining expiry (PTTL), not the lease it was set with",
	})
}

// TestACLMissingRight: a user whose rule lacks one right the Locker needs
// gets the server's NOPERM error, naming the command, at the first call
// (not ErrNotAcquired, not a hang); and the documented rule without its
// key pattern for the prefix, the same for the keys.
func TestACLMissingRight(t *testing.T) {
	srv := testserver.Redis(t)
	admin := testClient(t, srv.Addr(), true)
	// want is what the error must say: Redis names the command refused
	// outside a script, and only the script's line inside one, where the
	// Locker's hint points to the rule. A right used only for waiting
	// (ZADD: the queue) is refused at the first Acquire that waits.
	for _, c := range []struct {
		drop, want string
		waits      bool
	}{
		{"+evalsha", "'evalsha' command", false},
		{"+set", "can't run this command", false},
		{"+zadd", "can't run this command", true},
		{"~app:*", "no permissions to access one of the keys", false},
	} {
		t.Run(strings.TrimLeft(c.drop, "+~"), func(t *testing.T) {
			user := "locker-missing-" + strings.Trim(c.drop, "+~:*")
			password := "pw-Rd7-" + user
			prefix := "missing-" + strings.Trim(c.drop, "+~:*") + ":"
			drop := c.drop
			if drop == "~app:*" {
				drop = "~" + prefix + "*"
			}
			setUser(t, admin, user, password, prefix, func(r []any) []any {
				return slices.DeleteFunc(r, func(a any) bool { return a == drop })
			})
			l := redis.New(aclClient(t, srv.Addr(), user, password), redis.WithPrefix(prefix))
			defer l.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			call := l.TryAcquire
			if c.waits {
				holder := redis.New(admin, redis.WithPrefix(prefix))
				defer holder.Close()
				h, err := holder.Acquire(ctx, "acl/missing")
				if err != nil {
					t.Fatal(err)
				}
				defer h.Release(context.Background())
				call = l.Acquire
			}
			h, err := call(ctx, "acl/missing")
			if err == nil {
				_ = h.Release(ctx)
				t.Fatalf("acquire without %s succeeded", c.drop)
			}
			if errors.Is(err, locker.ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) ||
				!strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "Least privilege") {
				t.Fatalf("acquire without %s: %v, want the server's refusal (%q) at once, with the hint to the documented rule", c.drop, err, c.want)
			}
			if strings.Contains(err.Error(), password) {
				t.Errorf("the error shows the password: %v", err)
			}
			t.Logf("without %s: %v", c.drop, err)
		})
	}
}
