package memlock

import (
	"context"
	"fmt"
	"net/url"
	"sync"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

func init() {
	locker.Register("mem", openURL)
}

var (
	namedMu     sync.Mutex
	namedStores = map[string]*Store{}
)

// namedStore returns the process-wide Store called name, making it on first
// use. Named stores live as long as the process.
func namedStore(name string) *Store {
	namedMu.Lock()
	defer namedMu.Unlock()
	s := namedStores[name]
	if s == nil {
		s = NewStore()
		namedStores[name] = s
	}
	return s
}

// openURL opens mem:// (the default Store, as New uses) or mem://NAME (the
// process-wide Store called NAME; the same name always means the same
// keyspace). The query parameters are the shared ones (backend.Settings):
// ttl, the default lease (WithDefaultTTL): mem://jobs?ttl=10s; token_base
// (WithTokenBase); and drift_margin, retry_interval and ddl, which change
// nothing here.
func openURL(_ context.Context, u *url.URL) (locker.Locker, error) {
	switch {
	case u.Opaque != "":
		return nil, fmt.Errorf("%w: mem: want mem:// or mem://NAME, got an opaque URL", locker.ErrInvalidURL)
	case u.User != nil:
		return nil, fmt.Errorf("%w: mem: user information is not allowed", locker.ErrInvalidURL)
	case u.Port() != "":
		return nil, fmt.Errorf("%w: mem: a store name has no port", locker.ErrInvalidURL)
	case u.Path != "" && u.Path != "/":
		return nil, fmt.Errorf("%w: mem: want mem:// or mem://NAME, got path %q", locker.ErrInvalidURL, u.Path)
	case u.Fragment != "":
		return nil, fmt.Errorf("%w: mem: a fragment is not allowed", locker.ErrInvalidURL)
	}
	q, err := backend.ParseQuery(u)
	if err != nil {
		return nil, err
	}
	// The shared parameters (backend.Settings): ttl sets WithDefaultTTL;
	// drift_margin, retry_interval and ddl are checked and change nothing
	// (one process: no clocks to drift apart, waiters woken directly, no
	// schema); a prefix and watchdog=false are refused.
	var opts []Option
	for _, set := range q.Shared(map[string]string{
		backend.ParamPrefix:   "the store name (mem://NAME) is the keyspace",
		backend.ParamWatchdog: "memlock always renews its locks",
	}) {
		var s backend.Settings
		if err := set(&s); err != nil {
			return nil, fmt.Errorf("%w: mem: %w", locker.ErrInvalidURL, err)
		}
		if s.TTL != 0 {
			if err := checkTTL(s.TTL); err != nil {
				return nil, fmt.Errorf("%w: mem: parameter \"ttl\": %w", locker.ErrInvalidURL, err)
			}
			opts = append(opts, WithDefaultTTL(s.TTL))
		}
		if s.TokenBase != 0 {
			opts = append(opts, WithTokenBase(s.TokenBase))
		}
	}
	if err := q.Finish(); err != nil {
		return nil, err
	}
	store := defaultStore
	if name := u.Hostname(); name != "" {
		store = namedStore(name)
	}
	return store.NewLocker(opts...), nil
}
