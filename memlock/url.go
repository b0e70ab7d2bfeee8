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
// keyspace). The only query parameter is ttl, the default lease
// (WithDefaultTTL): mem://jobs?ttl=10s.
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
	var opts []Option
	if q.Has("ttl") {
		ttl := DefaultTTL
		q.Duration("ttl", &ttl)
		if err := q.Err(); err == nil {
			if err := checkTTL(ttl); err != nil {
				return nil, fmt.Errorf("%w: mem: parameter \"ttl\": %w", locker.ErrInvalidURL, err)
			}
		}
		opts = append(opts, WithDefaultTTL(ttl))
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
